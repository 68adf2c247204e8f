"""The recipe rows of encoder-decoder objectives: T5's span corruption, i.i.d. denoising and prefix
LM, BART's denoising, MASS and UL2's mixture of denoisers.

They share one pairing (`_seq2seq_row`): task features inputs and targets, SeqIO's
`EncDecFeatureConverter` packed, the `seq2seq` loss, an encoder-decoder model, per-task metrics
along the targets. A row gives its lengths and example model, and says where else it differs
(loss options, a length check; MASS its own converter, which keeps the decoder side its task
builds). How a run picks a row is in `recipes`, whose `RECIPES` lists these rows with the other
families'.
"""

from collections.abc import Mapping

import seqio

from lmsuite.data import feature_converters as fc
from lmsuite.data import vocab as vocab_lib
from lmsuite.data.preprocessors import mass, span_corruption, ul2
from lmsuite.objectives import seq2seq
from lmsuite.training.recipe_types import Recipe


def _span_corruption_lengths(length: int) -> dict[str, int]:
    return {
        "inputs": length,
        "targets": span_corruption.random_spans_helper(inputs_length=length)[1],
    }


def _spans_fit(lengths: Mapping[str, int]) -> list[str]:
    problem = span_corruption.targets_length_problem(lengths)
    return [] if problem is None else [problem]


def _ul2_fits(lengths: Mapping[str, int]) -> list[str]:
    problem = ul2.targets_length_problem(lengths)
    return [] if problem is None else [problem]


def _mass_fits(lengths: Mapping[str, int]) -> list[str]:
    problem = mass.targets_length_problem(lengths)
    return [] if problem is None else [problem]


def _seq2seq_row(name, objective, summary, *, lengths_for, model, **kwargs) -> Recipe:
    defaults = dict(
        length_keys=("inputs", "targets"),
        task_features=("inputs", "targets"),
        converter=seqio.EncDecFeatureConverter,
        pack=True,
        loss=seq2seq.seq2seq,
        architectures=("encoder_decoder",),
        task_ids_along=("targets",),
    )
    return Recipe(
        name=name,
        summary=summary,
        task_objectives=kwargs.pop("task_objectives", (objective,)),
        lengths_for=lengths_for,
        example_model=model,
        **(defaults | kwargs),
    )


T5_SPAN_CORRUPTION = _seq2seq_row(
    "t5_span_corruption",
    "t5_span_corruption",
    "T5 span corruption: 15% noise in spans of mean 3, one sentinel per span",
    lengths_for=_span_corruption_lengths,
    model="t5_1_1_tiny",
    check_lengths=_spans_fit,
    reference="t5 preprocessors.span_corruption; t5x EncoderDecoderModel.loss_fn",
)

IID_DENOISING = _seq2seq_row(
    "iid_denoising",
    "iid_denoising",
    "T5 i.i.d. denoising: each token noise with probability 0.15",
    lengths_for=lambda n: {"inputs": n, "targets": n // 2},
    model="t5_tiny",
    reference="t5 preprocessors.iid_denoising",
)

PREFIX_LM = _seq2seq_row(
    "prefix_lm",
    "prefix_lm",
    "T5's prefix LM, encoder-decoder: the encoder reads a prefix, the decoder the rest",
    lengths_for=lambda n: {"inputs": n, "targets": n},
    model="t5_tiny",
    reference="t5 preprocessors.prefix_lm",
)

BART_DENOISING = _seq2seq_row(
    "bart_denoising",
    "bart_denoising",
    "BART: sentence permutation + text infilling (Poisson(3) spans, 30%)",
    lengths_for=lambda n: {"inputs": n, "targets": n},
    model="bart_tiny",
    loss_options={"z_loss": 0.0},
    reference="fairseq denoising_dataset.py; fairseq cross_entropy criterion (no z-loss)",
)

MASS = _seq2seq_row(
    "mass",
    "mass",
    "MASS: the encoder masks a fragment of half the sentence, the decoder predicts it",
    lengths_for=lambda n: {"inputs": n, "targets": mass.fragment_length(n, 0.5)},
    task_features=("inputs", "targets", "decoder_input_tokens", "decoder_positions"),
    converter=lambda pack: fc.MassFeatureConverter(pack=pack),
    task_ids_along=(),  # its converter builds the decoder side itself: no passthrough
    loss_options={
        "z_loss": 0.0,
        "cross_attention_ignores": vocab_lib.MASK_ID,
        "given_decoder_positions": True,
    },
    model="bart_tiny",
    check_lengths=_mass_fits,
    reference="microsoft/MASS MASS-unsupNMT/src/trainer.py (mass_step)",
)

# Train it on the mixture `{corpus}_ul2` (per-denoiser metrics); each denoiser's task also
# trains alone.
UL2 = _seq2seq_row(
    "ul2",
    ul2.DENOISERS[0].name,
    "UL2 mixture of denoisers: R (spans 3, 8 at 15%), X (spans 3, 8 at 50%; 64 at 15%, "
    "50%) and S (prefix LM), each input led by its mode token [NLU]/[NLG]/[S2S]",
    task_objectives=tuple(d.name for d in ul2.DENOISERS),
    lengths_for=ul2.lengths,
    model="t5_1_1_tiny",
    check_lengths=_ul2_fits,
    reference="Tay et al. 2022 (arXiv 2205.05131) §3.1 and its appendix ul2_objective "
    "(t5 random_spans_helper, span_corruption/denoise, prefix_lm, prepend_prompt), the "
    "T5X UL2 configs' prefixes [NLU]/[NLG]/[S2S]; t5x EncoderDecoderModel.loss_fn",
    differences=ul2.DIFFERENCES,
)
