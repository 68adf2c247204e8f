"""Encoder MLM examples, padded or packed into rows of L tokens and P gathered predictions.

SeqIO's `EncoderFeatureConverter` gives MLM targets densely at every position; lmsuite's encoder
objectives (BERT, WWM, SpanBERT, ELECTRA, ERNIE, ...) read P gathered predictions, with the
span features, labels and per-token features some of them add. `EncoderMlmFeatureConverter`
keeps those. With `pack=True` it packs with SeqIO's packer, which pays where examples are short
(document tails, ERNIE passages), not on corpora whose chunks already fill L. Examples with a
sentence-level label (NSP, SOP, StructBERT, UniLM's mode), per-token labels or per-token
features do not pack (one label per row, or per row position).

Task lengths {"input_ids": L, "masked_ids": P}; model features:
  input_ids, token_type_ids, input_mask   int32 [L]  (input_mask = 1 on real tokens)
  masked_positions, masked_ids            int32 [P], masked_weights float32 [P]
  each of `span_features`                 int32 [P]  (SpanBERT's span_left_positions, ...)
  each of `labels`                        int32 []   (next_sentence_label, unilm_mode, ...)
  each of `token_labels`                  int32 [L]  (a class per token, -1: none; padding -1)
  each of `sequence_features`             int32 [L]  (PMLM's position_ids, pmlm_step, ...)

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
"""

from collections.abc import Sequence

import seqio
import tensorflow as tf

from lmsuite.data import mixtures
from lmsuite.data.feature_converters.padding import Spec, check_fits, encoder_inputs, pad


class EncoderMlmFeatureConverter(seqio.FeatureConverter):
    """Pads, or with `pack=True` packs, encoder MLM examples (see the module docstring)."""

    TASK_FEATURES = {"input_ids": Spec(dtype=tf.int32), "masked_ids": Spec(dtype=tf.int32)}
    MODEL_FEATURES = {
        "input_ids": Spec(dtype=tf.int32),
        "token_type_ids": Spec(dtype=tf.int32),
        "input_mask": Spec(dtype=tf.int32),
        "masked_positions": Spec(dtype=tf.int32),
        "masked_ids": Spec(dtype=tf.int32),
        "masked_weights": Spec(dtype=tf.float32),
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
        # shapes (`padding`; the input CPU saved: benchmarks/RESULTS.md).
        kwargs.setdefault("apply_length_check", False)
        super().__init__(pack=pack, **kwargs)
        self._labels, self._span_features = tuple(labels), tuple(span_features)
        self._token_labels = tuple(token_labels)
        if mixtures.TASK_IDS in self._span_features:  # its length comes with the task lengths
            self.TASK_FEATURES = {**type(self).TASK_FEATURES, mixtures.TASK_IDS: Spec(tf.int32)}
        self._sequence_features = tuple(sequence_features)
        self.MODEL_FEATURES = {
            **type(self).MODEL_FEATURES,
            **{name: Spec(dtype=tf.int32) for name in self._sequence_features},
            **{name: Spec(dtype=tf.int32) for name in self._span_features},
            **{name: Spec(dtype=tf.int32, rank=0) for name in self._labels},
            **{name: Spec(dtype=tf.int32) for name in self._token_labels},
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
            with tf.control_dependencies([check_fits(ex, limits, "an MLM example")]):
                ex = {name: tf.identity(value) for name, value in ex.items()}
            out = encoder_inputs(ex, length)
            out["masked_positions"] = pad(ex["masked_positions"], predictions, tf.int32)
            out["masked_ids"] = pad(ex["masked_ids"], predictions, tf.int32)
            out["masked_weights"] = pad(ex["masked_weights"], predictions, tf.float32)
            for name in self._span_features:
                out[name] = pad(ex[name], predictions, tf.int32)
            for name in self._sequence_features:
                out[name] = pad(ex[name], length, tf.int32)
            for name in self._labels:
                out[name] = tf.cast(ex[name], tf.int32)
            for name in self._token_labels:  # -1 (no label) on the padding too
                out[name] = pad(tf.cast(ex[name], tf.int32) + 1, length, tf.int32) - 1
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
