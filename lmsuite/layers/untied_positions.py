"""TUPE's untied positional attention term (Ke, He, Liu 2021): positions correlate with
positions only, through projections of their own, computed once per forward pass and added to
the content logits of every layer.

For a query at position a and a key at position b, per head,

    (LN(p[a + 1]) U^Q)(LN(p[b + 1]) U^K)^T / sqrt(2K)  +  r[bucket(b - a)]
          absolute positional correlation                relative bias (TUPE-R only)

with p a (max_length + 1, D) table, U^Q / U^K projections D -> (H, K) with biases, r an
(R + 1, H) table over T5's bidirectional buckets (`t5_relative_bucket`). [CLS], the token at
position 0, is untied from the positions: its row (a = 0) becomes theta_cls->others and its
column (b = 0) theta_others->cls, learned per head; the row is reset after the column, so
[CLS] -> [CLS] takes theta_cls->others. As in the reference (guolinke/TUPE
fairseq/modules/transformer_sentence_encoder.py), theta_cls->others is the positional term of
table row 0 with itself and theta_others->cls that of row 1 (the [CLS] token's own row, unused
otherwise), and the relative bias of the [CLS] row and column comes from buckets of their own:
R // 2 (no distance lands there: keys after the query start at R // 2 + 1) and the extra row R.
"""

import functools
import math

import flax.linen as nn
import jax.numpy as jnp

from lmsuite import partitioning as P
from lmsuite.layers.attention import attention_scores
from lmsuite.layers.dense import DenseGeneral, default_kernel_init
from lmsuite.layers.norm import make_norm
from lmsuite.layers.positions import position_id_buckets

# Table rows whose positional term with themselves is theta (row r + 1 is position r's).
CLS_TO_OTHERS_ROW = 0
OTHERS_TO_CLS_ROW = 1


def untie_cls(scores_BHLM, is_cls_BL, *, cls_to_others_H, others_to_cls_H):
    """scores with the columns of [CLS] keys set to others_to_cls, then the rows of [CLS]
    queries set to cls_to_others (B may be 1: a bias shared by the batch)."""
    to_cls_1H11 = others_to_cls_H[None, :, None, None]
    from_cls_1H11 = cls_to_others_H[None, :, None, None]
    scores_BHLM = jnp.where(is_cls_BL[:, None, None, :], to_cls_1H11, scores_BHLM)
    return jnp.where(is_cls_BL[:, None, :, None], from_cls_1H11, scores_BHLM)


class UntiedPositionBias(nn.Module):
    """The stack's positional attention term: (1, H, L, L) for positions 0..L-1, or
    (B, H, L, L) for given `position_ids_BL` (packed examples restart at 0, each with its own
    [CLS]).

    Parameters: `embedding` (max_length + 1, features), `norm`, `query` and `key`
    (features -> H, K, with biases), and with `num_buckets` > 0 (TUPE-R) `rel_embedding`
    (num_buckets + 1, H).
    """

    num_heads: int
    head_dim: int
    features: int
    max_length: int
    num_buckets: int = 0
    max_distance: int = 128
    norm_type: str = "layernorm"
    norm_eps: float = 1e-5
    init_stddev: float = 0.02
    dtype: jnp.dtype = jnp.float32
    float32_scores: bool = True  # `attention.attention_scores`

    @nn.compact
    def __call__(self, length: int, *, position_ids_BL=None):
        if length > self.max_length:
            raise ValueError(
                f"length {length} is longer than TUPE's position table (max_length="
                f"{self.max_length})"
            )
        if position_ids_BL is None:
            position_ids_BL = jnp.arange(length)[None, :]
        table_PD = self.param(
            "embedding",
            nn.with_logical_partitioning(default_kernel_init(self.init_stddev), (P.TABLE, P.EMBED)),
            (self.max_length + 1, self.features),
            jnp.float32,
        )
        norm = make_norm(self.norm_type, eps=self.norm_eps, name="norm", dtype=self.dtype)
        proj = lambda name: DenseGeneral(
            (self.num_heads, self.head_dim),
            (P.EMBED,),
            (P.HEADS, P.KV),
            kernel_init=default_kernel_init(self.init_stddev),
            dtype=self.dtype,
            name=name,
        )
        query, key = proj("query"), proj("key")
        scale = jnp.asarray(1.0 / math.sqrt(2 * self.head_dim), self.dtype)
        scores = functools.partial(attention_scores, float32=self.float32_scores)

        # LayerNorm is per row: gathering rows first equals normalising the whole table.
        # Rows gathered in float32, then cast (the gradient's scatter-add stays float32).
        rows_BLD = norm(jnp.take(table_PD, position_ids_BL + 1, axis=0).astype(self.dtype))
        scores_BHLM = scores("BLHK,BMHK->BHLM", query(rows_BLD) * scale, key(rows_BLD))
        special_SD = norm(
            table_PD[jnp.array([CLS_TO_OTHERS_ROW, OTHERS_TO_CLS_ROW])].astype(self.dtype)
        )
        theta_HS = scores("SHK,SHK->HS", query(special_SD) * scale, key(special_SD))
        is_cls_BL = position_ids_BL == 0
        scores_BHLM = untie_cls(
            scores_BHLM,
            is_cls_BL,
            cls_to_others_H=theta_HS[:, CLS_TO_OTHERS_ROW],
            others_to_cls_H=theta_HS[:, OTHERS_TO_CLS_ROW],
        )
        if self.num_buckets:
            scores_BHLM = scores_BHLM + self._relative_bias(position_ids_BL, is_cls_BL)
        return scores_BHLM

    def _relative_bias(self, position_ids_BL, is_cls_BL):
        """r[bucket(b - a)], the [CLS] row and column on their own buckets: (B, H, L, M)."""
        table_RH = self.param(
            "rel_embedding",
            nn.with_logical_partitioning(default_kernel_init(self.init_stddev), (P.TABLE, P.HEADS)),
            (self.num_buckets + 1, self.num_heads),
            jnp.float32,
        )
        bucket_BLM = position_id_buckets(
            position_ids_BL,
            num_positions=self.max_length,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )
        bucket_BLM = jnp.where(is_cls_BL[:, None, :], self.num_buckets, bucket_BLM)
        bucket_BLM = jnp.where(is_cls_BL[:, :, None], self.num_buckets // 2, bucket_BLM)
        bias_BLMH = jnp.take(table_RH, bucket_BLM, axis=0).astype(self.dtype)  # float32 scatter
        return jnp.transpose(bias_BLMH, (0, 3, 1, 2))
