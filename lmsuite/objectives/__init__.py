"""The jax side of each pretraining objective: which model inputs to feed, and the loss.

An `Objective` sees the model's output dict and the batch dict, never a model class. Its loss is
a sum of named terms, each `loss_sum / denominator`; the denominators depend on the batch alone,
so a step can compute them over the whole global batch first and then accumulate microbatch
gradients that add up exactly to the big batch's gradient.
"""

from lmsuite.objectives import seq2seq  # noqa: I001  (the module; its factory is seq2seq.seq2seq)
from lmsuite.objectives.base import Carry, Objective, TermSums
from lmsuite.objectives.causal_lm import causal_lm, prefix_lm
from lmsuite.objectives.classification import classification
from lmsuite.objectives.mlm import mlm
from lmsuite.objectives.plm import permutation_lm
from lmsuite.objectives.rtd import rtd
from lmsuite.objectives.spanbert import span_boundary

FACTORIES = {
    "mlm": mlm,
    "causal_lm": causal_lm,
    "prefix_lm": prefix_lm,
    "classification": classification,
    "rtd": rtd,
    "permutation_lm": permutation_lm,
    "seq2seq": seq2seq.seq2seq,
    "span_boundary": span_boundary,
}


def make_objective(*, name: str, **kwargs) -> Objective:
    """Builds the objective registered under `name` (see `FACTORIES`) with keyword options."""
    if name not in FACTORIES:
        raise ValueError(f"objective name must be one of {sorted(FACTORIES)}, got {name!r}")
    return FACTORIES[name](**kwargs)


__all__ = [
    "FACTORIES",
    "Carry",
    "Objective",
    "TermSums",
    "causal_lm",
    "classification",
    "make_objective",
    "mlm",
    "permutation_lm",
    "prefix_lm",
    "rtd",
    "seq2seq",
    "span_boundary",
]
