"""MASS examples, padded or packed into encoder-decoder rows that keep MASS's decoder side.

MASS's decoder reads the source tokens left of its fragment at their source positions, which the
task carries (`preprocessors.mass`) and SeqIO's `EncDecFeatureConverter` would rebuild from the
targets; `MassFeatureConverter` keeps them.

Task lengths {"inputs": L, "targets": M} (the task's decoder_input_tokens and decoder_positions
use M too); model features:
  encoder_input_tokens                      int32 [L]
  decoder_target_tokens, decoder_input_tokens, decoder_positions, decoder_loss_weights  int32 [M]
  (decoder_loss_weights = 1 on real target tokens; decoder_positions are MASS's source positions,
  packed or not; pack=True adds encoder_segment_ids, encoder_positions int32 [L] and
  decoder_segment_ids int32 [M])

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

import seqio
import tensorflow as tf

from lmsuite.data.feature_converters.padding import Spec, check_fits, pad


class MassFeatureConverter(seqio.FeatureConverter):
    """Pads, or with `pack=True` packs, MASS examples (see the module docstring).

    SeqIO's `EncDecFeatureConverter` would rebuild the decoder inputs by shifting `targets` and
    number the decoder positions from 0; MASS feeds the source tokens left of the fragment and
    their source positions, which `preprocessors.mass` computes, so this converter keeps both.
    """

    # SeqIO requires TASK_FEATURES to match the task lengths' keys one to one; the task's
    # decoder_input_tokens and decoder_positions (length M too) are checked in `_decoder_specs`.
    TASK_FEATURES = {"inputs": Spec(dtype=tf.int32), "targets": Spec(dtype=tf.int32)}
    DECODER_TASK_FEATURES = ("decoder_input_tokens", "decoder_positions")
    MODEL_FEATURES = {
        "encoder_input_tokens": Spec(dtype=tf.int32),
        "decoder_target_tokens": Spec(dtype=tf.int32),
        "decoder_input_tokens": Spec(dtype=tf.int32),
        "decoder_loss_weights": Spec(dtype=tf.int32),
        "decoder_positions": Spec(dtype=tf.int32),
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
                "encoder_input_tokens": pad(ex["inputs"], length, tf.int32),
                "decoder_target_tokens": pad(ex["targets"], targets, tf.int32),
                "decoder_input_tokens": pad(ex["decoder_input_tokens"], targets, tf.int32),
                "decoder_positions": pad(ex["decoder_positions"], targets, tf.int32),
                "decoder_loss_weights": pad(tf.ones_like(ex["targets"]), targets, tf.int32),
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
    return [check_fits(ex, limits, "a MASS example"), *same]


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
