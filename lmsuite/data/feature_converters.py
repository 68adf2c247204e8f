"""Feature converters SeqIO lacks: encoder MLM, MASS, probes and XLNet's permutation LM.

Seq2seq and decoder tasks use SeqIO's own converters (`EncDecFeatureConverter`,
`LMFeatureConverter`, `PrefixLMFeatureConverter`, packing with segment ids and positions
included). `EncoderMlmFeatureConverter(pack=True)` packs MLM examples (BERT, WWM, SpanBERT,
ELECTRA, ERNIE) with SeqIO's packer; it pays where examples are short (document tails, ERNIE
passages), not on corpora whose chunks already fill L. Examples with a sentence-level label (NSP,
SOP, StructBERT, UniLM's mode) do not pack (one label per row), nor do classification examples
or XLNet's permutation masks (they index one sequence). MASS has its own seq2seq converter,
`MassFeatureConverter`: its decoder inputs and positions come from the task, where SeqIO's
`EncDecFeatureConverter` would rebuild them from the targets.

EncoderMlmFeatureConverter, task lengths {"input_ids": L, "masked_ids": P}:
  input_ids, token_type_ids, input_mask   int32 [L]  (input_mask = 1 on real tokens)
  masked_positions, masked_ids            int32 [P], masked_weights float32 [P]
  each of `span_features`                 int32 [P]  (SpanBERT's span_left_positions, ...)
  each of `labels`                        int32 []   (next_sentence_label, unilm_mode, ...)
  each of `token_labels`                  int32 [L]  (a class per token, -1: none; padding -1)
  each of `sequence_features`             int32 [L]  (PMLM's position_ids, pmlm_step, ...)
ClassificationFeatureConverter, task lengths {"input_ids": L}:
  input_ids, token_type_ids, input_mask int32 [L]; label int32 []
MassFeatureConverter, task lengths {"inputs": L, "targets": M} (the task's decoder_input_tokens
  and decoder_positions use M):
  encoder_input_tokens                      int32 [L]
  decoder_target_tokens, decoder_input_tokens, decoder_positions, decoder_loss_weights  int32 [M]
  (decoder_loss_weights = 1 on real target tokens; decoder_positions are MASS's source positions,
  packed or not; pack=True adds encoder_segment_ids, encoder_positions int32 [L] and
  decoder_segment_ids int32 [M])
PermutationLmFeatureConverter, task lengths {"input_k": L, "target": P} (XLNet examples are
  already exactly L long; only dtypes are fixed): input_k, seg_id int32 [L]; input_q float32 [L];
  perm_mask float32 [L, L]; target_mapping float32 [P, L]; target int32 [P];
  target_mask float32 [P].

Example (EncoderMlm, L=6, P=2, labels=("next_sentence_label",)):
  {"input_ids": [2, 4, 9, 3], "masked_positions": [1, 0], "masked_ids": [7, 0],
   "masked_weights": [1., 0.], "next_sentence_label": 1}
  -> input_ids [2, 4, 9, 3, 0, 0], token_type_ids [0]*6, input_mask [1, 1, 1, 1, 0, 0],
     masked_positions [1, 0], masked_ids [7, 0], masked_weights [1., 0.], next_sentence_label 1

Packed (EncoderMlm, pack=True, L=8, P=3) adds segment_ids and position_ids int32 [L]; the
predictions of the packed examples are concatenated (padding predictions, weight 0, dropped) and
masked_positions (and span features named `*_positions`) shifted to index the packed row:
  {"input_ids": [2, 4, 3], "masked_positions": [1, 0], "masked_ids": [7, 0],
   "masked_weights": [1., 0.]},
  {"input_ids": [2, 5, 6, 3], "masked_positions": [2, 1], "masked_ids": [8, 9],
   "masked_weights": [1., 1.]}
  -> input_ids [2, 4, 3, 2, 5, 6, 3, 0], segment_ids [1, 1, 1, 2, 2, 2, 2, 0],
     position_ids [0, 1, 2, 0, 1, 2, 3, 0], input_mask [1]*7 + [0], token_type_ids [0]*8,
     masked_positions [1, 5, 4], masked_ids [7, 8, 9], masked_weights [1., 1., 1.]
An example joins a row only if its tokens fit in L and its predictions in P (SeqIO's greedy
packer), so no prediction is ever dropped; an example with more than L tokens or P predictions
fails with an InvalidArgumentError naming the limit. Unpacked, nothing is cut either: a feature
longer than its limit (L for tokens, P for predictions and span features) fails naming the
feature, its limit and its length. (This check replaces SeqIO's per-example length checks,
which `apply_length_check` turns back on.)

Example (Mass, L=8, M=4; E=6 is EOS, 4 is [MASK]):
  {"inputs": [6, 9, 4, 4, 6], "targets": [10, 11], "decoder_input_tokens": [9, 10],
   "decoder_positions": [1, 2]}
  -> encoder_input_tokens [6, 9, 4, 4, 6, 0, 0, 0], decoder_target_tokens [10, 11, 0, 0],
     decoder_input_tokens [9, 10, 0, 0], decoder_positions [1, 2, 0, 0],
     decoder_loss_weights [1, 1, 0, 0]
Packed (Mass, pack=True), with a second example {"inputs": [6, 4, 4], "targets": [12, 6],
"decoder_input_tokens": [6, 12], "decoder_positions": [0, 1]}: each example keeps its own
decoder_positions (they index its source, not the packed row):
  -> encoder_input_tokens [6, 9, 4, 4, 6, 6, 4, 4], encoder_segment_ids [1, 1, 1, 1, 1, 2, 2, 2],
     encoder_positions [0, 1, 2, 3, 4, 0, 1, 2], decoder_target_tokens [10, 11, 12, 6],
     decoder_input_tokens [9, 10, 6, 12], decoder_positions [1, 2, 0, 1],
     decoder_segment_ids [1, 1, 2, 2], decoder_loss_weights [1, 1, 1, 1]
MassFeatureConverter checks the same way, packed or not: a feature longer than L (inputs) or M
(targets, decoder_input_tokens, decoder_positions) fails naming the feature, its limit and its
length, so the packer never cuts and every example lands in some row.
"""

from collections.abc import Mapping, Sequence

import seqio
import tensorflow as tf

from lmsuite.data import mixtures

_Spec = seqio.FeatureConverter.FeatureSpec


def _pad(x: tf.Tensor, length: int, dtype: tf.DType) -> tf.Tensor:
    """`x` cut to `length` and zero-padded to it, with that static shape."""
    x = tf.cast(x, dtype)[:length]
    padded = tf.pad(x, [[0, length - tf.shape(x)[0]]])
    padded.set_shape([length])
    return padded


def _check_fits(ex: Mapping[str, tf.Tensor], limits: Mapping[str, int], what: str) -> tf.Operation:
    """One Assert that every feature in `limits` is at most its limit long (`_pad` would cut
    it); the error lists each feature's length and limit."""
    lengths = {name: tf.size(ex[name]) for name in limits if name in ex}
    fits = tf.reduce_all(tf.stack([n <= limits[name] for name, n in lengths.items()]))
    data = [f"{what}: a feature is longer than its limit; (feature, limit, length):"]
    for name, n in lengths.items():
        data += [f"({name}, {limits[name]},", n, ")"]
    return tf.debugging.Assert(fits, data, summarize=len(data))


def _no_packing(name: str, pack: bool) -> None:
    if pack:
        raise ValueError(f"{name} cannot pack (its features index one sequence); got pack=True")


def _sequence_features(ex: Mapping[str, tf.Tensor], length: int) -> dict[str, tf.Tensor]:
    ids = ex["input_ids"]
    return {
        "input_ids": _pad(ids, length, tf.int32),
        "token_type_ids": _pad(ex.get("token_type_ids", tf.zeros_like(ids)), length, tf.int32),
        "input_mask": _pad(tf.ones_like(ids), length, tf.int32),
    }


class EncoderMlmFeatureConverter(seqio.FeatureConverter):
    """Pads, or with `pack=True` packs, encoder MLM examples (see the module docstring)."""

    TASK_FEATURES = {"input_ids": _Spec(dtype=tf.int32), "masked_ids": _Spec(dtype=tf.int32)}
    MODEL_FEATURES = {
        "input_ids": _Spec(dtype=tf.int32),
        "token_type_ids": _Spec(dtype=tf.int32),
        "input_mask": _Spec(dtype=tf.int32),
        "masked_positions": _Spec(dtype=tf.int32),
        "masked_ids": _Spec(dtype=tf.int32),
        "masked_weights": _Spec(dtype=tf.float32),
    }
    # Added to the model features by SeqIO when pack=True.
    PACKING_FEATURE_DTYPES = {"segment_ids": tf.int32, "position_ids": tf.int32}

    def __init__(
        self,
        *,
        labels: Sequence[str] = (),
        span_features: Sequence[str] = (),
        token_labels: Sequence[str] = (),
        sequence_features: Sequence[str] = (),
        pack: bool = False,
        **kwargs,
    ):
        if pack and (labels or token_labels):
            raise ValueError(
                f"{type(self).__name__} cannot pack examples with sentence-level or token "
                f"labels {(*labels, *token_labels)} (one label per row, or per row position); "
                "got pack=True"
            )
        if pack and sequence_features:
            raise ValueError(
                f"{type(self).__name__} cannot pack examples with per-token features "
                f"{tuple(sequence_features)} (they index one row); got pack=True"
            )
        # SeqIO's length checks are two more maps per example; `_convert_features` checks
        # every padded feature itself instead, in one Assert, and its outputs have static
        # shapes (input CPU per 32 x 128 MLM batch 9.1 -> 8.3 ms, median of 6 rounds).
        kwargs.setdefault("apply_length_check", False)
        super().__init__(pack=pack, **kwargs)
        self._labels, self._span_features = tuple(labels), tuple(span_features)
        self._token_labels = tuple(token_labels)
        if mixtures.TASK_IDS in self._span_features:  # its length comes with the task lengths
            self.TASK_FEATURES = {**type(self).TASK_FEATURES, mixtures.TASK_IDS: _Spec(tf.int32)}
        self._sequence_features = tuple(sequence_features)
        self.MODEL_FEATURES = {
            **type(self).MODEL_FEATURES,
            **{name: _Spec(dtype=tf.int32) for name in self._sequence_features},
            **{name: _Spec(dtype=tf.int32) for name in self._span_features},
            **{name: _Spec(dtype=tf.int32, rank=0) for name in self._labels},
            **{name: _Spec(dtype=tf.int32) for name in self._token_labels},
        }

    def _convert_features(self, ds, task_feature_lengths):
        length, predictions = task_feature_lengths["input_ids"], task_feature_lengths["masked_ids"]
        if self.pack:
            return _pack_mlm(
                ds, length=length, predictions=predictions, span_features=self._span_features
            )

        limits = {"input_ids": length, "token_type_ids": length}
        limits.update({name: length for name in self._token_labels})
        limits.update({name: length for name in self._sequence_features})
        prediction_keys = ("masked_positions", "masked_ids", "masked_weights")
        limits.update({name: predictions for name in (*prediction_keys, *self._span_features)})

        def convert(ex):
            with tf.control_dependencies([_check_fits(ex, limits, "an MLM example")]):
                ex = {name: tf.identity(value) for name, value in ex.items()}
            out = _sequence_features(ex, length)
            out["masked_positions"] = _pad(ex["masked_positions"], predictions, tf.int32)
            out["masked_ids"] = _pad(ex["masked_ids"], predictions, tf.int32)
            out["masked_weights"] = _pad(ex["masked_weights"], predictions, tf.float32)
            for name in self._span_features:
                out[name] = _pad(ex[name], predictions, tf.int32)
            for name in self._sequence_features:
                out[name] = _pad(ex[name], length, tf.int32)
            for name in self._labels:
                out[name] = tf.cast(ex[name], tf.int32)
            for name in self._token_labels:  # -1 (no label) on the padding too
                out[name] = _pad(tf.cast(ex[name], tf.int32) + 1, length, tf.int32) - 1
            return out

        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(self, task_feature_lengths):
        length, predictions = task_feature_lengths["input_ids"], task_feature_lengths["masked_ids"]
        lengths = {k: length for k in ("input_ids", "token_type_ids", "input_mask")}
        lengths.update({k: length for k in self._sequence_features})
        if self.pack:
            lengths.update({k: length for k in self.PACKING_FEATURE_DTYPES})
        prediction_keys = ("masked_positions", "masked_ids", "masked_weights", *self._span_features)
        lengths.update({k: predictions for k in prediction_keys})
        lengths.update({k: 1 for k in self._labels})  # rank 0: SeqIO skips their length check
        lengths.update({k: length for k in self._token_labels})
        return lengths


def _pack_mlm(ds, *, length: int, predictions: int, span_features: Sequence[str]):
    """Packs MLM examples with `seqio.utils.trim_and_pack_dataset` (see the module docstring).

    SeqIO's packer measures each feature by its count of non-zero entries, appends an example
    only where every feature still fits, and names its outputs `{key}_segment_ids` /
    `{key}_positions`. So before packing: integers are stored + 1 (zero ids, token types and
    offsets are real values), weights are bitcast to int32 (exact; zero weights are dropped
    first), and keys avoid those suffixes. Each example also carries a tag, its index mod L + 1,
    on its tokens and its predictions: unique among the <= L examples of a row, it finds each
    prediction's example even when an earlier example of the row has no predictions.
    """
    span_keys = {name: f"p_span{i}" for i, name in enumerate(span_features)}

    def prepare(index, ex):
        ids = tf.cast(ex["input_ids"], tf.int32)
        keep = tf.not_equal(tf.cast(ex["masked_weights"], tf.float32), 0.0)
        picked = lambda x: tf.boolean_mask(tf.cast(x, tf.int32), keep)
        num_tokens, num_predictions = tf.size(ids), tf.reduce_sum(tf.cast(keep, tf.int32))
        checks = [
            tf.debugging.assert_less_equal(
                num_tokens,
                length,
                message=f"an MLM example has more than L={length} tokens (input_ids)",
            ),
            tf.debugging.assert_less_equal(
                num_predictions,
                predictions,
                message=f"an MLM example has more than P={predictions} weighted predictions",
            ),
        ]
        # Everything below waits for the checks: a mismatched feature would otherwise fail
        # first, in a gather, with an error that names no limit.
        with tf.control_dependencies(checks):
            tag = tf.cast(index % length, tf.int32) + 1
            ids, keep = tf.identity(ids), tf.identity(keep)
            ex = {name: tf.identity(value) for name, value in ex.items()}
        weights = tf.boolean_mask(tf.cast(ex["masked_weights"], tf.float32), keep)
        out = {
            "t_ids": ids + 1,
            "t_types": tf.cast(ex.get("token_type_ids", tf.zeros_like(ids)), tf.int32) + 1,
            "t_tags": tf.fill([num_tokens], tag),
            "p_pos": picked(ex["masked_positions"]) + 1,
            "p_ids": picked(ex["masked_ids"]) + 1,
            "p_wts": tf.bitcast(weights, tf.int32),
            "p_tags": tf.fill([num_predictions], tag),
        }
        out.update({key: picked(ex[name]) + 1 for name, key in span_keys.items()})
        return out

    def finish(ex):
        segment_ids = ex["t_ids_segment_ids"]
        real, real_p = segment_ids > 0, ex["p_tags"] > 0
        # Start of each prediction's example in the row: its tag's first token.
        same = tf.equal(ex["p_tags"][:, None], ex["t_tags"][None, :])
        start = tf.argmax(tf.cast(same, tf.int32), axis=1, output_type=tf.int32)
        unshift = lambda x, mask: tf.where(mask, x - 1, 0)
        out = {
            "input_ids": unshift(ex["t_ids"], real),
            "token_type_ids": unshift(ex["t_types"], real),
            "input_mask": tf.cast(real, tf.int32),
            "segment_ids": segment_ids,
            "position_ids": tf.where(real, ex["t_ids_positions"], 0),
            "masked_positions": unshift(ex["p_pos"] + start, real_p),
            "masked_ids": unshift(ex["p_ids"], real_p),
            "masked_weights": tf.where(real_p, tf.bitcast(ex["p_wts"], tf.float32), 0.0),
        }
        for name, key in span_keys.items():
            shift = start if name.endswith("_positions") else 0
            out[name] = unshift(ex[key] + shift, real_p)
        return out

    ds = ds.enumerate().map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
    lengths = {k: length for k in ("t_ids", "t_types", "t_tags")}
    lengths.update({k: predictions for k in ("p_pos", "p_ids", "p_wts", "p_tags")})
    lengths.update({key: predictions for key in span_keys.values()})
    ds = seqio.utils.trim_and_pack_dataset(ds, lengths)
    return ds.map(finish, num_parallel_calls=tf.data.AUTOTUNE)


class _EncDecWithTaskIds(seqio.EncDecFeatureConverter):
    """`EncDecFeatureConverter` also carrying a mixture's `task_ids` [M] (`with_task_ids`)."""

    def __init__(self, *, pack: bool = True, **kwargs):
        super().__init__(pack=pack, **kwargs)
        # SeqIO's constructor refuses passthrough features with packing, but its packer carries
        # them: `trim_and_pack_dataset` packs every feature of the lengths it is given, and an
        # example joins a row only if all fit, so task ids [M] stay aligned with the targets.
        self._passthrough_features = {mixtures.TASK_IDS: mixtures.TASK_IDS_SPEC}


class _LMWithTaskIds(seqio.LMFeatureConverter):
    """`LMFeatureConverter` that also carries a mixture's `task_ids` [L] (see `with_task_ids`)."""

    def __init__(self, *, pack: bool = True, **kwargs):
        super().__init__(pack=pack, **kwargs)
        self._passthrough_features = {mixtures.TASK_IDS: mixtures.TASK_IDS_SPEC}  # as above

    def get_model_feature_lengths(self, task_feature_lengths):
        lengths = dict(super().get_model_feature_lengths(task_feature_lengths))
        lengths[mixtures.TASK_IDS] = task_feature_lengths[mixtures.TASK_IDS]
        return lengths


def with_task_ids(converter: seqio.FeatureConverter) -> seqio.FeatureConverter:
    """The same conversion, also carrying a mixture's per-token `task_ids` along the tokens the
    loss weighs (`lmsuite.data.mixtures`): the targets of `EncDecFeatureConverter` and
    `LMFeatureConverter` (packed or not), the predictions of `EncoderMlmFeatureConverter` (as
    one more span feature).

    Raises:
      ValueError: for any other converter (its features would lose the alignment).
    """
    kind = type(converter)
    if kind is seqio.EncDecFeatureConverter:
        return _EncDecWithTaskIds(pack=converter.pack)
    if kind is seqio.LMFeatureConverter:
        return _LMWithTaskIds(pack=converter.pack)
    if kind is EncoderMlmFeatureConverter:
        return EncoderMlmFeatureConverter(
            labels=converter._labels,
            span_features=(*converter._span_features, mixtures.TASK_IDS),
            token_labels=converter._token_labels,
            sequence_features=converter._sequence_features,
            pack=converter.pack,
        )
    raise ValueError(
        f"{kind.__name__} cannot carry a mixture's task ids; per-task metrics need "
        "EncDecFeatureConverter, LMFeatureConverter or EncoderMlmFeatureConverter"
    )


class MassFeatureConverter(seqio.FeatureConverter):
    """Pads, or with `pack=True` packs, MASS examples (see the module docstring).

    SeqIO's `EncDecFeatureConverter` would rebuild the decoder inputs by shifting `targets` and
    number the decoder positions from 0; MASS feeds the source tokens left of the fragment and
    their source positions, which `preprocessors.mass` computes, so this converter keeps both.
    """

    # SeqIO requires TASK_FEATURES to match the task lengths' keys one to one; the task's
    # decoder_input_tokens and decoder_positions (length M too) are checked in `_decoder_specs`.
    TASK_FEATURES = {"inputs": _Spec(dtype=tf.int32), "targets": _Spec(dtype=tf.int32)}
    DECODER_TASK_FEATURES = ("decoder_input_tokens", "decoder_positions")
    MODEL_FEATURES = {
        "encoder_input_tokens": _Spec(dtype=tf.int32),
        "decoder_target_tokens": _Spec(dtype=tf.int32),
        "decoder_input_tokens": _Spec(dtype=tf.int32),
        "decoder_loss_weights": _Spec(dtype=tf.int32),
        "decoder_positions": _Spec(dtype=tf.int32),
    }
    # decoder_positions is a model feature (MASS's), so packing adds only these.
    PACKING_FEATURE_DTYPES = {
        "encoder_segment_ids": tf.int32,
        "encoder_positions": tf.int32,
        "decoder_segment_ids": tf.int32,
    }

    def __init__(self, *, pack: bool = False, **kwargs):
        # As EncoderMlmFeatureConverter: `_check_mass` checks every feature in one place.
        kwargs.setdefault("apply_length_check", False)
        super().__init__(pack=pack, **kwargs)

    def _decoder_specs(self, ds) -> None:
        spec = ds.element_spec
        for name in self.DECODER_TASK_FEATURES:
            if name not in spec:
                raise ValueError(
                    f"{type(self).__name__} needs the task feature {name!r} (from "
                    f"preprocessors.mass); the dataset has {sorted(spec)}"
                )
            if spec[name].dtype != tf.int32 or spec[name].shape.rank != 1:
                raise ValueError(
                    f"task feature {name!r} must be int32 of rank 1, got {spec[name].dtype.name}"
                    f" of shape {spec[name].shape}"
                )

    def _convert_features(self, ds, task_feature_lengths):
        self._decoder_specs(ds)
        length, targets = task_feature_lengths["inputs"], task_feature_lengths["targets"]
        if self.pack:
            return _pack_mass(ds, length=length, targets=targets)

        def convert(ex):
            with tf.control_dependencies(_check_mass(ex, length, targets)):
                ex = {name: tf.identity(ex[name]) for name in _MASS_TASK_KEYS}
            return {
                "encoder_input_tokens": _pad(ex["inputs"], length, tf.int32),
                "decoder_target_tokens": _pad(ex["targets"], targets, tf.int32),
                "decoder_input_tokens": _pad(ex["decoder_input_tokens"], targets, tf.int32),
                "decoder_positions": _pad(ex["decoder_positions"], targets, tf.int32),
                "decoder_loss_weights": _pad(tf.ones_like(ex["targets"]), targets, tf.int32),
            }

        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(self, task_feature_lengths):
        length, targets = task_feature_lengths["inputs"], task_feature_lengths["targets"]
        lengths = {name: targets for name in self.MODEL_FEATURES}
        lengths["encoder_input_tokens"] = length
        if self.pack:
            lengths["encoder_segment_ids"] = lengths["encoder_positions"] = length
            lengths["decoder_segment_ids"] = targets
        return lengths


_MASS_TASK_KEYS = ("inputs", "targets", "decoder_input_tokens", "decoder_positions")


def _check_mass(ex, length: int, targets: int) -> list[tf.Operation]:
    """Asserts that a MASS example fits (L for inputs, M for the rest) and that its three
    decoder-side features have one length (the fragment's k)."""
    limits = {"inputs": length, **{name: targets for name in _MASS_TASK_KEYS[1:]}}
    k = tf.size(ex["targets"])
    same = [
        tf.debugging.assert_equal(
            tf.size(ex[name]),
            k,
            message=f"a MASS example's {name} and targets differ in length (decoder features"
            " are one per target token)",
        )
        for name in _MASS_TASK_KEYS[2:]
    ]
    return [_check_fits(ex, limits, "a MASS example"), *same]


def _pack_mass(ds, *, length: int, targets: int):
    """Packs MASS examples with `seqio.utils.trim_and_pack_dataset` (see the module docstring).

    SeqIO's packer measures each feature by its count of non-zero entries and names its outputs
    `{key}_segment_ids` / `{key}_positions`. So values are stored + 1 (decoder position 0, and
    the decoder input at it, are real values) under keys without those suffixes. The four
    decoder-side features have one length per example, so they pack in lockstep and
    `dec_tgt_segment_ids` serves them all.
    """

    def prepare(ex):
        with tf.control_dependencies(_check_mass(ex, length, targets)):
            # Stored + 1 only after the checks: the packer would otherwise cut first.
            return {
                "enc": tf.identity(ex["inputs"]) + 1,
                "dec_tgt": tf.identity(ex["targets"]) + 1,
                "dec_in": tf.identity(ex["decoder_input_tokens"]) + 1,
                "dec_pos": tf.identity(ex["decoder_positions"]) + 1,
            }

    def finish(ex):
        encoder_segments, decoder_segments = ex["enc_segment_ids"], ex["dec_tgt_segment_ids"]
        real_e, real_d = encoder_segments > 0, decoder_segments > 0
        unshift = lambda x, real: tf.where(real, x - 1, 0)
        return {
            "encoder_input_tokens": unshift(ex["enc"], real_e),
            "encoder_segment_ids": encoder_segments,
            "encoder_positions": tf.where(real_e, ex["enc_positions"], 0),
            "decoder_target_tokens": unshift(ex["dec_tgt"], real_d),
            "decoder_input_tokens": unshift(ex["dec_in"], real_d),
            "decoder_positions": unshift(ex["dec_pos"], real_d),
            "decoder_segment_ids": decoder_segments,
            "decoder_loss_weights": tf.cast(real_d, tf.int32),
        }

    ds = ds.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
    lengths = {"enc": length, **{key: targets for key in ("dec_tgt", "dec_in", "dec_pos")}}
    ds = seqio.utils.trim_and_pack_dataset(ds, lengths)
    return ds.map(finish, num_parallel_calls=tf.data.AUTOTUNE)


class ClassificationFeatureConverter(seqio.FeatureConverter):
    """Pads `[CLS] A [SEP] (B [SEP])` classification examples and keeps the int `label`."""

    TASK_FEATURES = {"input_ids": _Spec(dtype=tf.int32)}
    MODEL_FEATURES = {
        "input_ids": _Spec(dtype=tf.int32),
        "token_type_ids": _Spec(dtype=tf.int32),
        "input_mask": _Spec(dtype=tf.int32),
        "label": _Spec(dtype=tf.int32, rank=0),
    }
    PACKING_FEATURE_DTYPES = None

    def __init__(self, *, pack: bool = False, **kwargs):
        _no_packing(type(self).__name__, pack)
        super().__init__(pack=False, **kwargs)

    def _convert_features(self, ds, task_feature_lengths):
        length = task_feature_lengths["input_ids"]

        def convert(ex):
            return {**_sequence_features(ex, length), "label": tf.cast(ex["label"], tf.int32)}

        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(self, task_feature_lengths):
        length = task_feature_lengths["input_ids"]
        return {"input_ids": length, "token_type_ids": length, "input_mask": length, "label": 1}


class PermutationLmFeatureConverter(seqio.FeatureConverter):
    """Checks and casts XLNet permutation-LM examples (see `preprocessors/xlnet.py`).

    `stream_row` and `stream_step` pass through: the trainer resets a row's memory where its
    stream starts (stream_step 0), and tests check row continuity with them.
    """

    TASK_FEATURES = {"input_k": _Spec(dtype=tf.int32), "target": _Spec(dtype=tf.int32)}
    MODEL_FEATURES = {
        "input_k": _Spec(dtype=tf.int32),
        "seg_id": _Spec(dtype=tf.int32),
        "input_q": _Spec(dtype=tf.float32),
        "perm_mask": _Spec(dtype=tf.float32, rank=2),
        "target_mapping": _Spec(dtype=tf.float32, rank=2),
        "target": _Spec(dtype=tf.int32),
        "target_mask": _Spec(dtype=tf.float32),
        "stream_row": _Spec(dtype=tf.int32, rank=0),
        "stream_step": _Spec(dtype=tf.int32, rank=0),
    }
    PACKING_FEATURE_DTYPES = None

    def __init__(self, *, pack: bool = False, **kwargs):
        _no_packing(type(self).__name__, pack)
        super().__init__(pack=False, **kwargs)

    def _convert_features(self, ds, task_feature_lengths):
        del task_feature_lengths  # XLNet examples have exact lengths; the checks enforce them.

        def convert(ex):
            return {k: tf.cast(ex[k], spec.dtype) for k, spec in self.MODEL_FEATURES.items()}

        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(self, task_feature_lengths):
        length, predictions = task_feature_lengths["input_k"], task_feature_lengths["target"]
        return {
            "input_k": length,
            "seg_id": length,
            "input_q": length,
            "perm_mask": length,
            "target_mapping": predictions,
            "target": predictions,
            "target_mask": predictions,
            "stream_row": 1,  # rank 0: SeqIO skips their length check
            "stream_step": 1,
        }


class StreamLmFeatureConverter(seqio.FeatureConverter):
    """Checks and casts Transformer-XL stream-LM examples (see `preprocessors/stream_lm.py`);
    adds `target_weights` (ones: stream rows have no padding). `stream_row` and `stream_step`
    pass through, as `PermutationLmFeatureConverter`'s.
    """

    TASK_FEATURES = {"inputs": _Spec(dtype=tf.int32), "targets": _Spec(dtype=tf.int32)}
    MODEL_FEATURES = {
        "inputs": _Spec(dtype=tf.int32),
        "targets": _Spec(dtype=tf.int32),
        "target_weights": _Spec(dtype=tf.float32),
        "stream_row": _Spec(dtype=tf.int32, rank=0),
        "stream_step": _Spec(dtype=tf.int32, rank=0),
    }
    PACKING_FEATURE_DTYPES = None

    def __init__(self, *, pack: bool = False, **kwargs):
        _no_packing(type(self).__name__, pack)
        super().__init__(pack=False, **kwargs)

    def _convert_features(self, ds, task_feature_lengths):
        del task_feature_lengths  # stream examples have exact lengths; the checks enforce them

        def convert(ex):
            out = {k: tf.cast(ex[k], self.MODEL_FEATURES[k].dtype) for k in ex if k != "id"}
            out = {k: out[k] for k in ("inputs", "targets", "stream_row", "stream_step")}
            return {**out, "target_weights": tf.ones_like(out["targets"], tf.float32)}

        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(self, task_feature_lengths):
        length = task_feature_lengths["targets"]
        return {
            "inputs": length,
            "targets": length,
            "target_weights": length,
            "stream_row": 1,  # rank 0: SeqIO skips their length check
            "stream_step": 1,
        }
