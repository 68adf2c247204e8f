"""How lmsuite's converters fill a row without packing: each feature padded to its static length
after one check that it fits, so nothing is ever cut.

SeqIO's per-example length checks are two more maps per example; lmsuite's converters turn them
off (`apply_length_check=False`) and check every feature they pad in one Assert instead, naming
each feature, its limit and its length (benchmarks/RESULTS.md: the input CPU this saves). A
converter whose features index one sequence refuses to pack (`refuse_packing`).
"""

from collections.abc import Mapping

import seqio
import tensorflow as tf

Spec = seqio.FeatureConverter.FeatureSpec


def pad(x: tf.Tensor, length: int, dtype: tf.DType) -> tf.Tensor:
    """`x` cut to `length` and zero-padded to it, with that static shape."""
    x = tf.cast(x, dtype)[:length]
    padded = tf.pad(x, [[0, length - tf.shape(x)[0]]])
    padded.set_shape([length])
    return padded


def check_fits(ex: Mapping[str, tf.Tensor], limits: Mapping[str, int], what: str) -> tf.Operation:
    """One Assert that every feature in `limits` is at most its limit long (`pad` would cut
    it); the error lists each feature's length and limit."""
    lengths = {name: tf.size(ex[name]) for name in limits if name in ex}
    fits = tf.reduce_all(tf.stack([n <= limits[name] for name, n in lengths.items()]))
    data = [f"{what}: a feature is longer than its limit; (feature, limit, length):"]
    for name, n in lengths.items():
        data += [f"({name}, {limits[name]},", n, ")"]
    return tf.debugging.Assert(fits, data, summarize=len(data))


def refuse_packing(name: str, pack: bool) -> None:
    if pack:
        raise ValueError(f"{name} cannot pack (its features index one sequence); got pack=True")


def encoder_inputs(ex: Mapping[str, tf.Tensor], length: int) -> dict[str, tf.Tensor]:
    """An encoder row's input_ids, token_type_ids (0 where the example has none) and input_mask
    (1 on real tokens), each padded to `length`."""
    ids = ex["input_ids"]
    return {
        "input_ids": pad(ids, length, tf.int32),
        "token_type_ids": pad(ex.get("token_type_ids", tf.zeros_like(ids)), length, tf.int32),
        "input_mask": pad(tf.ones_like(ids), length, tf.int32),
    }
