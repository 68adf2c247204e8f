"""The jax side of each pretraining objective: which model inputs to feed, and the loss.

An `Objective` sees the model's output dict and the batch dict, never a model class. Its loss is
a sum of named terms, each `loss_sum / denominator`; the denominators depend on the batch alone,
so a step can compute them over the whole global batch first and then accumulate microbatch
gradients that add up exactly to the big batch's gradient.
"""

from lmsuite.objectives import seq2seq  # noqa: I001  (the module; its factory is seq2seq.seq2seq)
from lmsuite.objectives.base import Carry, Objective, TermSums
from lmsuite.objectives.causal_lm import causal_lm, prefix_lm
from lmsuite.objectives.mlm import mlm
from lmsuite.objectives.plm import permutation_lm
from lmsuite.objectives.spanbert import span_boundary
from lmsuite.objectives.stream_lm import stream_lm

__all__ = [
    "Carry",
    "Objective",
    "TermSums",
    "causal_lm",
    "mlm",
    "permutation_lm",
    "prefix_lm",
    "seq2seq",
    "span_boundary",
    "stream_lm",
]
