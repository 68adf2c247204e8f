"""`Transformer`: the one Flax module behind every lmsuite architecture.

    encoder          BERT, RoBERTa, ALBERT, ELECTRA, DeBERTa: bidirectional over padding.
    decoder          GPT: causal.
    prefix_lm        a decoder whose prefix (marked by `prefix_mask`) is bidirectional.
    encoder_decoder  T5, BART, MASS: a bidirectional encoder, a causal decoder with cross-attention.
    xlnet            XLNet's two streams, its own module (`two_stream.py`), built in this
                     module's scope so that its parameters sit at the top of the tree too.

Parameters live outside the module: `params = Transformer(cfg).init(rng, ids)["params"]`.

Cached decoding passes `cache=inputs.init_cache(cfg, ...)` and `cache_index` and reads the updated
cache from the outputs (see `Transformer.__call__`); `lmsuite.evaluation.decoding` drives it.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from lmsuite.layers import masks
from lmsuite.models import span_boundary, stack
from lmsuite.models.config import ModelConfig
from lmsuite.models.electra import ElectraPretrainer
from lmsuite.models.embedder import Embedder, make_token_embedder
from lmsuite.models.heads import Classifier, ReplacedTokenHead, VocabHead, gather_positions
from lmsuite.models.inputs import (
    DECODING_ARCHITECTURES,
    check_ids,
    check_length,
    check_same_shape,
    refuse_given,
    validate_inputs,
)
from lmsuite.models.stack import Stack
from lmsuite.models.two_stream import TwoStreamTransformer


class Transformer(nn.Module):
    """ids -> dict of outputs: `hidden` and one entry per configured head.

    Outputs: `mlm_logits` (B, P, V) at `masked_positions`, or (B, L, V) without them;
    `lm_logits` (B, L, V); `classifier_logits` (B, num_labels); `rtd_logits` (B, L);
    `sbo_logits` (B, P, V) when given the span features (`span_boundary.INPUTS`).
    XLNet: `lm_logits` (B, P, V) at `target_mapping`'s positions, or (B, L, V) without it, and
    `new_mems` (see `two_stream.TwoStreamTransformer`). ModelConfig.electra: the generator's
    `mlm_logits`, `sampled_ids`, `corrupted_ids` and the discriminator's `rtd_logits` (see
    `electra.ElectraPretrainer`).
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
        prefix_mask=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        decoder_position_ids=None,
        decoder_segment_ids=None,
        cross_attention_mask=None,
        masked_positions=None,
        masked_weights=None,
        perm_mask=None,
        target_mapping=None,
        mems=None,
        span_left_positions=None,
        span_right_positions=None,
        span_offsets=None,
        deterministic: bool = True,
        cache=None,
        cache_index=None,
    ) -> dict[str, jax.Array]:
        """Runs the model.

        Args:
          input_ids: (B, L) token ids (the encoder's inputs for encoder_decoder).
          attention_mask: (B, L) 1 for real tokens, or a full (B, L, L) boolean mask.
          token_type_ids: (B, L) segment-type ids (needs type_vocab_size > 0).
          position_ids: (B, L) 0-based positions (packing restarts them); default arange.
          segment_ids: (B, L) packed-example ids (> 0); attention stays within a segment.
          prefix_mask: (B, L) 1 on the bidirectional prefix (prefix_lm only).
          decoder_*: the same for the decoder of an encoder_decoder model.
          cross_attention_mask: (B, L) 1 on the encoder positions the decoder may attend to
            (on top of padding and segments; MASS hides the encoder's [MASK] positions).
          masked_positions: (B, P) positions at which to compute MLM logits.
          masked_weights: (B, P), ModelConfig.electra only: slots with weight 0 are not
            replaced by the generator's samples (`electra.ElectraPretrainer`).
          perm_mask, target_mapping, mems: XLNet only, see `TwoStreamTransformer`.
          span_left_positions, span_right_positions, span_offsets: (B, P), aligned with
            masked_positions: the "sbo" head's inputs (`span_boundary.SpanBoundaryHead`).
          deterministic: False enables dropout (needs a "dropout" rng).
          cache: from `init_cache` or a previous call's outputs["cache"]; the decoder's inputs
            (input_ids, or decoder_input_ids) then sit at positions [cache_index, cache_index
            + L) of the cache's M, position ids default to those, attention_mask (and
            prefix_mask) cover all M cached positions (B, M), and outputs gain "cache". An
            encoder-decoder's attention_mask stays the encoder's (B, L_enc).
          cache_index: int32 scalar, the first position the inputs are written to.
        """
        cfg = self.config
        span_kwargs = dict(
            span_left_positions=span_left_positions,
            span_right_positions=span_right_positions,
            span_offsets=span_offsets,
        )
        if cache is not None:
            unused = span_kwargs | dict(
                token_type_ids=token_type_ids,
                segment_ids=segment_ids,
                decoder_attention_mask=decoder_attention_mask,
                decoder_segment_ids=decoder_segment_ids,
                cross_attention_mask=cross_attention_mask,
                masked_positions=masked_positions,
                perm_mask=perm_mask,
                target_mapping=target_mapping,
                mems=mems,
            )
            refuse_given(unused, "cached decoding")
            return self._cached(
                cache,
                cache_index,
                input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                prefix_mask=prefix_mask,
                decoder_input_ids=decoder_input_ids,
                decoder_position_ids=decoder_position_ids,
                deterministic=deterministic,
            )
        xlnet_inputs = dict(perm_mask=perm_mask, target_mapping=target_mapping, mems=mems)
        if cfg.architecture == "xlnet":
            others = span_kwargs | dict(
                position_ids=position_ids,
                segment_ids=segment_ids,
                prefix_mask=prefix_mask,
                decoder_input_ids=decoder_input_ids,
                decoder_attention_mask=decoder_attention_mask,
                decoder_position_ids=decoder_position_ids,
                decoder_segment_ids=decoder_segment_ids,
                cross_attention_mask=cross_attention_mask,
                masked_positions=masked_positions,
            )
            refuse_given(others, "architecture='xlnet'")
            model = TwoStreamTransformer(config=cfg)
            # The XLNet module's parameters become this module's own: no extra tree level.
            nn.share_scope(self, model)
            return model(
                input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                deterministic=deterministic,
                **xlnet_inputs,
            )
        refuse_given(xlnet_inputs, f"architecture={cfg.architecture!r}")
        if cfg.electra is not None:  # generator + discriminator, its own module (electra.py)
            others = span_kwargs | dict(
                position_ids=position_ids,
                segment_ids=segment_ids,
                prefix_mask=prefix_mask,
                decoder_input_ids=decoder_input_ids,
                decoder_attention_mask=decoder_attention_mask,
                decoder_position_ids=decoder_position_ids,
                decoder_segment_ids=decoder_segment_ids,
                cross_attention_mask=cross_attention_mask,
            )
            refuse_given(others, "ModelConfig.electra")
            validate_inputs(cfg, input_ids, token_type_ids=token_type_ids)
            model = ElectraPretrainer(config=cfg)
            nn.share_scope(self, model)  # its parameters at the top of the tree, as XLNet's
            return model(
                input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                masked_positions=masked_positions,
                masked_weights=masked_weights,
                deterministic=deterministic,
            )
        refuse_given({"masked_weights": masked_weights}, "a model without ModelConfig.electra")
        validate_inputs(
            cfg,
            input_ids,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            segment_ids=segment_ids,
            prefix_mask=prefix_mask,
            decoder_input_ids=decoder_input_ids,
        )
        token_embedder = make_token_embedder(cfg)
        if cfg.architecture == "encoder_decoder":
            hidden = self._encoder_decoder(
                token_embedder,
                input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                position_ids=position_ids,
                segment_ids=segment_ids,
                decoder_input_ids=decoder_input_ids,
                decoder_attention_mask=decoder_attention_mask,
                decoder_position_ids=decoder_position_ids,
                decoder_segment_ids=decoder_segment_ids,
                cross_attention_mask=cross_attention_mask,
                deterministic=deterministic,
            )
        else:
            if cross_attention_mask is not None:
                raise ValueError(
                    f"cross_attention_mask is for architecture='encoder_decoder', not "
                    f"{cfg.architecture!r}"
                )
            causal = cfg.architecture != "encoder"
            x = Embedder(config=cfg, token_embedder=token_embedder, name="embedder")(
                input_ids,
                type_ids_BL=token_type_ids,
                position_ids_BL=position_ids,
                mask_BL=(
                    attention_mask
                    if attention_mask is not None and attention_mask.ndim == 2
                    else None
                ),
                deterministic=deterministic,
            )
            mask = self._self_mask(
                input_ids.shape[1],
                attention_mask=attention_mask,
                segment_ids=segment_ids,
                causal=causal,
                prefix_mask=prefix_mask,
            )
            hidden = Stack(
                config=cfg,
                num_layers=cfg.num_layers,
                causal=causal,
                name="decoder" if causal else "encoder",
            )(x, mask=mask, position_ids_BL=position_ids, deterministic=deterministic)
        # DeBERTa's enhanced mask decoder: the stack also returns the MLM head's own input.
        hidden, mlm_in = hidden if cfg.deberta_emd_layers else (hidden, hidden)
        spans = span_boundary.span_inputs(cfg, span_kwargs, masked_positions)
        return self._heads(token_embedder, hidden, masked_positions, deterministic, spans, mlm_in)

    def _heads(
        self, token_embedder, hidden, masked_positions, deterministic, spans=None, mlm_in=None
    ):
        cfg = self.config
        outputs = {"hidden": hidden}
        if "mlm" in cfg.heads:
            h = hidden if mlm_in is None else mlm_in
            h = h if masked_positions is None else gather_positions(h, masked_positions)
            head = VocabHead(
                config=cfg,
                token_embedder=token_embedder,
                transform=cfg.mlm_transform,
                name="mlm_head",
            )
            outputs["mlm_logits"] = head(h)
        if "lm" in cfg.heads:
            head = VocabHead(
                config=cfg, token_embedder=token_embedder, transform=False, name="lm_head"
            )
            outputs["lm_logits"] = head(hidden)
        if "classifier" in cfg.heads:
            outputs["classifier_logits"] = Classifier(config=cfg, name="classifier")(
                hidden, deterministic=deterministic
            )
        if "rtd" in cfg.heads:
            outputs["rtd_logits"] = ReplacedTokenHead(config=cfg, name="rtd_head")(hidden)
        if "sbo" in cfg.heads:
            outputs |= span_boundary.outputs(
                cfg, token_embedder, hidden, spans, initializing=self.is_initializing()
            )
        return outputs

    def _cached(
        self,
        cache,
        cache_index,
        input_ids,
        *,
        attention_mask,
        position_ids,
        prefix_mask,
        decoder_input_ids,
        decoder_position_ids,
        deterministic,
    ):
        """One cached decoding call: the decoder over L new positions; see `__call__`."""
        cfg = self.config
        if cfg.architecture not in DECODING_ARCHITECTURES:
            raise ValueError(
                f"architecture={cfg.architecture!r} cannot decode with a cache; expected one of "
                f"{DECODING_ARCHITECTURES}"
            )
        if cache_index is None:
            raise ValueError("a cache needs cache_index, the position the inputs are written to")
        cache_length = stack.cache_length(cache)
        token_embedder = make_token_embedder(cfg)
        encoded = cross_mask = None
        if cfg.architecture == "encoder_decoder":
            if decoder_input_ids is None:
                raise ValueError("architecture='encoder_decoder' needs decoder_input_ids")
            check_ids("decoder_input_ids", decoder_input_ids, cfg.vocab_size)
            ids, positions = decoder_input_ids, decoder_position_ids
            if "cross_attention" not in cache["layers_0"]:
                if input_ids is None:
                    raise ValueError("the first cached step of an encoder-decoder needs input_ids")
                check_ids("input_ids", input_ids, cfg.vocab_size)
                check_length(cfg, "input_ids", input_ids.shape[1])
                x = Embedder(config=cfg, token_embedder=token_embedder, name="encoder_embedder")(
                    input_ids, deterministic=deterministic
                )
                enc_mask = None if attention_mask is None else masks.padding_mask(attention_mask)
                encoded = Stack(
                    config=cfg, num_layers=cfg.num_layers, causal=False, name="encoder"
                )(x, mask=enc_mask, deterministic=deterministic)
            elif input_ids is not None:
                raise ValueError("the encoder output is cached already: pass input_ids=None")
            if attention_mask is not None:
                cross_mask = masks.padding_mask(attention_mask)
            self_mask = stack.cached_causal_mask(
                ids.shape[1], cache_length, cache_index, attention_mask=None, prefix_mask=None
            )
            embedder = Embedder(
                config=cfg, token_embedder=token_embedder, use_types=False, name="decoder_embedder"
            )
        else:
            if decoder_input_ids is not None:
                raise ValueError(f"decoder_input_ids given to architecture={cfg.architecture!r}")
            if cfg.architecture == "prefix_lm" and prefix_mask is None:
                raise ValueError("architecture='prefix_lm' needs prefix_mask (B, M)")
            check_ids("input_ids", input_ids, cfg.vocab_size)
            ids, positions = input_ids, position_ids
            self_mask = stack.cached_causal_mask(
                ids.shape[1],
                cache_length,
                cache_index,
                attention_mask=attention_mask,
                prefix_mask=prefix_mask,
            )
            embedder = Embedder(config=cfg, token_embedder=token_embedder, name="embedder")
        if positions is None:
            positions = (cache_index + jnp.arange(ids.shape[1]))[None, :]
        y = embedder(ids, position_ids_BL=positions, deterministic=deterministic)
        num_layers = cfg.decoder_layers if cfg.architecture == "encoder_decoder" else cfg.num_layers
        hidden, new_cache = Stack(
            config=cfg,
            num_layers=num_layers,
            causal=True,
            has_cross=cfg.architecture == "encoder_decoder",
            name="decoder",
        )(
            y,
            mask=self_mask,
            encoded_BMD=encoded,
            cross_mask=cross_mask,
            deterministic=deterministic,
            cache=cache,
            cache_index=cache_index,
        )
        outputs = self._heads(token_embedder, hidden, None, deterministic)
        outputs["cache"] = new_cache
        return outputs

    def _self_mask(self, length, *, attention_mask, segment_ids, causal, prefix_mask):
        cfg = self.config
        pad = None
        if attention_mask is not None:
            if attention_mask.ndim == 3:
                pad = masks.full_mask(attention_mask)
            elif cfg.mask_padded_queries:
                pad = masks.query_key_padding_mask(attention_mask)
            else:
                pad = masks.padding_mask(attention_mask)
            if attention_mask.shape[1] != length or attention_mask.shape[-1] != length:
                raise ValueError(
                    f"attention_mask must be (B, {length}) or (B, {length}, {length}), "
                    f"got {tuple(attention_mask.shape)}"
                )
        order = None
        if prefix_mask is not None:
            order = masks.prefix_lm_mask(prefix_mask)
        elif causal:
            order = masks.causal_mask(length)
        seg = None if segment_ids is None else masks.segment_mask(segment_ids, segment_ids)
        return masks.combine(pad, order, seg)

    def _encoder_decoder(
        self,
        token_embedder,
        input_ids,
        *,
        attention_mask,
        token_type_ids,
        position_ids,
        segment_ids,
        decoder_input_ids,
        decoder_attention_mask,
        decoder_position_ids,
        decoder_segment_ids,
        cross_attention_mask,
        deterministic,
    ):
        cfg = self.config
        if decoder_input_ids is None:
            raise ValueError("architecture='encoder_decoder' needs decoder_input_ids (B, L_dec)")
        if attention_mask is not None and attention_mask.ndim != 2:
            raise ValueError(
                f"encoder attention_mask must be (B, L), got {tuple(attention_mask.shape)}"
            )
        x = Embedder(config=cfg, token_embedder=token_embedder, name="encoder_embedder")(
            input_ids,
            type_ids_BL=token_type_ids,
            position_ids_BL=position_ids,
            deterministic=deterministic,
        )
        enc_mask = self._self_mask(
            input_ids.shape[1],
            attention_mask=attention_mask,
            segment_ids=segment_ids,
            causal=False,
            prefix_mask=None,
        )
        encoded = Stack(config=cfg, num_layers=cfg.num_layers, causal=False, name="encoder")(
            x, mask=enc_mask, deterministic=deterministic
        )
        y = Embedder(
            config=cfg, token_embedder=token_embedder, use_types=False, name="decoder_embedder"
        )(decoder_input_ids, position_ids_BL=decoder_position_ids, deterministic=deterministic)
        dec_mask = self._self_mask(
            decoder_input_ids.shape[1],
            attention_mask=decoder_attention_mask,
            segment_ids=decoder_segment_ids,
            causal=True,
            prefix_mask=None,
        )
        if cross_attention_mask is not None:
            check_same_shape("cross_attention_mask", cross_attention_mask, "input_ids", input_ids)
        cross_mask = masks.combine(
            None if attention_mask is None else masks.padding_mask(attention_mask),
            None if cross_attention_mask is None else masks.padding_mask(cross_attention_mask),
            None
            if decoder_segment_ids is None or segment_ids is None
            else masks.segment_mask(decoder_segment_ids, segment_ids),
        )
        return Stack(
            config=cfg, num_layers=cfg.decoder_layers, causal=True, has_cross=True, name="decoder"
        )(y, mask=dec_mask, encoded_BMD=encoded, cross_mask=cross_mask, deterministic=deterministic)
