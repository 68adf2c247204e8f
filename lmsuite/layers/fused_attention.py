"""Attention that never writes the (B, H, L, M) scores to memory, chosen per backend.

`fused_attention` lowers to one of three programs, picked by `jax.lax.platform_dependent` when
the step is lowered (so an ahead-of-time compile for a TPU slice on a CPU host gets the TPU
program):
  TPU    Pallas splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`): a
         block-sparse flash kernel; the mask's segment ids and causal flag are its inputs, so
         padding, packing and causal order cost no (L, M) array. Under a mesh it runs inside
         `shard_map`, one kernel per batch and head shard. L and M must be multiples of 128
         (its key block is a multiple of the lane width); otherwise the XLA program below.
  GPU    `jax.nn.dot_product_attention(implementation="cudnn")` for bf16/fp16 with K <= 128, a
         multiple of 8, and even L and M under a mask (`gpu_implementation`); else
         implementation=None (XLA). Only offered when this process has a GPU backend: the cuDNN
         path asks the driver for its version while tracing.
  other  `jax.nn.dot_product_attention(implementation="xla")`, the reference.

Queries must already be scaled: every program here uses scale 1.

What the plain path (`attention.MultiHeadAttention`) keeps and `plain_reason` names: attention
dropout (no kernel drops probabilities), an additive bias (T5's relative positions, TUPE's
positional term: splash takes no bias), masks without a segment structure (prefix LM, UniLM's
full masks, DeBERTa's padded queries), a key/value cache, and collecting attention weights.
Each reason is logged once per process.
"""

import functools
import logging

import flax.linen as nn
import jax
import jax.numpy as jnp

from lmsuite import partitioning as P
from lmsuite.layers.masks import MaskLayout

logger = logging.getLogger(__name__)
_logged_reasons: set[str] = set()

SPLASH_LANES = 128  # splash's key blocks are a multiple of this; so must L and M be
IMPLEMENTATIONS = ("plain", "fused", "fused_interpret")


def _log_once(message: str) -> None:
    if message not in _logged_reasons:
        _logged_reasons.add(message)
        logger.warning("%s", message)


def log_plain_once(reason: str) -> None:
    """Logs (once per reason and process) that a fused request runs the plain path."""
    _log_once(f"attention_impl='fused' runs the plain attention path: {reason}")


def plain_reason(
    *, dropout: bool, bias: bool, cache: bool, mask: bool, layout: MaskLayout | None, sow: bool
) -> str:
    """Why attention must take the plain path ("" when it may fuse)."""
    if dropout:
        return "attention dropout is active (no fused kernel drops probabilities)"
    if bias:
        return "an additive attention bias (T5 relative positions, TUPE) is not fused"
    if cache:
        return "cached decoding (a key/value cache) uses the plain path"
    if sow:
        return "attention weights are being collected (mutable 'intermediates')"
    if layout is not None and layout.unfusable:
        return layout.unfusable
    if mask and layout is None:
        return "a dense mask came without its MaskLayout"
    return ""


def fused_attention(q_BLHK, k_BMHK, v_BMHK, layout: MaskLayout | None, *, interpret=False):
    """softmax(q k^T + mask) v without the scores in memory; q already scaled.

    `layout` None means no mask. `interpret` runs the TPU kernel in Pallas' interpret mode on
    every backend (tests on CPU exercise the kernel's own code).
    """
    layout = layout or MaskLayout()
    if q_BLHK.ndim != 4 or k_BMHK.shape != v_BMHK.shape or q_BLHK.shape[-1] != k_BMHK.shape[-1]:
        raise ValueError(
            f"fused attention needs q (B, L, H, K) and k, v (B, M, H, K), got q "
            f"{tuple(q_BLHK.shape)}, k {tuple(k_BMHK.shape)}, v {tuple(v_BMHK.shape)}"
        )
    length, memory = q_BLHK.shape[1], k_BMHK.shape[1]
    if layout.causal and length != memory:
        raise ValueError(f"a causal layout needs L == M, got L={length}, M={memory}")
    splash_fits = length % SPLASH_LANES == 0 and memory % SPLASH_LANES == 0
    splash = functools.partial(_splash, layout=layout, interpret=interpret)
    xla = functools.partial(_dot_product, layout=layout, implementation="xla")
    if interpret:
        if not splash_fits:
            raise ValueError(
                f"interpreted splash needs L and M multiples of 128, got {length}, {memory}"
            )
        return splash(q_BLHK, k_BMHK, v_BMHK)
    if not splash_fits:
        _log_once(
            "attention_impl='fused': on a TPU this attention runs XLA's program, not splash "
            f"(L and M must be multiples of {SPLASH_LANES}, got L={length}, M={memory})"
        )
    branches = dict(tpu=splash if splash_fits else xla, default=xla)
    if jax.default_backend() == "gpu":
        branches["cuda"] = functools.partial(
            _dot_product,
            layout=layout,
            implementation=gpu_implementation(
                q_BLHK, k_BMHK, dense_mask=layout.q_segment_ids_BL is not None
            ),
        )
    return jax.lax.platform_dependent(q_BLHK, k_BMHK, v_BMHK, **branches)


def gpu_implementation(q_BLHK, k_BMHK, *, dense_mask: bool) -> str | None:
    """cuDNN's flash attention where its constraints hold, else XLA (None), logging why once.

    The constraints are those `jax.nn.dot_product_attention` checks while tracing: bf16/fp16, a
    head dim <= 128 (Hopper allows 256) that is a multiple of 8, and, when a dense mask rides
    as cuDNN's bias (`_dot_product` passes one with segment ids), even L and M in training. On
    an H200 a decoder of 29 targets over 128 inputs failed that last check.
    """
    head_dim, length, memory = q_BLHK.shape[-1], q_BLHK.shape[1], k_BMHK.shape[1]
    if q_BLHK.dtype not in (jnp.bfloat16, jnp.float16):
        return None  # float32 on a GPU: XLA's attention, the reference
    if head_dim > 128 or head_dim % 8:
        _log_once(
            f"attention_impl='fused': on a GPU this attention runs XLA's program, not cuDNN "
            f"(the head dim must be <= 128 and a multiple of 8, got {head_dim})"
        )
        return None
    if dense_mask and (length % 2 or memory % 2):
        _log_once(
            f"attention_impl='fused': on a GPU this attention runs XLA's program, not cuDNN "
            f"(with a mask cuDNN needs even L and M, got L={length}, M={memory})"
        )
        return None
    return "cudnn"


def _dot_product(q_BLHK, k_BMHK, v_BMHK, *, layout: MaskLayout, implementation):
    length, memory = q_BLHK.shape[1], k_BMHK.shape[1]
    segments = layout.q_segment_ids_BL is not None
    # Causal order alone is the kernels' own mask type; with segments it joins the dense mask.
    mask_B1LM = layout.dense(length, memory) if segments else None
    return jax.nn.dot_product_attention(
        q_BLHK,
        k_BMHK,
        v_BMHK,
        mask=mask_B1LM,
        is_causal=layout.causal and not segments,
        scale=1.0,
        implementation=implementation,
    )


def _splash(q_BLHK, k_BMHK, v_BMHK, *, layout: MaskLayout, interpret: bool):
    """Splash attention over every example and head; under a mesh, per shard."""
    q_ids_BL, kv_ids_BM = layout.q_segment_ids_BL, layout.kv_segment_ids_BM
    local = functools.partial(_splash_local, causal=layout.causal, interpret=interpret)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return local(q_BLHK, k_BMHK, v_BMHK, q_ids_BL, kv_ids_BM)
    # Length and head dim stay whole on each shard: the kernel needs every key of a query.
    spec_BLHK = nn.logical_to_mesh_axes((P.BATCH, None, P.HEADS, None))
    spec_BL = nn.logical_to_mesh_axes((P.BATCH, None))
    ids_specs = () if q_ids_BL is None else (spec_BL, spec_BL)
    sharded = jax.shard_map(
        lambda q, k, v, *ids: local(q, k, v, *(ids or (None, None))),
        mesh=mesh,
        in_specs=(spec_BLHK,) * 3 + ids_specs,
        out_specs=spec_BLHK,
        check_vma=False,
    )
    ids = () if q_ids_BL is None else (q_ids_BL, kv_ids_BM)
    return sharded(q_BLHK, k_BMHK, v_BMHK, *ids)


def _splash_local(q_BLHK, k_BMHK, v_BMHK, q_ids_BL, kv_ids_BM, *, causal, interpret):
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    _, length, heads, _ = q_BLHK.shape
    memory = k_BMHK.shape[1]
    shape = (length, memory)
    head_mask = splash.CausalMask(shape) if causal else splash.FullMask(shape)
    block_q, block_kv = _block(length), _block(memory)
    blocks = splash.BlockSizes(
        block_q=block_q,
        block_kv=block_kv,
        block_kv_compute=block_kv,
        block_q_dkv=block_q,
        block_kv_dkv=block_kv,
        block_kv_dkv_compute=block_kv,
        block_q_dq=block_q,
        block_kv_dq=block_kv,
    )
    kernel = splash.make_splash_mha(
        splash.MultiHeadMask([head_mask] * heads),
        block_sizes=blocks,
        head_shards=1,
        q_seq_shards=1,
        interpret=interpret,
    )
    heads_first = lambda x_BLHK: jnp.swapaxes(x_BLHK, 1, 2)
    args = [heads_first(x) for x in (q_BLHK, k_BMHK, v_BMHK)]
    if q_ids_BL is not None:
        args.append(splash.SegmentIds(q=q_ids_BL, kv=kv_ids_BM))
    return heads_first(jax.vmap(kernel)(*args))


def _block(length: int) -> int:
    """The largest of 512, 256, 128 dividing `length` (a multiple of 128)."""
    return next(b for b in (512, 256, SPLASH_LANES) if length % b == 0)
