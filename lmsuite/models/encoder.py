"""`EncoderModel`: one bidirectional stack and its heads (BERT, RoBERTa, ALBERT, DeBERTa,
SpanBERT, UniLM's masks through a full attention mask).

Parameters: `token_embedder`, `embedder`, `encoder` (the stack), and one submodule per head
(`mlm_head`, `classifier`, `rtd_head`, the span boundary head's `sbo_*`).
"""

import flax.linen as nn
import jax

from lmsuite.models import span_boundary
from lmsuite.models.config import ModelConfig
from lmsuite.models.embedder import Embedder, make_token_embedder
from lmsuite.models.inputs import self_attention_layout, self_attention_mask, validate_inputs
from lmsuite.models.outputs import head_outputs
from lmsuite.models.stack import Stack


class EncoderModel(nn.Module):
    """ids -> {"hidden", and one "<head>_logits" per head}.

    `mlm_logits` is (B, P, V) at `masked_positions`, or (B, L, V) without them;
    `classifier_logits` (B, num_labels); `rtd_logits` (B, L); `sbo_logits` (B, P, V) when given
    the span features (`span_boundary.INPUTS`).
    """

    config: ModelConfig

    @nn.compact
    def __call__(
        self,
        input_ids,
        *,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        segment_ids=None,
        masked_positions=None,
        span_left_positions=None,
        span_right_positions=None,
        span_offsets=None,
        deterministic: bool = True,
    ) -> dict[str, jax.Array]:
        """Runs the encoder and its heads.

        Args:
          input_ids: (B, L) token ids.
          attention_mask: (B, L) 1 for real tokens, or a full (B, L, L) boolean mask.
          token_type_ids: (B, L) segment-type ids (needs type_vocab_size > 0).
          position_ids: (B, L) 0-based positions (packing restarts them); default arange.
          segment_ids: (B, L) packed-example ids (> 0); attention stays within a segment.
          masked_positions: (B, P) positions at which to compute MLM logits.
          span_left_positions, span_right_positions, span_offsets: (B, P), aligned with
            masked_positions: the "sbo" head's inputs (`span_boundary.SpanBoundaryHead`).
          deterministic: False enables dropout (needs a "dropout" rng).
        """
        cfg = self.config
        validate_inputs(
            cfg,
            input_ids,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            segment_ids=segment_ids,
        )
        spans = span_boundary.span_inputs(
            cfg,
            dict(
                span_left_positions=span_left_positions,
                span_right_positions=span_right_positions,
                span_offsets=span_offsets,
            ),
            masked_positions,
        )
        token_embedder = make_token_embedder(cfg)
        x = Embedder(config=cfg, token_embedder=token_embedder, name="embedder")(
            input_ids,
            type_ids_BL=token_type_ids,
            position_ids_BL=position_ids,
            mask_BL=attention_mask
            if attention_mask is not None and attention_mask.ndim == 2
            else None,
            deterministic=deterministic,
        )
        mask_inputs = dict(
            attention_mask=attention_mask, segment_ids=segment_ids, causal=False, prefix_mask=None
        )
        mask = self_attention_mask(cfg, input_ids.shape[1], **mask_inputs)
        hidden = Stack(config=cfg, num_layers=cfg.num_layers, causal=False, name="encoder")(
            x,
            mask=mask,
            mask_layout=self_attention_layout(cfg, input_ids.shape[1], **mask_inputs),
            position_ids_BL=position_ids,
            deterministic=deterministic,
        )
        # DeBERTa's enhanced mask decoder: the stack also returns the MLM head's own input.
        hidden, mlm_in = hidden if cfg.emd_layers else (hidden, hidden)
        return head_outputs(
            cfg,
            token_embedder,
            hidden,
            deterministic=deterministic,
            initializing=self.is_initializing(),
            masked_positions=masked_positions,
            spans=spans,
            mlm_in=mlm_in,
        )
