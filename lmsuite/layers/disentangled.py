"""DeBERTa's disentangled attention (He et al. 2021): content and relative position apart.

Each layer scores a query i against a key j as

    (q_i . k_j  +  q_i . pk[d(i, j)]  +  k_j . pq[d(i, j)]) / sqrt(K * (1 + n))
      content      content->position      position->content
                     ("c2p")                ("p2c")

where pk / pq are a shared table of relative-position embeddings projected by this layer
(`pos_key` / `pos_query`, or the content `key` / `query` with share_att_key), d(i, j) is the
row for the clamped (v1) or log-bucketed (v2/v3) distance i - j, and n counts the enabled
position terms. The stack holds the table once (`RelativeEmbeddings`) and hands it, with the
(L, L) row index, to every layer.
"""

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lmsuite import partitioning as P
from lmsuite.layers.attention import attention_scores
from lmsuite.layers.dense import DenseGeneral, default_kernel_init
from lmsuite.layers.norm import make_norm

# The modules take the model's `ModelConfig` whole; it is typed loosely here because layers do
# not import models (the import direction is models -> layers).
Config = Any


def log_bucket_position(relative, *, num_buckets: int, max_position: int) -> np.ndarray:
    """DeBERTa-v2's log buckets of signed distances: exact below num_buckets // 2, then log.

    With m = num_buckets // 2, a distance d with |d| <= m stays d; farther ones become
    sign(d) * (m + ceil(log(|d| / m) / log((max_position - 1) / m) * (m - 1))), so
    |d| = max_position - 1 lands on 2m - 1 and farther distances keep growing slowly (the
    caller clamps them). Float32 arithmetic as in the reference, so bucket edges agree.

    >>> log_bucket_position(np.array([-9, -4, 0, 3, 5, 9, 39, 100]), num_buckets=8,
    ...                     max_position=40)
    array([-6, -4,  0,  3,  5,  6,  7,  9])
    """
    rel = np.asarray(relative, dtype=np.int64)
    mid = num_buckets // 2
    abs_pos = np.where((rel < mid) & (rel > -mid), mid - 1, np.abs(rel))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.log(abs_pos.astype(np.float32) / np.float32(mid)) / np.log(
            np.float32((max_position - 1) / mid)
        )
        log_pos = np.ceil(ratio * np.float32(mid - 1)) + np.float32(mid)
    far = abs_pos > mid
    if not np.all(np.isfinite(log_pos[far])):
        raise ValueError(
            f"log buckets are undefined for distances beyond {mid} with "
            f"max_position={max_position} and num_buckets={num_buckets}: need max_position - 1 "
            f"!= num_buckets // 2"
        )
    return np.where(far, np.sign(rel) * np.where(far, log_pos, 0).astype(np.int64), rel)


def max_relative_positions(config: Config) -> int:
    """k: distances beyond it share the table's edge rows (-1 in the config means max_length)."""
    k = config.deberta.max_relative_positions
    return k if k > 0 else config.max_length


def table_span(*, max_relative_positions: int, position_buckets: int) -> int:
    """Half the relative table's rows: position_buckets with log buckets (> 0), else k."""
    return position_buckets if position_buckets > 0 else max_relative_positions


def relative_index(
    length: int, *, max_relative_positions: int, position_buckets: int
) -> tuple[int, int, np.ndarray]:
    """The table rows [lo, hi) that a length-L sequence uses, and index_LM into those rows.

    Row of the full (2 * span)-row table for query i, key j: clip(b(i - j) + span, 0,
    2 * span - 1), b the identity (position_buckets=-1) or `log_bucket_position`. Only the rows
    in use are returned (without buckets, 2 * min(L, k) - 1 of them), so short sequences
    project a short table.

    >>> lo, hi, index = relative_index(3, max_relative_positions=40, position_buckets=-1)
    >>> lo, hi, index.tolist()
    (38, 43, [[2, 1, 0], [3, 2, 1], [4, 3, 2]])
    """
    span = table_span(
        max_relative_positions=max_relative_positions, position_buckets=position_buckets
    )
    rel_LM = np.arange(length)[:, None] - np.arange(length)[None, :]
    if position_buckets > 0:
        rel_LM = log_bucket_position(
            rel_LM, num_buckets=position_buckets, max_position=max_relative_positions
        )
    full_LM = np.clip(rel_LM + span, 0, 2 * span - 1)
    lo, hi = int(full_LM.min()), int(full_LM.max()) + 1
    return lo, hi, (full_LM - lo).astype(np.int32)


class RelativeEmbeddings(nn.Module):
    """The stack's relative-position table, called once per forward pass.

    Parameter `embedding` (2 * span, D), and `norm` with config.deberta.norm_rel_embeddings
    (v2/v3's norm_rel_ebd="layer_norm"). Returns the attention kwargs of every layer:
    `relative_RD` (the rows in use, normalised) and `relative_index_LM` (L, L) into them; an
    empty dict without relative attention. Distances come from positions 0..L-1, as in the
    reference: `position_ids_BL` that restart per packed example give the same differences
    inside each example, and pairs across examples are masked anyway.
    """

    config: Config

    @nn.compact
    def __call__(self, length: int, *, position_ids_BL=None) -> dict:
        cfg = self.config
        if not cfg.deberta.relative_attention:
            return {}
        sizes = dict(
            max_relative_positions=max_relative_positions(cfg),
            position_buckets=cfg.deberta.position_buckets,
        )
        table_RD = self.param(
            "embedding",
            nn.with_logical_partitioning(default_kernel_init(cfg.init_stddev), (P.TABLE, P.EMBED)),
            (2 * table_span(**sizes), cfg.d_model),
            jnp.float32,
        )
        lo, hi, index_LM = relative_index(length, **sizes)
        table_RD = jnp.asarray(table_RD, cfg.compute_dtype)
        if cfg.deberta.norm_rel_embeddings:
            norm = make_norm(cfg.norm_type, eps=cfg.norm_eps, dtype=cfg.compute_dtype, name="norm")
            table_RD = norm(table_RD)
        return {"relative_RD": table_RD[lo:hi], "relative_index_LM": jnp.asarray(index_LM)}


def fill_softmax(logits_BHLM, mask_B1LM):
    """Softmax over M after replacing masked logits by the float32 minimum, as HF's DeBERTa.

    Rows with some visible key equal `masked_softmax`'s. A query whose keys are all masked (a
    padded query under the query-key mask) gets a uniform row over all M keys rather than
    zeros: HF 5.x dropped the original XSoftmax's zeroing, and matching it keeps converted
    models equal to HF at padded positions too. No loss ever reads those positions.

    >>> fill_softmax(jnp.zeros((1, 1, 1, 2)), jnp.array([[[[False, False]]]]))[0, 0, 0]
    Array([0.5, 0.5], dtype=float32)
    """
    logits_BHLM = logits_BHLM.astype(jnp.float32)
    if mask_B1LM is not None:
        logits_BHLM = jnp.where(mask_B1LM, logits_BHLM, jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(logits_BHLM, axis=-1)


class DisentangledAttention(nn.Module):
    """x_BLD -> x_BLD self-attention with DeBERTa's c2p / p2c relative-position scores.

    Submodules: `query`, `key`, `value` (D -> H, K), `out` (H, K -> D), and unless
    config.deberta.share_att_key, `pos_key` (c2p) and `pos_query` (p2c). Keys, content or
    positional, carry a bias iff config.use_key_bias: v1 (`in_proj` without bias plus
    q_bias / v_bias, `pos_proj` without bias) sets it False, v2/v3 True. Called as
    MultiHeadAttention is, plus the `RelativeEmbeddings` outputs as keyword arguments.
    """

    config: Config

    @nn.compact
    def __call__(
        self,
        x_BLD,
        kv_BMD,
        *,
        mask=None,
        bias_BHLM=None,
        deterministic: bool = True,
        relative_RD=None,
        relative_index_LM=None,
    ):
        cfg = self.config
        if kv_BMD.shape != x_BLD.shape:
            raise ValueError(
                f"disentangled attention is self-attention: keys {tuple(kv_BMD.shape)} must "
                f"have the queries' shape {tuple(x_BLD.shape)}"
            )
        dtype = cfg.compute_dtype
        kw = dict(kernel_init=default_kernel_init(cfg.init_stddev), dtype=dtype)
        proj = lambda name, bias: DenseGeneral(
            (cfg.num_heads, cfg.head_width),
            (P.EMBED,),
            (P.HEADS, P.KV),
            use_bias=bias,
            name=name,
            **kw,
        )
        key_bias = cfg.use_bias and cfg.use_key_bias
        query, key = proj("query", cfg.use_bias), proj("key", key_bias)
        types = cfg.deberta.pos_att_type
        scale = jnp.asarray(math.sqrt(cfg.head_width * (1 + len(types))), dtype)
        q_BLHK = query(x_BLD) / scale
        k_BMHK = key(kv_BMD)
        v_BMHK = proj("value", cfg.use_bias)(kv_BMD)
        f32 = cfg.float32_scores
        logits_BHLM = attention_scores("BLHK,BMHK->BHLM", q_BLHK, k_BMHK, float32=f32)

        if cfg.deberta.relative_attention and types:
            length = x_BLD.shape[1]
            if relative_RD is None or relative_index_LM is None:
                raise ValueError(
                    "DebertaOptions.relative_attention needs relative_RD and relative_index_LM "
                    "from RelativeEmbeddings"
                )
            if tuple(relative_index_LM.shape) != (length, length):
                raise ValueError(
                    f"relative_index_LM must be ({length}, {length}), "
                    f"got {tuple(relative_index_LM.shape)}"
                )
            rel_RD = nn.Dropout(cfg.dropout_rate)(relative_RD, deterministic=deterministic)
            index_11LM = relative_index_LM[None, None]
            if "c2p" in types:
                pos_key = key if cfg.deberta.share_att_key else proj("pos_key", key_bias)
                c2p_BHLR = attention_scores("BLHK,RHK->BHLR", q_BLHK, pos_key(rel_RD), float32=f32)
                logits_BHLM = logits_BHLM + _gather_rows(c2p_BHLR, index_11LM)
            if "p2c" in types:
                pos_query = query if cfg.deberta.share_att_key else proj("pos_query", cfg.use_bias)
                p2c_BHMR = attention_scores(
                    "BMHK,RHK->BHMR", k_BMHK, pos_query(rel_RD) / scale, float32=f32
                )
                # score[i, j] = k_j . pq[index[i, j]]: gather along R for each key j, then swap.
                p2c_BHML = _gather_rows(p2c_BHMR, jnp.swapaxes(index_11LM, -1, -2))
                logits_BHLM = logits_BHLM + jnp.swapaxes(p2c_BHML, -1, -2)
        if bias_BHLM is not None:
            logits_BHLM = logits_BHLM + bias_BHLM

        probs_BHLM = fill_softmax(logits_BHLM, mask).astype(dtype)
        probs_BHLM = nn.Dropout(cfg.attention_dropout_rate)(probs_BHLM, deterministic=deterministic)
        out_BLHK = jnp.einsum("BHLM,BMHK->BLHK", probs_BHLM, v_BMHK)
        return DenseGeneral(
            (x_BLD.shape[-1],),
            (P.HEADS, P.KV),
            (P.EMBED,),
            use_bias=cfg.use_bias,
            name="out",
            **kw,
        )(out_BLHK)


def _gather_rows(scores_BHXR, index_11XY):
    """out[b, h, x, y] = scores[b, h, x, index[x, y]]; index (1, 1, X, Y) broadcasts over B, H."""
    b, h = scores_BHXR.shape[:2]
    index_BHXY = jnp.broadcast_to(index_11XY, (b, h, *index_11XY.shape[2:]))
    return jnp.take_along_axis(scores_BHXR, index_BHXY, axis=-1)
