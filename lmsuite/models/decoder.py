"""`DecoderModel`: one causal stack and its heads (GPT-2), or a prefix LM whose prefix is
bidirectional (T5's decoder-only prefix LM), with cached decoding.

Parameters: `token_embedder`, `embedder`, `decoder` (the stack), `lm_head` / `classifier`.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from lmsuite.models import stack
from lmsuite.models.config import ModelConfig
from lmsuite.models.embedder import Embedder, make_token_embedder
from lmsuite.models.inputs import (
    refuse_given,
    self_attention_layout,
    self_attention_mask,
    validate_inputs,
)
from lmsuite.models.outputs import head_outputs
from lmsuite.models.stack import Stack


class DecoderModel(nn.Module):
    """ids -> {"hidden", "lm_logits" (B, L, V), "classifier_logits"} (+ "cache" when cached).

    `prefix=True` (architecture "prefix_lm") makes `prefix_mask` required: positions it marks
    attend to each other in both directions, the rest causally.
    """

    config: ModelConfig
    prefix: bool = False

    @nn.compact
    def __call__(
        self,
        input_ids,
        *,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        segment_ids=None,
        prefix_mask=None,
        deterministic: bool = True,
        cache=None,
        cache_index=None,
    ) -> dict[str, jax.Array]:
        """Runs the decoder and its heads.

        Args:
          input_ids: (B, L) token ids.
          attention_mask: (B, L) 1 for real tokens, or a full (B, L, L) boolean mask.
          token_type_ids: (B, L) segment-type ids (needs type_vocab_size > 0).
          position_ids: (B, L) 0-based positions (packing restarts them); default arange.
          segment_ids: (B, L) packed-example ids (> 0); attention stays within a segment.
          prefix_mask: (B, L) 1 on the bidirectional prefix (prefix LM only).
          deterministic: False enables dropout (needs a "dropout" rng).
          cache: from `families.init_cache` or a previous call's outputs["cache"]: the inputs
            then sit at positions [cache_index, cache_index + L) of the cache's M, position ids
            default to those, attention_mask and prefix_mask cover all M cached positions
            (B, M), and outputs gain "cache".
          cache_index: int32 scalar, the first position the inputs are written to.
        """
        cfg = self.config
        if self.prefix and prefix_mask is None:
            length = "L" if cache is None else "M"
            raise ValueError(f"architecture='prefix_lm' needs prefix_mask (B, {length})")
        if not self.prefix and prefix_mask is not None:
            raise ValueError("prefix_mask is for architecture='prefix_lm', not a plain decoder")
        token_embedder = make_token_embedder(cfg)
        embedder = Embedder(config=cfg, token_embedder=token_embedder, name="embedder")
        decoder = Stack(config=cfg, num_layers=cfg.num_layers, causal=True, name="decoder")
        if cache is not None:
            refuse_given(
                dict(token_type_ids=token_type_ids, segment_ids=segment_ids), "cached decoding"
            )
            if cache_index is None:
                raise ValueError(
                    "a cache needs cache_index, the position the inputs are written to"
                )
            validate_inputs(cfg, input_ids)
            mask = stack.cached_causal_mask(
                input_ids.shape[1],
                stack.cache_length(cache),
                cache_index,
                attention_mask=attention_mask,
                prefix_mask=prefix_mask,
            )
            if position_ids is None:
                position_ids = (cache_index + jnp.arange(input_ids.shape[1]))[None, :]
            x = embedder(input_ids, position_ids_BL=position_ids, deterministic=deterministic)
            hidden, new_cache = decoder(
                x, mask=mask, deterministic=deterministic, cache=cache, cache_index=cache_index
            )
            outputs = head_outputs(
                cfg,
                token_embedder,
                hidden,
                deterministic=deterministic,
                initializing=self.is_initializing(),
            )
            return outputs | {"cache": new_cache}
        validate_inputs(
            cfg,
            input_ids,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            segment_ids=segment_ids,
        )
        x = embedder(
            input_ids,
            type_ids_BL=token_type_ids,
            position_ids_BL=position_ids,
            mask_BL=attention_mask
            if attention_mask is not None and attention_mask.ndim == 2
            else None,
            deterministic=deterministic,
        )
        mask_inputs = dict(
            attention_mask=attention_mask,
            segment_ids=segment_ids,
            causal=True,
            prefix_mask=prefix_mask,
        )
        hidden = decoder(
            x,
            mask=self_attention_mask(cfg, input_ids.shape[1], **mask_inputs),
            mask_layout=self_attention_layout(cfg, input_ids.shape[1], **mask_inputs),
            position_ids_BL=position_ids,
            deterministic=deterministic,
        )
        return head_outputs(
            cfg,
            token_embedder,
            hidden,
            deterministic=deterministic,
            initializing=self.is_initializing(),
        )


class PrefixLMModel(DecoderModel):
    """`DecoderModel` whose `prefix_mask` is required (architecture "prefix_lm")."""

    prefix: bool = True
