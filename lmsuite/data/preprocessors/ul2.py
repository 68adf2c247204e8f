"""UL2's mixture of denoisers (Tay et al. 2022, §3.1): seven denoisers, each a seq2seq task.

R-denoisers are T5 span corruption with short spans at 15% noise, X-denoisers corrupt hard (long
spans or 50% noise), the S-denoiser is a prefix LM. Each prepends its paradigm ("mode") token to
the inputs, as text tokenized by the task's vocabulary, as the released code's `prepend_prompt`
does (`vocabulary.encode_tf(prefix)`), with the T5X configs' spellings: `[NLU]` for R, `[NLG]`
for X, `[S2S]` for S. With lmsuite's SentencePiece vocabularies each is several pieces (five on
wiki_sample: `[NLU]` -> [903, 425, 451, 955, 629]).

Each denoiser sizes its own chunks, as UL2's `ul2_objective` does (t5's `random_spans_helper`
per (mean span, density)), for the inputs length *less the mode tokens*, so that mode + corrupted
inputs + EOS fill exactly `inputs` (the reference sizes for the full length and lets SeqIO trim
the tail; its T5X configs reserve one token with `reserved_for_packing=1`). A row's single
`{"inputs": L, "targets": M}` holds every denoiser when M is the largest targets length any of
them makes at L (`lengths`): X-denoisers at 50% noise make targets about as long as the inputs.

Example (R-denoiser mu=3 r=0.15, mode [NLU] = m1..m5, R=8 raw tokens, noise (c d), (g h)):
  {"targets": [a b c d e f g h]} ->
  {"inputs": [m1 .. m5 a b <0> e f <1>], "targets": [<0> c d <1> g h]}  (+ EOS from SeqIO)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import tensorflow as tf

from lmsuite.data.preprocessors import lm, span_corruption

R_MODE, X_MODE, S_MODE = "[NLU]", "[NLG]", "[S2S]"


@dataclasses.dataclass(frozen=True)
class Denoiser:
    """One denoiser: its task objective name, mode token, span corruption (mean span, density;
    `mean_span=None` for the S-denoiser's prefix LM) and its share of the mixture."""

    name: str
    paradigm: str  # "R", "X" or "S"
    mode: str
    mean_span: float | None
    density: float
    rate: float

    @property
    def is_prefix_lm(self) -> bool:
        return self.mean_span is None


# The paper's final mixture (§3.1.2; the same seven in the released configs). Rates: R and X 40%
# each, split evenly among their denoisers, S 20% (the split the public T5X configs of UL2
# derive from the paper's §4.5 ablations; `ul2_objective` itself samples uniformly when given
# no rates).
DENOISERS: tuple[Denoiser, ...] = (
    Denoiser("ul2_r_mu3_r15", "R", R_MODE, 3.0, 0.15, 0.2),
    Denoiser("ul2_r_mu8_r15", "R", R_MODE, 8.0, 0.15, 0.2),
    Denoiser("ul2_x_mu3_r50", "X", X_MODE, 3.0, 0.5, 0.1),
    Denoiser("ul2_x_mu8_r50", "X", X_MODE, 8.0, 0.5, 0.1),
    Denoiser("ul2_x_mu64_r15", "X", X_MODE, 64.0, 0.15, 0.1),
    Denoiser("ul2_x_mu64_r50", "X", X_MODE, 64.0, 0.5, 0.1),
    Denoiser("ul2_s", "S", S_MODE, None, 0.5, 0.2),
)
BY_NAME: dict[str, Denoiser] = {d.name: d for d in DENOISERS}

DIFFERENCES = (
    "each denoiser is its own SeqIO task reading the whole stream, sampled at the mixture's "
    "rates (the reference samples seven shards of one stream, shard_ds=True); rates R 40% / X "
    "40% / S 20% as the public T5X UL2 configs (ul2_objective's default is uniform); the mode "
    "tokens (text, several pieces) are reserved from the inputs length, not trimmed off the "
    "tail by SeqIO; no 65,536-token random window and a continuous stream (as lmsuite's span "
    "corruption); the S-denoiser cuts documents apart (lmsuite's prefix_lm) where the reference "
    "concatenates them; one targets length for all denoisers (the largest), so R-denoisers' "
    "targets are padded or packed"
)


def targets_length(denoiser: Denoiser, inputs_length: int) -> int:
    """The longest targets (EOS included) `denoiser` makes for inputs of `inputs_length`.

    Span denoisers: t5's `random_spans_helper` (R mu=3 r=0.15 at 512 -> 114; X r=0.5 -> 512).
    S-denoiser: chunks of `inputs - 1` tokens keep a prefix of at least one, so at most
    `inputs - 2` target tokens + EOS.
    """
    if denoiser.is_prefix_lm:
        return inputs_length - 1
    return span_corruption.random_spans_helper(
        inputs_length=inputs_length,
        noise_density=denoiser.density,
        mean_noise_span_length=denoiser.mean_span,
    )[1]


def lengths(inputs_length: int) -> dict[str, int]:
    """The row's sequence length for inputs of `inputs_length`: targets fit every denoiser.

    Example: 128 -> {"inputs": 128, "targets": 128} (the X-denoisers at 50% noise need 128).
    Sized without the mode tokens, an upper bound of what each denoiser makes once they are
    reserved (`targets_length_problem` checks the exact figure when the task is built).
    """
    return {
        "inputs": inputs_length,
        "targets": max(targets_length(d, inputs_length) for d in DENOISERS),
    }


def targets_length_problem(
    sequence_length: Mapping[str, int], *, mode_length: int = 0
) -> str | None:
    """Why `sequence_length` cannot hold some denoiser's targets (naming it), or None."""
    inputs_length, targets = lm._lengths(sequence_length, "inputs", "targets")
    room = inputs_length - mode_length
    if room < 3:
        return f"inputs length {inputs_length} leaves {room} tokens after the mode tokens"
    for denoiser in DENOISERS:
        needed = targets_length(denoiser, room)
        if targets < needed:
            return (
                f"targets length {targets} < {needed}, what UL2's {denoiser.name} (mean span "
                f"{denoiser.mean_span}, density {denoiser.density}) makes for inputs {room} "
                f"({inputs_length} less {mode_length} mode tokens); set SEQUENCE_LENGTH = "
                f"{lengths(inputs_length)}"
            )
    return None


def prepend_mode(dataset: tf.data.Dataset, mode_ids: Sequence[int]) -> tf.data.Dataset:
    """Puts `mode_ids` before every example's `inputs`.

    Example (mode_ids [7, 8]): {"inputs": [5, 6], "targets": [9]} ->
      {"inputs": [7, 8, 5, 6], "targets": [9]}
    """
    mode = tf.constant(list(mode_ids), tf.int32)

    def prepend(ex):
        ex = dict(ex)
        ex["inputs"] = tf.concat([mode, tf.cast(ex["inputs"], tf.int32)], axis=0)
        return ex

    return dataset.map(prepend, num_parallel_calls=tf.data.AUTOTUNE)


def denoise(
    dataset: tf.data.Dataset,
    *,
    sequence_length: Mapping[str, int],
    denoiser: Denoiser,
    mode_ids: Sequence[int],
    sentinel_ids: Sequence[int] = (),
) -> tf.data.Dataset:
    """`denoiser`'s examples of the document stream (`targets` token ids), mode tokens first.

    The denoiser runs for inputs of `sequence_length["inputs"] - len(mode_ids)` (span corruption
    with its mean span and density, or the prefix LM at T5's density 0.5), then `prepend_mode`.

    Raises:
      ValueError: the targets length is below what the denoiser makes (naming both), or the
        inputs leave fewer than 3 tokens after the mode tokens.
    """
    problem = targets_length_problem(sequence_length, mode_length=len(mode_ids))
    if problem is not None:
        raise ValueError(problem)
    room = dict(sequence_length)
    room["inputs"] = int(sequence_length["inputs"]) - len(mode_ids)
    if denoiser.is_prefix_lm:
        examples = lm.prefix_lm(dataset, sequence_length=room, noise_density=denoiser.density)
    else:
        examples = span_corruption.span_corruption(
            dataset,
            sequence_length=room,
            sentinel_ids=sentinel_ids,
            noise_density=denoiser.density,
            mean_noise_span_length=denoiser.mean_span,
        )
    return prepend_mode(examples, mode_ids)
