"""Feature converters SeqIO lacks: encoder MLM, classification probes and XLNet's permutation LM.

Seq2seq and decoder tasks use SeqIO's own converters (`EncDecFeatureConverter`,
`LMFeatureConverter`, `PrefixLMFeatureConverter`, packing with segment ids and positions
included). The converters here do not pack: masked positions, labels and permutation masks all
index one sequence, and BERT-style chunks are already full.

EncoderMlmFeatureConverter, task lengths {"input_ids": L, "masked_ids": P}:
  input_ids, token_type_ids, input_mask   int32 [L]  (input_mask = 1 on real tokens)
  masked_positions, masked_ids            int32 [P], masked_weights float32 [P]
  each of `span_features`                 int32 [P]  (SpanBERT's span_left_positions, ...)
  each of `labels`                        int32 []   (next_sentence_label, unilm_mode, ...)
ClassificationFeatureConverter, task lengths {"input_ids": L}:
  input_ids, token_type_ids, input_mask int32 [L]; label int32 []
PermutationLmFeatureConverter, task lengths {"input_k": L, "target": P} (XLNet examples are
  already exactly L long; only dtypes are fixed): input_k, seg_id int32 [L]; input_q float32 [L];
  perm_mask float32 [L, L]; target_mapping float32 [P, L]; target int32 [P];
  target_mask float32 [P].

Example (EncoderMlm, L=6, P=2, labels=("next_sentence_label",)):
  {"input_ids": [2, 4, 9, 3], "masked_positions": [1, 0], "masked_ids": [7, 0],
   "masked_weights": [1., 0.], "next_sentence_label": 1}
  -> input_ids [2, 4, 9, 3, 0, 0], token_type_ids [0]*6, input_mask [1, 1, 1, 1, 0, 0],
     masked_positions [1, 0], masked_ids [7, 0], masked_weights [1., 0.], next_sentence_label 1
"""

from collections.abc import Mapping, Sequence

import seqio
import tensorflow as tf

_Spec = seqio.FeatureConverter.FeatureSpec


def _pad(x: tf.Tensor, length: int, dtype: tf.DType) -> tf.Tensor:
    x = tf.cast(x, dtype)[:length]
    return tf.pad(x, [[0, length - tf.shape(x)[0]]])


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
    """Pads encoder MLM examples (see module docstring); `pack` must be False."""

    TASK_FEATURES = {"input_ids": _Spec(dtype=tf.int32), "masked_ids": _Spec(dtype=tf.int32)}
    MODEL_FEATURES = {
        "input_ids": _Spec(dtype=tf.int32),
        "token_type_ids": _Spec(dtype=tf.int32),
        "input_mask": _Spec(dtype=tf.int32),
        "masked_positions": _Spec(dtype=tf.int32),
        "masked_ids": _Spec(dtype=tf.int32),
        "masked_weights": _Spec(dtype=tf.float32),
    }
    PACKING_FEATURE_DTYPES = None

    def __init__(
        self,
        *,
        labels: Sequence[str] = (),
        span_features: Sequence[str] = (),
        pack: bool = False,
        **kwargs,
    ):
        _no_packing(type(self).__name__, pack)
        super().__init__(pack=False, **kwargs)
        self._labels, self._span_features = tuple(labels), tuple(span_features)
        self.MODEL_FEATURES = {
            **type(self).MODEL_FEATURES,
            **{name: _Spec(dtype=tf.int32) for name in self._span_features},
            **{name: _Spec(dtype=tf.int32, rank=0) for name in self._labels},
        }

    def _convert_features(self, ds, task_feature_lengths):
        length, predictions = task_feature_lengths["input_ids"], task_feature_lengths["masked_ids"]

        def convert(ex):
            out = _sequence_features(ex, length)
            out["masked_positions"] = _pad(ex["masked_positions"], predictions, tf.int32)
            out["masked_ids"] = _pad(ex["masked_ids"], predictions, tf.int32)
            out["masked_weights"] = _pad(ex["masked_weights"], predictions, tf.float32)
            for name in self._span_features:
                out[name] = _pad(ex[name], predictions, tf.int32)
            for name in self._labels:
                out[name] = tf.cast(ex[name], tf.int32)
            return out

        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(self, task_feature_lengths):
        length, predictions = task_feature_lengths["input_ids"], task_feature_lengths["masked_ids"]
        lengths = {k: length for k in ("input_ids", "token_type_ids", "input_mask")}
        prediction_keys = ("masked_positions", "masked_ids", "masked_weights", *self._span_features)
        lengths.update({k: predictions for k in prediction_keys})
        lengths.update({k: 1 for k in self._labels})  # rank 0: SeqIO skips their length check
        return lengths


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
    """Checks and casts XLNet permutation-LM examples (see `preprocessors/xlnet.py`)."""

    TASK_FEATURES = {"input_k": _Spec(dtype=tf.int32), "target": _Spec(dtype=tf.int32)}
    MODEL_FEATURES = {
        "input_k": _Spec(dtype=tf.int32),
        "seg_id": _Spec(dtype=tf.int32),
        "input_q": _Spec(dtype=tf.float32),
        "perm_mask": _Spec(dtype=tf.float32, rank=2),
        "target_mapping": _Spec(dtype=tf.float32, rank=2),
        "target": _Spec(dtype=tf.int32),
        "target_mask": _Spec(dtype=tf.float32),
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
        }
