"""BERT-style masked language modelling: budget, 80/10/10 replacement, static and dynamic modes.

Every masker in this package shares three steps, defined here:

1. choose which positions to predict (token-level here; words, n-grams, spans and entities in
   sibling modules), never a special token and never more than the budget
   `min(max_predictions, max(1, round(mask_rate * n)))` where n counts the maskable tokens;
2. corrupt the chosen positions: `mask_fraction` -> [MASK], `random_fraction` -> a random id
   drawn uniformly from the non-special ids, the rest kept;
3. emit `masked_positions`, `masked_ids`, `masked_weights`, padded to `max_predictions`.

Rounding is round-half-to-even, as Python 3's `round` in BERT's create_pretraining_data.py.
By default n counts the maskable tokens only; BERT, ALBERT and ELECTRA count the whole row,
[CLS]/[SEP] included (`MlmSpec.budget_counts_specials`, on in `MlmSpec.electra`). A spec's
`prediction_cap` caps the budget below the padded width (ALBERT's constant 20).

A per-example masker is `fn(features, *, seed, spec, ...) -> features`; `dynamic_masking` maps it
with SeqIO's per-example seeds (use it after SeqIO's cache/repeat: a fresh mask each time an
example is seen) and `static_masking` materialises `dupe_factor` differently-seeded copies of each
example (use it before the cache: the masks are then fixed, as BERT's offline data).

The shared steps and `mask_tokens` also take a group of rows `[B, L]` with their `lengths`:
`grouped_dynamic_masking` masks `GROUP_SIZE` examples in one call, one seed per group, each row
with its own draws. tf.data's cost per function call and per op is then paid once per group
instead of once per example (BERT MLM on wiki_sample chunks: 6.2 -> 4.3 ms of CPU per 32
examples, grouping's own per-example steps included; the masks follow the same distribution,
not the same draws as per-example seeds would give).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import seqio
import tensorflow as tf

Features = dict[str, tf.Tensor]
MaskFn = Callable[..., Features]

# Per-token bool feature that, when present, forbids masking those tokens (e.g. tokens already
# shuffled by StructBERT's word-structure objective).
NO_MASK_KEY = "no_mask"


@dataclasses.dataclass(frozen=True)
class MlmSpec:
    """Ids and rates shared by every masker.

    Attributes:
      mask_id: id of [MASK].
      vocab_size: size of the vocabulary; random replacements are drawn from
        `[0, vocab_size)` minus `special_ids` (and minus `mask_id`).
      special_ids: ids that are never masked and never sampled as replacements
        ([PAD], [CLS], [SEP], [MASK], <s>, </s>, sentinels, ...).
      max_predictions: width of the padded prediction features, and a cap on the budget.
      mask_rate: fraction of maskable tokens to predict (0.15).
      mask_fraction: fraction of predicted positions replaced by [MASK] (0.8).
      random_fraction: fraction replaced by a random id (0.1); the rest are kept.
      prediction_cap: if set, a cap on the budget below `max_predictions` (the padded width
        stays `max_predictions`): ALBERT's `max_predictions_per_seq` = 20 whatever the width.
      budget_counts_specials: count [CLS]/[SEP] (every token of the row) in the budget's n,
        as ELECTRA's `mask()` does (`num_tokens = sum(input_mask)`).
    """

    mask_id: int
    vocab_size: int
    special_ids: tuple[int, ...]
    max_predictions: int
    mask_rate: float = 0.15
    mask_fraction: float = 0.8
    random_fraction: float = 0.1
    prediction_cap: int | None = None
    budget_counts_specials: bool = False

    def __post_init__(self):
        object.__setattr__(self, "special_ids", tuple(int(i) for i in self.special_ids))
        if not 0 <= self.mask_id < self.vocab_size:
            raise ValueError(
                f"mask_id={self.mask_id} must lie in [0, vocab_size={self.vocab_size})"
            )
        bad = [i for i in self.special_ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"special_ids {bad} outside [0, vocab_size={self.vocab_size})")
        if self.max_predictions < 1:
            raise ValueError(f"max_predictions={self.max_predictions}, expected >= 1")
        if self.prediction_cap is not None and self.prediction_cap < 1:
            raise ValueError(f"prediction_cap={self.prediction_cap}, expected None or >= 1")
        if not 0.0 < self.mask_rate <= 1.0:
            raise ValueError(f"mask_rate={self.mask_rate}, expected in (0, 1]")
        if not (0 <= self.mask_fraction and 0 <= self.random_fraction):
            raise ValueError(f"negative fractions {self.mask_fraction}, {self.random_fraction}")
        if self.mask_fraction + self.random_fraction > 1.0 + 1e-9:
            raise ValueError(
                f"mask_fraction + random_fraction = {self.mask_fraction + self.random_fraction}"
                " exceeds 1"
            )
        if len(self.replacement_ids) == 0:
            raise ValueError(f"no non-special ids left in a vocabulary of {self.vocab_size}")

    @property
    def replacement_ids(self) -> np.ndarray:
        """The ids a random replacement is drawn from, uniformly."""
        excluded = np.asarray(sorted({*self.special_ids, self.mask_id}), np.int64)
        return np.setdiff1d(np.arange(self.vocab_size, dtype=np.int64), excluded).astype(np.int32)

    @property
    def budget_limit(self) -> int:
        """The most predictions a row may get: `max_predictions`, or `prediction_cap` below it."""
        if self.prediction_cap is None:
            return self.max_predictions
        return min(self.max_predictions, self.prediction_cap)

    @classmethod
    def electra(
        cls,
        *,
        max_seq_length: int,
        mask_prob: float = 0.15,
        max_predictions: int | None = None,
        **ids,
    ) -> MlmSpec:
        """ELECTRA's generator masking (google-research/electra pretrain_helpers.mask()).

        85% of the predicted positions become [MASK] and 15% keep their token; none gets a
        random id (the discriminator's replaced tokens come from the generator instead).
        The count per row is `max(1, min(N, round(mask_prob * len(row))))`, len(row) counting
        [CLS]/[SEP], with N = `int((mask_prob + 0.005) * max_seq_length)` (19 at L=128, 79 at
        L=512). `max_predictions` sets a wider padded width; the count stays capped at N.
        """
        cap = electra_max_predictions(max_seq_length, mask_prob=mask_prob)
        return cls(
            max_predictions=cap if max_predictions is None else max_predictions,
            mask_rate=mask_prob,
            mask_fraction=0.85,
            random_fraction=0.0,
            prediction_cap=cap,
            budget_counts_specials=True,
            **ids,
        )


def electra_max_predictions(max_seq_length: int, *, mask_prob: float = 0.15) -> int:
    """ELECTRA's cap on predictions per sequence: `int((mask_prob + 0.005) * L)`.

    Example: L=128 -> int(0.155 * 128) = 19; L=512 -> 79.
    """
    if max_seq_length < 1:
        raise ValueError(f"max_seq_length={max_seq_length}, expected >= 1")
    return int((mask_prob + 0.005) * max_seq_length)


def prediction_budget(
    num_maskable: tf.Tensor, *, spec: MlmSpec, num_tokens: tf.Tensor | None = None
) -> tf.Tensor:
    """`min(spec.budget_limit, max(1, round(mask_rate * n)), num_maskable)` as int32 (0 when
    nothing is maskable); n is `num_tokens` (the whole row) when the spec's
    `budget_counts_specials` is set and `num_tokens` is given, else `num_maskable`.

    Example: n=10, rate 0.15 -> round(1.5) = 2 (half to even); n=30 -> round(4.5) = 4.
    """
    maskable = tf.cast(num_maskable, tf.int32)
    n = maskable
    if spec.budget_counts_specials and num_tokens is not None:
        n = tf.cast(num_tokens, tf.int32)
    wanted = tf.cast(tf.round(spec.mask_rate * tf.cast(n, tf.float64)), tf.int32)
    budget = tf.minimum(spec.budget_limit, tf.maximum(1, wanted))
    return tf.minimum(budget, maskable)


def maskable_tokens(
    features: Features, *, spec: MlmSpec, lengths: tf.Tensor | None = None
) -> tf.Tensor:
    """Bool [..., L]: tokens that may be masked (not special, not in the optional `no_mask`
    feature, and, for rows padded to a common L, before the row's `lengths` [...]).

    Example: input_ids [2, 17, 18, 3] with special_ids (2, 3) -> [False, True, True, False].
    """
    ids = features["input_ids"]
    specials = tf.constant(spec.special_ids or (-1,), ids.dtype)
    maskable = tf.reduce_all(tf.not_equal(ids[..., None], specials), axis=-1)
    if NO_MASK_KEY in features:
        maskable &= ~tf.cast(features[NO_MASK_KEY], tf.bool)
    if lengths is not None:
        positions = tf.range(tf.shape(ids)[-1], dtype=tf.int32)
        maskable &= positions < tf.cast(lengths, tf.int32)[..., None]
    return maskable


def replacement_draws(shape: tf.Tensor, *, seed: tf.Tensor, spec: MlmSpec):
    """(uniform float32 decision draws, random replacement ids), each of `shape`: every random
    number `apply_replacements` uses, for maskers that draw per example and corrupt a group."""
    decision_seed, random_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    draws = tf.random.stateless_uniform(shape, decision_seed, dtype=tf.float32)
    pool = tf.constant(spec.replacement_ids)
    random_ids = tf.gather(
        pool,
        tf.random.stateless_uniform(
            shape, random_seed, minval=0, maxval=pool.shape[0], dtype=tf.int32
        ),
    )
    return draws, random_ids


def replace_selected(
    input_ids: tf.Tensor,
    selected: tf.Tensor,
    *,
    draws: tf.Tensor,
    random_ids: tf.Tensor,
    spec: MlmSpec,
) -> tf.Tensor:
    """Corrupts the selected positions from given `replacement_draws`: [MASK] where the draw
    is below `mask_fraction`, the random id below `mask_fraction + random_fraction`, else kept."""
    to_mask = selected & (draws < spec.mask_fraction)
    to_random = selected & ~to_mask & (draws < spec.mask_fraction + spec.random_fraction)
    out = tf.where(to_random, tf.cast(random_ids, input_ids.dtype), input_ids)
    return tf.where(to_mask, tf.cast(spec.mask_id, input_ids.dtype), out)


def apply_replacements(
    input_ids: tf.Tensor,
    selected: tf.Tensor,
    *,
    seed: tf.Tensor,
    spec: MlmSpec,
    decision_index: tf.Tensor | None = None,
) -> tf.Tensor:
    """Corrupts the selected positions: [MASK] / random id / kept, by one uniform draw each.

    `decision_index[i]` names the position whose draw decides token i (span-level decisions:
    every token of a span points at the span's first token); by default each token decides
    for itself. Random ids are drawn per token.

    Example: ids [2, 17, 18, 19, 3], selected [F, T, F, T, F], draws 0.3 and 0.95
    -> [2, 4, 18, 19, 3] (17 masked, 19 kept).
    """
    draws, random_ids = replacement_draws(tf.shape(input_ids), seed=seed, spec=spec)
    if decision_index is not None:
        draws = tf.gather(draws, decision_index, batch_dims=input_ids.shape.rank - 1)
    return replace_selected(input_ids, selected, draws=draws, random_ids=random_ids, spec=spec)


def pad_to(values: tf.Tensor, width: int, *, name: str) -> tf.Tensor:
    """Right-pads a 1-D tensor with zeros to `width`, failing if it is longer."""
    count = tf.shape(values)[0]
    check = tf.debugging.assert_less_equal(
        count, width, message=f"{name}: more predictions than max_predictions={width}"
    )
    with tf.control_dependencies([check]):
        padded = tf.pad(values, [[0, width - count]])
    return tf.ensure_shape(padded, [width])


def prediction_features(original_ids: tf.Tensor, selected: tf.Tensor, *, spec: MlmSpec) -> Features:
    """`masked_positions` (int32), `masked_ids`, `masked_weights` (float32), [..., P] padded.

    Positions are in increasing order. Fails (InvalidArgumentError) if a row selects more than
    `max_predictions` positions.

    Example: original [2, 17, 18, 3], selected [F, T, F, F], max_predictions 3
    -> positions [1, 0, 0], ids [17, 0, 0], weights [1., 0., 0.].
    """
    width = spec.max_predictions
    length = tf.shape(selected)[-1]
    count = tf.reduce_sum(tf.cast(selected, tf.int32), axis=-1)
    check = tf.debugging.assert_less_equal(
        count, width, message=f"masked_positions: more predictions than max_predictions={width}"
    )
    # Selected positions first, in order: sort by position, shifted by L where not selected.
    index = tf.range(length, dtype=tf.int32)
    order = tf.argsort(tf.where(selected, index, index + length), axis=-1, stable=True)
    rank = selected.shape.rank
    with tf.control_dependencies([check]):
        order = tf.pad(order, [[0, 0]] * (rank - 1) + [[0, tf.maximum(width - length, 0)]])
    valid = tf.range(width) < count[..., None]
    positions = tf.where(valid, order[..., :width], 0)
    ids = tf.gather(original_ids, positions, batch_dims=rank - 1)
    fixed = lambda x: tf.ensure_shape(x, selected.shape[:-1] + [width])
    return {
        "masked_positions": fixed(positions),
        "masked_ids": fixed(tf.where(valid, ids, tf.zeros_like(ids))),
        "masked_weights": fixed(tf.cast(valid, tf.float32)),
    }


def finish_masking(
    features: Features,
    selected: tf.Tensor,
    *,
    seed: tf.Tensor | None = None,
    spec: MlmSpec,
    decision_index: tf.Tensor | None = None,
    drawn: tuple[tf.Tensor, tf.Tensor] | None = None,
) -> Features:
    """Applies replacements and adds the prediction features; drops `no_mask`.

    The replacements are drawn from `seed`, or given as `drawn` (`replacement_draws`' pair).
    """
    if (seed is None) == (drawn is None):
        raise ValueError("finish_masking takes a seed or drawn replacements, exactly one")
    out = {k: v for k, v in features.items() if k != NO_MASK_KEY}
    original = features["input_ids"]
    if drawn is None:
        out["input_ids"] = apply_replacements(
            original, selected, seed=seed, spec=spec, decision_index=decision_index
        )
    else:
        draws, random_ids = drawn
        out["input_ids"] = replace_selected(
            original, selected, draws=draws, random_ids=random_ids, spec=spec
        )
    out.update(prediction_features(original, selected, spec=spec))
    return out


def choose_random_tokens(maskable: tf.Tensor, budget: tf.Tensor, *, seed: tf.Tensor) -> tf.Tensor:
    """Bool [..., L]: `budget` [...] maskable positions of each row, chosen uniformly without
    replacement."""
    draws = tf.random.stateless_uniform(tf.shape(maskable), seed, dtype=tf.float32)
    order = tf.argsort(tf.where(maskable, draws, 2.0), axis=-1, stable=True)
    rank = tf.argsort(order, axis=-1, stable=True)  # the inverse permutation of each row
    return maskable & (rank < budget[..., None])


def mask_tokens(
    features: Features, *, seed: tf.Tensor, spec: MlmSpec, lengths: tf.Tensor | None = None
) -> Features:
    """Token-level BERT/ELECTRA masking of one example, or of a group of rows.

    Input: `input_ids` int [L] (other features pass through). Output adds
    `masked_positions`, `masked_ids`, `masked_weights` [max_predictions] and corrupts input_ids.
    A group: `input_ids` [B, L] and the rows' `lengths` [B] (tokens past them are padding, never
    masked); outputs gain the leading B.

    Example (spec: mask_id 4, special_ids (0, 2, 3, 4), max_predictions 4, rate 0.15):
      input_ids [2, 10, 11, ..., 29, 3] (20 maskable) -> budget round(3.0) = 3; say positions
      2, 9 and 18 are drawn, position 9 (token 18) in the 10% "keep" case:
      input_ids [2, 10, 4, 12, ..., 17, 18, 19, ..., 26, 4, 28, 29, 3],
      masked_positions [2, 9, 18, 0], masked_ids [11, 18, 27, 0], masked_weights [1, 1, 1, 0].
    """
    choose_seed, replace_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    maskable = maskable_tokens(features, spec=spec, lengths=lengths)
    if lengths is None:
        num_tokens = tf.fill(tf.shape(maskable)[:-1], tf.shape(maskable)[-1])
    else:
        num_tokens = lengths
    budget = prediction_budget(
        tf.reduce_sum(tf.cast(maskable, tf.int32), axis=-1), spec=spec, num_tokens=num_tokens
    )
    selected = choose_random_tokens(maskable, budget, seed=choose_seed)
    return finish_masking(features, selected, seed=replace_seed, spec=spec)


def dynamic_masking(dataset: tf.data.Dataset, *, mask_fn: MaskFn, **kwargs) -> tf.data.Dataset:
    """Maps `mask_fn(features, seed=..., **kwargs)` with SeqIO's per-example seeds.

    Place it after SeqIO's cache: SeqIO repeats before post-cache preprocessors, so each epoch
    draws a new seed per example (RoBERTa's dynamic masking). Deterministic under
    `seqio.map_seed_manager(s)`.
    """

    @seqio.map_over_dataset(num_seeds=1)
    @tf.autograph.experimental.do_not_convert
    def _mask(features, seed):
        return mask_fn(features, seed=seed, **kwargs)

    return _mask(dataset)


GROUP_SIZE = 32


def grouped_dynamic_masking(
    dataset: tf.data.Dataset,
    *,
    mask_fn: MaskFn,
    group_size: int = GROUP_SIZE,
    draw_fn: MaskFn | None = None,
    **kwargs,
) -> tf.data.Dataset:
    """`dynamic_masking` in groups: `mask_fn(rows, seed=..., lengths=..., **kwargs)` on each
    `group_size` consecutive examples, zero-padded to the group's longest, one SeqIO seed per
    group; every 1-D feature is cut back to its example's length afterwards.

    The examples, their order and their other features are unchanged, and each row gets its own
    draws from the group's seed. `mask_fn` must mask rows independently (as `mask_tokens`).
    Features must be scalars or 1-D.

    With `draw_fn`, each example first draws its own random numbers as 1-D features,
    `draw_fn(features, seed=..., **kwargs)` with SeqIO's per-example seed (as `dynamic_masking`
    would give its `mask_fn`), and `mask_fn(rows, lengths=..., **kwargs)` gets no seed: the
    rows are then exactly those of the per-example masker whose draws these are, its random
    streams kept, and only the per-example draws are not grouped.

    Example (group_size 2): [{"input_ids": [2, 9, 3]}, {"input_ids": [2, 8, 7, 3]}]
      -> one call on input_ids [[2, 9, 3, 0], [2, 8, 7, 3]], lengths [3, 4]
      -> [{"input_ids": [2, 4, 3], "masked_positions": [1, 0, ...], ...},
          {"input_ids": [2, 8, 4, 3], "masked_positions": [2, 0, ...], ...}]
    """
    if group_size < 1:
        raise ValueError(f"group_size={group_size}, expected >= 1")
    if draw_fn is not None:
        dataset = dynamic_masking(dataset, mask_fn=draw_fn, **kwargs)
    bad = {
        k: spec.shape
        for k, spec in dataset.element_spec.items()
        if spec.shape.rank is None or spec.shape.rank > 1
    }
    if bad:
        raise ValueError(f"grouped masking takes scalar or 1-D features; got shapes {bad}")
    sequences = [k for k, spec in dataset.element_spec.items() if spec.shape.rank == 1]

    @tf.autograph.experimental.do_not_convert
    def mask_group(rows, seed=None):
        # A ragged batch keeps each row's own lengths: padded here and cut back here, with
        # no per-row map before or after the group.
        # (A feature of one static length for every row comes dense.)
        lengths = {
            k: rows[k].row_lengths() for k in sequences if isinstance(rows[k], tf.RaggedTensor)
        }
        rows = {k: v.to_tensor() if k in lengths else v for k, v in rows.items()}
        ids = rows["input_ids"]
        num_tokens = lengths.get("input_ids", tf.fill(tf.shape(ids)[:1], tf.shape(ids)[1]))
        seeded = {} if draw_fn is not None else {"seed": seed}
        out = mask_fn(rows, lengths=tf.cast(num_tokens, tf.int32), **seeded, **kwargs)
        for k, row_lengths in lengths.items():
            if k in out:
                out[k] = tf.RaggedTensor.from_tensor(out[k], lengths=row_lengths)
        return out

    grouped = dataset.ragged_batch(group_size)
    if draw_fn is None:
        masked = seqio.map_over_dataset(num_seeds=1)(mask_group)(grouped)
    else:
        masked = grouped.map(mask_group, num_parallel_calls=tf.data.AUTOTUNE)
    return masked.unbatch()


def static_masking(
    dataset: tf.data.Dataset, *, mask_fn: MaskFn, dupe_factor: int, **kwargs
) -> tf.data.Dataset:
    """Emits `dupe_factor` masked copies of each example, each with its own seed.

    BERT's `dupe_factor`: place it before SeqIO's cache so the copies are materialised and
    every epoch sees the same masks. Example: dupe_factor 3 turns [d0, d1] into
    [d0 mask a, d0 mask b, d0 mask c, d1 mask d, d1 mask e, d1 mask f].
    """
    if dupe_factor < 1:
        raise ValueError(f"dupe_factor={dupe_factor}, expected >= 1")

    @seqio.map_over_dataset(num_seeds=1)
    @tf.autograph.experimental.do_not_convert
    def _copies(features, seed):
        seeds = tf.random.experimental.stateless_split(seed, dupe_factor)
        copies = [mask_fn(features, seed=seeds[d], **kwargs) for d in range(dupe_factor)]
        return {k: tf.stack([c[k] for c in copies]) for k in copies[0]}

    return _copies(dataset).unbatch()


def bert_dynamic_mlm(dataset: tf.data.Dataset, *, spec: MlmSpec) -> tf.data.Dataset:
    """Token-level MLM with a fresh mask every time an example is seen (RoBERTa, ELECTRA),
    `GROUP_SIZE` examples per call (`grouped_dynamic_masking`)."""
    return grouped_dynamic_masking(dataset, mask_fn=mask_tokens, spec=spec)


def bert_static_mlm(
    dataset: tf.data.Dataset, *, spec: MlmSpec, dupe_factor: int = 10
) -> tf.data.Dataset:
    """Token-level MLM, `dupe_factor` fixed masks per example (BERT's offline data)."""
    return static_masking(dataset, mask_fn=mask_tokens, dupe_factor=dupe_factor, spec=spec)


def require_features(features: Features, keys: Sequence[str], *, where: str) -> None:
    """Raises ValueError naming the missing feature keys."""
    missing = [k for k in keys if k not in features]
    if missing:
        raise ValueError(f"{where}: missing features {missing}; got {sorted(features)}")
