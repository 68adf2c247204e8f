"""Classification examples, `[CLS] A [SEP] (B [SEP])` and an int label, padded into encoder rows.

The probe tasks (`tasks.build_probe_task`) give token ids and one label per example; SeqIO has no
converter that keeps a rank-0 label next to the encoder inputs. One label per row: they never
pack.

Task lengths {"input_ids": L}; model features: input_ids, token_type_ids, input_mask int32 [L];
label int32 [].
"""

import seqio
import tensorflow as tf

from lmsuite.data.feature_converters.padding import Spec, encoder_inputs, refuse_packing


class ClassificationFeatureConverter(seqio.FeatureConverter):
    """Pads `[CLS] A [SEP] (B [SEP])` classification examples and keeps the int `label`."""

    TASK_FEATURES = {"input_ids": Spec(dtype=tf.int32)}
    MODEL_FEATURES = {
        "input_ids": Spec(dtype=tf.int32),
        "token_type_ids": Spec(dtype=tf.int32),
        "input_mask": Spec(dtype=tf.int32),
        "label": Spec(dtype=tf.int32, rank=0),
    }
    PACKING_FEATURE_DTYPES = None

    def __init__(self, *, pack: bool = False, **kwargs):
        refuse_packing(type(self).__name__, pack)
        super().__init__(pack=False, **kwargs)

    def _convert_features(self, ds, task_feature_lengths):
        length = task_feature_lengths["input_ids"]

        def convert(ex):
            return {**encoder_inputs(ex, length), "label": tf.cast(ex["label"], tf.int32)}

        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(self, task_feature_lengths):
        length = task_feature_lengths["input_ids"]
        return {"input_ids": length, "token_type_ids": length, "input_mask": length, "label": 1}
