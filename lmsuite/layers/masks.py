"""Boolean attention masks, all broadcastable to (B, 1, L, M): True means "may attend".

Masks combine with `&`. Every builder validates its inputs' ranks, since a wrongly shaped mask
broadcasts silently into nonsense. `MaskLayout` describes the same masks by segment ids and a
causal flag, for fused kernels (`fused_attention.py`).
"""

import jax
import jax.numpy as jnp
from flax import struct


def _check_rank(name: str, x, rank: int):
    if x.ndim != rank:
        raise ValueError(f"{name} must have rank {rank}, got shape {tuple(x.shape)}")


def padding_mask(key_valid_BM) -> jnp.ndarray:
    """Keys that are real tokens: (B, M) {0,1} or bool -> (B, 1, 1, M).

    >>> padding_mask(jnp.array([[1, 1, 0]]))[0, 0, 0]
    Array([ True,  True, False], dtype=bool)
    """
    _check_rank("attention_mask", key_valid_BM, 2)
    return key_valid_BM.astype(bool)[:, None, None, :]


def query_key_padding_mask(valid_BL) -> jnp.ndarray:
    """Pairs whose query and key are both real tokens (DeBERTa's mask): (B, L) -> (B, 1, L, L)."""
    _check_rank("attention_mask", valid_BL, 2)
    v = valid_BL.astype(bool)
    return (v[:, :, None] & v[:, None, :])[:, None]


def causal_mask(length: int) -> jnp.ndarray:
    """Query i sees keys j <= i: -> (1, 1, L, L).

    >>> causal_mask(3)[0, 0].astype(int)
    Array([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=int32)
    """
    return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]


def causal_memory_mask(length: int, memory: int, *, same_length: bool = False) -> jnp.ndarray:
    """Transformer-XL's causal mask over `memory` cached keys then `length` current ones:
    query i (at absolute position memory + i) sees keys j <= memory + i -> (1, 1, L, C + L).

    With `same_length` every query sees the same number of keys (L + C): query i also loses the
    first i keys.

    >>> causal_memory_mask(2, 1)[0, 0].astype(int)
    Array([[1, 1, 0], [1, 1, 1]], dtype=int32)
    >>> causal_memory_mask(2, 1, same_length=True)[0, 0].astype(int)
    Array([[1, 1, 0], [0, 1, 1]], dtype=int32)
    """
    if length < 0 or memory < 0:
        raise ValueError(f"length={length} and memory={memory} must be >= 0")
    i_L1 = jnp.arange(length)[:, None]
    j_1M = jnp.arange(memory + length)[None, :]
    allowed = j_1M <= memory + i_L1
    if same_length:
        allowed = allowed & (j_1M >= i_L1)
    return allowed[None, None]


def prefix_lm_mask(prefix_BL) -> jnp.ndarray:
    """Causal everywhere, bidirectional inside the prefix: (B, L) -> (B, 1, L, L).

    `prefix_BL` is 1 on the prefix (inputs) region; SeqIO's PrefixLMFeatureConverter calls it
    `decoder_causal_attention`.

    >>> prefix_lm_mask(jnp.array([[1, 1, 0]]))[0, 0].astype(int)
    Array([[1, 1, 0], [1, 1, 0], [1, 1, 1]], dtype=int32)
    """
    _check_rank("prefix_mask", prefix_BL, 2)
    p = prefix_BL.astype(bool)
    both_in_prefix = p[:, :, None] & p[:, None, :]
    return causal_mask(p.shape[1]) | both_in_prefix[:, None]


def segment_mask(segment_q_BL, segment_k_BM) -> jnp.ndarray:
    """Packed examples see only their own segment (ids > 0): -> (B, 1, L, M).

    >>> segment_mask(jnp.array([[1, 1, 2]]), jnp.array([[1, 1, 2]]))[0, 0].astype(int)
    Array([[1, 1, 0], [1, 1, 0], [0, 0, 1]], dtype=int32)
    """
    _check_rank("segment_ids", segment_q_BL, 2)
    _check_rank("segment_ids", segment_k_BM, 2)
    same = segment_q_BL[:, :, None] == segment_k_BM[:, None, :]
    real = (segment_q_BL[:, :, None] > 0) & (segment_k_BM[:, None, :] > 0)
    return (same & real)[:, None]


def full_mask(mask_BLM) -> jnp.ndarray:
    """An arbitrary per-example mask (UniLM, permutation LM): (B, L, M) -> (B, 1, L, M)."""
    _check_rank("attention_mask", mask_BLM, 3)
    return mask_BLM.astype(bool)[:, None]


def combine(*masks) -> jnp.ndarray | None:
    """Logical AND of the masks that are not None (None if all are)."""
    out = None
    for m in masks:
        if m is not None:
            out = m if out is None else out & m
    return out


@struct.dataclass
class MaskLayout:
    """A mask's structure, for fused attention kernels that never see a dense (B, 1, L, M) mask.

    Query l may see key m when `q_segment_ids_BL[b, l] == kv_segment_ids_BM[b, m]` (both None:
    every key) and, with `causal`, m <= l. `unfusable` names why a mask has no such structure
    (a prefix-LM or full mask); such a layout routes attention to the plain path.
    """

    q_segment_ids_BL: jax.Array | None = None
    kv_segment_ids_BM: jax.Array | None = None
    causal: bool = struct.field(pytree_node=False, default=False)
    unfusable: str = struct.field(pytree_node=False, default="")

    def dense(self, length: int, memory: int) -> jnp.ndarray | None:
        """The (B or 1, 1, L, M) boolean mask this layout describes (None: no mask)."""
        out = None
        if self.q_segment_ids_BL is not None:
            q_BL, kv_BM = self.q_segment_ids_BL, self.kv_segment_ids_BM
            out = (q_BL[:, :, None] == kv_BM[:, None, :])[:, None]
        if self.causal:
            order = jnp.arange(memory)[None, :] <= jnp.arange(length)[:, None]
            out = combine(out, order[None, None])
        return out


def segment_layout(
    *, key_valid_BM=None, q_segment_ids_BL=None, kv_segment_ids_BM=None, length=None, causal=False
) -> MaskLayout:
    """The layout of `padding_mask(key_valid_BM) & segment_mask(q, kv) [& causal_mask]`.

    Keys that are padding (invalid, or segment id 0) get id -1. Packing's padded queries
    (segment 0) get -1 too, so they see the padded keys instead of nothing: their output
    differs from the plain path's zero vector, and real positions never see them. Without
    segment ids every query gets id 1 (`length` gives L), so padded queries see the real keys,
    as `padding_mask` lets them.

    >>> layout = segment_layout(key_valid_BM=jnp.array([[1, 1, 0]]), length=3)
    >>> layout.q_segment_ids_BL, layout.kv_segment_ids_BM
    (Array([[1, 1, 1]], dtype=int32), Array([[ 1,  1, -1]], dtype=int32))
    """
    if (q_segment_ids_BL is None) != (kv_segment_ids_BM is None):
        raise ValueError(
            "segment_layout needs both q_segment_ids_BL and kv_segment_ids_BM or neither"
        )
    if q_segment_ids_BL is None and key_valid_BM is None:
        return MaskLayout(causal=causal)
    if q_segment_ids_BL is None:
        _check_rank("attention_mask", key_valid_BM, 2)
        if length is None:
            raise ValueError("segment_layout without segment ids needs the query length")
        q_BL = jnp.ones((key_valid_BM.shape[0], length), jnp.int32)
        kv_BM = jnp.where(key_valid_BM.astype(bool), 1, -1).astype(jnp.int32)
        return MaskLayout(q_BL, kv_BM, causal=causal)
    _check_rank("segment_ids", q_segment_ids_BL, 2)
    _check_rank("segment_ids", kv_segment_ids_BM, 2)
    q_BL = jnp.where(q_segment_ids_BL > 0, q_segment_ids_BL, -1).astype(jnp.int32)
    real_BM = kv_segment_ids_BM > 0
    if key_valid_BM is not None:
        _check_rank("attention_mask", key_valid_BM, 2)
        real_BM = real_BM & key_valid_BM.astype(bool)
    kv_BM = jnp.where(real_BM, kv_segment_ids_BM, -1).astype(jnp.int32)
    return MaskLayout(q_BL, kv_BM, causal=causal)


def unfusable_layout(reason: str) -> MaskLayout:
    """A layout saying the mask has no fusable structure, and why."""
    return MaskLayout(unfusable=reason)
