"""DeBERTa's enhanced mask decoder (EMD, He et al. 2021 §3.2): absolute positions for the MLM head.

Disentangled attention sees relative distances only, so the encoder cannot tell "a new store
opened beside the new mall" from the same words shifted. The EMD adds absolute positions just
before the MLM head, where they help predict masked tokens without entering the encoder:

    H  = the second-to-last layer's output          (keys and values of every pass)
    Q0 = Z + H, Z = a learned (max_length, D) table of absolute positions
    Q_{t+1} = last_layer(queries=Q_t, keys/values=H)  for t < n (the paper's n = 2)
    the MLM head reads Q_n; `hidden` (every other head) stays the last layer's output.

Each pass is the encoder's last block with its own weights and the stack's relative-position
terms (c2p from the query states, p2c from the keys), as the reference runs
`encoder.layer[-1]` twice (microsoft/DeBERTa `apps/models/masked_language_model.py`,
`EnhancedMaskDecoder.emd_context_layer`). The only new parameter is the table,
`enhanced_mask_decoder/position_embedder/embedding`. Fine-tuning drops the EMD: HF's DeBERTa
has none, and `DebertaOptions.emd_layers=0` gives the same network as HF's DebertaForMaskedLM.
"""

import flax.linen as nn
import jax.numpy as jnp

from lmsuite import partitioning as P
from lmsuite.layers.embedding import Embed
from lmsuite.models.config import ModelConfig


class EnhancedMaskDecoder(nn.Module):
    """hidden_BLD (the second-to-last layer's output) -> the MLM head's input states (B, L, D).

    `layer` is the stack's last `stack.Layer` (built with the stack's dropout mode), passed in so
    that its parameters stay where the stack put them (`layers_{n-1}`, or `layers_shared`) and
    each pass reuses them.
    """

    config: ModelConfig
    layer: nn.Module

    @nn.compact
    def __call__(
        self,
        hidden_BLD,
        *,
        position_ids_BL=None,
        mask=None,
        attention_kwargs=None,
    ):
        """`position_ids_BL` index the table (default 0..L-1; packing restarts them per example);
        `mask` and `attention_kwargs` are the stack's, so the passes attend as its layers do."""
        cfg = self.config
        length = hidden_BLD.shape[1]
        if length > cfg.max_length:
            raise ValueError(
                f"the enhanced mask decoder's position table has max_length={cfg.max_length} "
                f"rows, the input has length {length}"
            )
        if position_ids_BL is None:
            position_ids_BL = jnp.arange(length)[None, :]
        table = Embed(
            num_embeddings=cfg.max_length,
            features=cfg.d_model,
            row_name=P.TABLE,
            col_name=P.EMBED,
            init_stddev=cfg.init_stddev,
            dtype=cfg.compute_dtype,
            name="position_embedder",
        )
        # Z is added as looked up: no norm or dropout, as the reference's z_states.
        query_BLD = table(position_ids_BL) + hidden_BLD
        for _ in range(cfg.emd_layers):
            query_BLD = self.layer(
                query_BLD, mask, attention_kwargs=attention_kwargs, kv_BLD=hidden_BLD
            )
        return query_BLD
