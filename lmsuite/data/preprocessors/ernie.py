"""ERNIE 1.0 knowledge masking and Chinese whole-word masking on segmented text (peoples_daily).

ERNIE (Sun et al. 2019) masks whole knowledge units instead of single characters: at the
phrase level a multi-word phrase, at the entity level a whole named entity (person `nr`,
place `ns`, organisation `nt`). Like ERNIE's `seg_labels`, we mark where each unit starts.

Selection follows PaddlePaddle ERNIE 1.0's `batching.py` mask(), restated: every unit is
selected independently with probability 0.15 (the reference compares one uniform draw per unit,
at its first token, with 0.15), and every token of a selected unit is predicted, so an entity is
masked entirely or not at all and a long unit is as likely to be chosen as a short one. There
is no budget: the number of predictions per row is random (0 is possible). Each predicted token
then gets its own 80/10/10 draw ([MASK] / random id / kept), as the reference draws one per
token. Padded features need a width: if the selected units overflow `spec.max_predictions`, a
uniformly ordered subset of them that fits is kept (the task's default width, int(0.3 * L), is
several standard deviations above the mean count of 0.15 * L, so this is rare).

Input, one example per sentence or passage (H1's peoples_daily tokenization):
  `word_ids`: ragged int [W, None], token ids of each segmented word (Chinese characters);
  `word_tags`: string [W], the word's tag ("nr", "ns", "nt" for entities; anything else not);
  `phrase_starts` (level "phrase" only): int [W], 1 where a phrase begins.
Units per level:
  "word": every word (Chinese whole-word masking);
  "entity": a maximal run of consecutive words with the same entity tag, else a single word;
  "phrase": the runs given by `phrase_starts`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import tensorflow as tf

from lmsuite.data.preprocessors import mlm, sentence_pairs, whole_word

LEVELS = ("word", "phrase", "entity")
UNIT_RATE = 0.15
# Default padded width per token of the row (the task's `masked_ids` overrides it).
DEFAULT_WIDTH_RATE = 0.3
ENTITY_TAGS = ("nr", "ns", "nt")
UNIT_STARTS_KEY = "unit_starts"


def word_unit_starts(
    features: mlm.Features,
    *,
    level: str,
    entity_tags: Sequence[str] = ENTITY_TAGS,
    passage_starts: tf.Tensor | None = None,
) -> tf.Tensor:
    """Int32 [W]: 1 where a masking unit begins, per word. With `passage_starts` (bool [W]),
    the words are those of several passages one after the other: an entity never continues
    into a passage's first word.

    Example (level "entity"): word_tags ["nr", "nr", "v", "ns"] -> [1, 0, 1, 1]
    (the two `nr` words form one person name).
    """
    if level not in LEVELS:
        raise ValueError(f"level={level!r}, expected one of {LEVELS}")
    tags = features["word_tags"]
    num_words = tf.shape(tags)[0]
    if level == "word":
        return tf.ones([num_words], tf.int32)
    if level == "phrase":
        mlm.require_features(features, ["phrase_starts"], where="ERNIE phrase level")
        return tf.cast(features["phrase_starts"], tf.int32)
    is_entity = tf.reduce_any(tags[:, None] == tf.constant(list(entity_tags))[None, :], axis=1)
    previous = tf.concat([[""], tags[:-1]], 0)
    continues = is_entity & (tags == previous)
    if passage_starts is not None:
        continues &= ~passage_starts
    return 1 - tf.cast(continues, tf.int32)


_WORD_FEATURES = ("word_ids", "word_tags", "phrase_starts")


def ernie_inputs(
    features: mlm.Features,
    *,
    level: str,
    cls_id: int,
    sep_id: int,
    max_seq_length: int,
    entity_tags: Sequence[str] = ENTITY_TAGS,
) -> mlm.Features:
    """Flattens words into `[CLS] tokens [SEP]` with `word_starts` and `unit_starts`.

    Tokens past `max_seq_length - 2` are dropped (a unit cut there is still one unit). Other
    features pass through. One example is a batch of one of `batched_inputs`.

    Example (level "entity", cls 2, sep 3): word_ids [[10, 11], [12], [13, 14]],
    word_tags ["nr", "nr", "v"] -> input_ids [2, 10, 11, 12, 13, 14, 3],
    word_starts [1, 1, 0, 1, 1, 0, 1], unit_starts [1, 1, 0, 0, 1, 0, 1].
    """
    mlm.require_features(features, ["word_ids", "word_tags"], where="ernie_inputs")
    words = features["word_ids"]
    if not isinstance(words, tf.RaggedTensor):
        raise ValueError(f"word_ids must be ragged [W, None], got {words!r}")
    one = {"word_ids": tf.RaggedTensor.from_row_lengths(words, tf.reshape(words.nrows(), [1]))}
    for key in _WORD_FEATURES[1:]:
        if key in features:
            one[key] = tf.RaggedTensor.from_tensor(features[key][None])
    inputs = batched_inputs(
        one,
        level=level,
        cls_id=cls_id,
        sep_id=sep_id,
        max_seq_length=max_seq_length,
        entity_tags=entity_tags,
    )
    out = {k: v for k, v in features.items() if k not in _WORD_FEATURES}
    return {**out, **{k: v[0] for k, v in inputs.items()}}


def batched_inputs(
    batch: mlm.Features,
    *,
    level: str,
    cls_id: int,
    sep_id: int,
    max_seq_length: int,
    entity_tags: Sequence[str] = ENTITY_TAGS,
) -> mlm.Features:
    """`ernie_inputs` of a batch of examples (`word_ids` ragged [B, (W), (T)], `word_tags` and
    `phrase_starts` ragged [B, (W)], as `ragged_batch` gives them): `input_ids`,
    `word_starts` and `unit_starts`, ragged [B, None]. Other features pass through.

    The words of the batch are flattened once, an entity run never continuing into an
    example's first word; each example's tokens are then cut and framed on flat positions
    (`sentence_pairs._framed`).
    """
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length={max_seq_length}, expected >= 3")
    words = tf.cast(batch["word_ids"], tf.int32).values  # [words of the batch, (T)]
    first_word = tf.ragged.range(batch["word_tags"].row_lengths()).flat_values == 0
    flat_words = {k: batch[k].flat_values for k in _WORD_FEATURES[1:] if k in batch}
    unit_per_word = word_unit_starts(
        flat_words, level=level, entity_tags=entity_tags, passage_starts=first_word
    )
    is_first = tf.ragged.range(words.row_lengths()) == 0
    # Tokens of each example: its words' pieces, cut to what fits between the specials.
    token_splits = tf.cast(tf.gather(words.row_splits, batch["word_ids"].row_splits), tf.int32)
    begin = token_splits[:-1]
    empty = tf.zeros_like(begin)
    unit_starts = tf.cast(is_first, tf.int32) * unit_per_word[:, None]
    framed = sentence_pairs._framed(
        words.flat_values,
        tf.cast(is_first.flat_values, tf.int32),
        first=begin,
        first_length=tf.minimum(token_splits[1:] - begin, max_seq_length - 2),
        second=empty,
        second_length=empty,
        cls_id=cls_id,
        sep_id=sep_id,
        flags={UNIT_STARTS_KEY: unit_starts.flat_values},
    )
    del framed["token_type_ids"]
    return {**{k: v for k, v in batch.items() if k not in _WORD_FEATURES}, **framed}


def passage_inputs(dataset: tf.data.Dataset, *, batch_size: int = 64, **kwargs) -> tf.data.Dataset:
    """`ernie_inputs` on each example (kwargs as there), `batch_size` examples per call
    (`batched_inputs`): the same rows. Flattening one example's words is a few dozen small ops
    (string tags included), most of an ERNIE row's input CPU when run row by row."""
    mlm.require_features(dataset.element_spec, ["word_ids", "word_tags"], where="passage_inputs")
    batches = dataset.ragged_batch(batch_size)
    fn = tf.autograph.experimental.do_not_convert(lambda b: batched_inputs(b, **kwargs))
    return batches.map(fn).unbatch()


def unit_draws(shape: tf.Tensor, *, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The uniform float32 draws of `choose_drawn_units` for rows of `shape` [..., L]:
    (selection, visiting order), one per token. Unit u of a row uses draw u (a row has no more
    units than tokens): the same numbers as one draw per unit, since a stateless draw of n
    numbers is the first n of a longer one (a test checks it), and no unit count per row."""
    select_seed, order_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    return (
        tf.random.stateless_uniform(shape, select_seed),
        tf.random.stateless_uniform(shape, order_seed),
    )


def choose_drawn_units(
    maskable: tf.Tensor,
    unit_starts: tf.Tensor,
    *,
    select_draws: tf.Tensor,
    order_draws: tf.Tensor,
    rate: float = UNIT_RATE,
    limit: int | tf.Tensor,
) -> tf.Tensor:
    """Bool [G, L]: ERNIE's selection for a group of rows, from each row's `unit_draws` [G, U]
    (U at least the most units of a row; draws past a row's units are not used). Each unit is
    selected with probability `rate` (its selection draw below it), independently, and taken
    whole; if the selected units of a row hold more than `limit` tokens, they are visited in
    the order of their order draws and each is kept while it fits (`whole_word.greedy_fit`).

    Example (one row): maskable [F, T, T, T, F], unit_starts [1, 1, 0, 1, 1] (units "1 2" and
    "3"), selection draws 0.05 and 0.6 (rate 0.15) -> [F, T, T, F, F].
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"rate={rate}, expected in (0, 1]")
    shape = tf.shape(maskable)
    index, num_units = whole_word.unit_index(maskable, unit_starts)
    width = tf.shape(select_draws)[1]
    valid = tf.range(width)[None, :] < num_units[:, None]
    # Tokens per unit; every non-maskable token counts towards a dropped last column.
    slot = tf.where(index >= 0, index, width) + (width + 1) * tf.range(shape[0])[:, None]
    lengths = tf.reshape(
        tf.math.unsorted_segment_sum(tf.ones_like(slot), slot, shape[0] * (width + 1)),
        [shape[0], width + 1],
    )[:, :width]
    # Draws past a row's units would choose empty units (each a loop turn of the fit).
    chosen = valid & (select_draws < rate)
    # A row's own units keep the order of their draws; the never-chosen rest may interleave.
    order = tf.argsort(order_draws, axis=1, stable=True)
    too_long = tf.int32.max  # never fits: unselected units are never taken
    in_order = tf.where(
        tf.gather(chosen, order, batch_dims=1),
        tf.gather(lengths, order, batch_dims=1),
        too_long,
    )
    taken_in_order = whole_word.greedy_fit(in_order, tf.cast(limit, tf.int32))
    taken = tf.gather(taken_in_order, tf.argsort(order, axis=1, stable=True), batch_dims=1)
    taken = tf.concat([taken, tf.zeros([shape[0], 1], tf.bool)], axis=1)
    return maskable & tf.gather(taken, tf.where(index >= 0, index, width), batch_dims=1)


DRAWS_PREFIX = "__draws__/"  # a row's own draws, between `unit_mask_draws` and its group


def unit_mask_draws(features: mlm.Features, *, seed: tf.Tensor, spec: mlm.MlmSpec) -> mlm.Features:
    """Every random number of one row's unit masking, added as 1-D features: the unit draws of
    `choose_drawn_units` (`unit_draws`) and the per-token replacement draws
    (`mlm.replacement_draws`). `mask_drawn_units` then masks a group of such rows as
    `mask_units` masks each."""
    choose_seed, replace_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    shape = tf.shape(features["input_ids"])
    select, order = unit_draws(shape, seed=choose_seed)
    decisions, random_ids = mlm.replacement_draws(shape, seed=replace_seed, spec=spec)
    drawn = {"select": select, "order": order, "decisions": decisions, "random_ids": random_ids}
    return {**features, **{DRAWS_PREFIX + k: v for k, v in drawn.items()}}


def mask_drawn_units(
    rows: mlm.Features, *, lengths: tf.Tensor, spec: mlm.MlmSpec, units_key: str = UNIT_STARTS_KEY
) -> mlm.Features:
    """`mask_units` on a group of rows [G, L] (their own `lengths` [G], zero-padded past them)
    carrying their `unit_mask_draws`; the draws are dropped."""
    drawn = {k[len(DRAWS_PREFIX) :]: v for k, v in rows.items() if k.startswith(DRAWS_PREFIX)}
    rows = {k: v for k, v in rows.items() if not k.startswith(DRAWS_PREFIX)}
    maskable = mlm.maskable_tokens(rows, spec=spec, lengths=lengths)
    selected = choose_drawn_units(
        maskable,
        rows[units_key],
        select_draws=drawn["select"],
        order_draws=drawn["order"],
        limit=spec.budget_limit,
    )
    return mlm.finish_masking(
        rows, selected, spec=spec, drawn=(drawn["decisions"], drawn["random_ids"])
    )


def mask_units(
    features: mlm.Features, *, seed: tf.Tensor, spec: mlm.MlmSpec, units_key: str = UNIT_STARTS_KEY
) -> mlm.Features:
    """ERNIE's selection (`choose_drawn_units`, the units starting where `units_key`
    is 1) then 80/10/10 per token, on one row: `unit_mask_draws` then `mask_drawn_units` on a
    group of one. The tasks draw row by row and mask groups, with the same masks."""
    drawn = unit_mask_draws(features, seed=seed, spec=spec)
    one = mask_drawn_units(
        {k: v[None] for k, v in drawn.items()},
        lengths=tf.size(features["input_ids"])[None],
        spec=spec,
        units_key=units_key,
    )
    return {k: v[0] for k, v in one.items()}


def mask_ernie(
    features: mlm.Features,
    *,
    seed: tf.Tensor,
    spec: mlm.MlmSpec,
    level: str,
    cls_id: int,
    sep_id: int,
    max_seq_length: int,
    entity_tags: Sequence[str] = ENTITY_TAGS,
) -> mlm.Features:
    """ERNIE knowledge masking (or Chinese whole-word masking, level "word") of one example.

    Output: `input_ids`, `word_starts`, `unit_starts` [<= max_seq_length] and the MLM features.

    Example (level "entity"): word_ids [[10, 11], [12], [13, 14]], tags ["nr", "nr", "v"]
    -> units "10 11 12" and "13 14", each selected with probability 0.15; say only "13 14":
    input_ids [2, 10, 11, 12, 4, 4, 3] (before each token's 10% random / 10% kept draws),
    masked_positions [4, 5, 0...], masked_ids [13, 14, 0...].
    """
    inputs = ernie_inputs(
        features,
        level=level,
        cls_id=cls_id,
        sep_id=sep_id,
        max_seq_length=max_seq_length,
        entity_tags=entity_tags,
    )
    return mask_units(inputs, seed=seed, spec=spec)


def ernie_dynamic_mlm(dataset: tf.data.Dataset, *, spec: mlm.MlmSpec, **kwargs) -> tf.data.Dataset:
    """ERNIE masking with a fresh mask each time an example is seen; kwargs as `mask_ernie`.
    Examples build their rows in batches (`passage_inputs`), each row draws under its own
    seed, and groups of rows are masked at once (`mlm.grouped_dynamic_masking`): `mask_ernie`'s
    masks."""
    return mlm.grouped_dynamic_masking(
        passage_inputs(dataset, **kwargs),
        draw_fn=functools.partial(unit_mask_draws, spec=spec),
        mask_fn=functools.partial(mask_drawn_units, spec=spec),
    )


def ernie_static_mlm(
    dataset: tf.data.Dataset, *, spec: mlm.MlmSpec, dupe_factor: int = 10, **kwargs
) -> tf.data.Dataset:
    """ERNIE masking, `dupe_factor` fixed masks per example; kwargs as `mask_ernie`."""
    return mlm.static_masking(
        dataset, mask_fn=mask_ernie, dupe_factor=dupe_factor, spec=spec, **kwargs
    )
