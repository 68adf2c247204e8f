"""Rows of streams, XLNet's permutation LM and Transformer-XL's LM: checked and cast, never padded.

Their examples are already exactly L long and come as interleaved rows, so that row i of step
t + 1 continues row i of step t and the model carries its memory across steps
(`preprocessors.xlnet.stream_task`). These converters only check and cast; `stream_row` and
`stream_step` pass through for the trainer (a row's memory is reset where its stream starts,
stream_step 0) and for the tests of row continuity. They never pack: their features index one
sequence.

PermutationLmFeatureConverter, task lengths {"input_k": L, "target": P}: input_k, seg_id int32
  [L]; input_q float32 [L]; perm_mask float32 [L, L]; target_mapping float32 [P, L]; target
  int32 [P]; target_mask float32 [P].
StreamLmFeatureConverter, task lengths {"inputs": L, "targets": L}: inputs, targets int32 [L];
  target_weights float32 [L] (ones: stream rows have no padding).
Both add stream_row and stream_step int32 [].
"""

import seqio
import tensorflow as tf

from lmsuite.data.feature_converters.padding import Spec, refuse_packing


class PermutationLmFeatureConverter(seqio.FeatureConverter):
    """Checks and casts XLNet permutation-LM examples (see `preprocessors/xlnet.py`).

    `stream_row` and `stream_step` pass through: the trainer resets a row's memory where its
    stream starts (stream_step 0), and tests check row continuity with them.
    """

    TASK_FEATURES = {"input_k": Spec(dtype=tf.int32), "target": Spec(dtype=tf.int32)}
    MODEL_FEATURES = {
        "input_k": Spec(dtype=tf.int32),
        "seg_id": Spec(dtype=tf.int32),
        "input_q": Spec(dtype=tf.float32),
        "perm_mask": Spec(dtype=tf.float32, rank=2),
        "target_mapping": Spec(dtype=tf.float32, rank=2),
        "target": Spec(dtype=tf.int32),
        "target_mask": Spec(dtype=tf.float32),
        "stream_row": Spec(dtype=tf.int32, rank=0),
        "stream_step": Spec(dtype=tf.int32, rank=0),
    }
    PACKING_FEATURE_DTYPES = None

    def __init__(self, *, pack: bool = False, **kwargs):
        refuse_packing(type(self).__name__, pack)
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

    TASK_FEATURES = {"inputs": Spec(dtype=tf.int32), "targets": Spec(dtype=tf.int32)}
    MODEL_FEATURES = {
        "inputs": Spec(dtype=tf.int32),
        "targets": Spec(dtype=tf.int32),
        "target_weights": Spec(dtype=tf.float32),
        "stream_row": Spec(dtype=tf.int32, rank=0),
        "stream_step": Spec(dtype=tf.int32, rank=0),
    }
    PACKING_FEATURE_DTYPES = None

    def __init__(self, *, pack: bool = False, **kwargs):
        refuse_packing(type(self).__name__, pack)
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
