"""`LoadedModel`: what `lmsuite.load` returns, one interface whatever the checkpoint came from.

  model = lmsuite.load("runs/default")            # or a HF directory, or a transformers model
  model.config, model.params, model.vocab
  model.logits(input_ids=..., attention_mask=...)  # HF-style inputs, HF's `.logits`
  model.fill_mask("Paris is the [MASK] of France.", top_k=5)   # as HF's fill-mask pipeline
  model.score(texts) / model.score(inputs, targets)            # (pseudo-)log-likelihoods
  model.encode(texts)                               # per-token states and a pooled vector
  model.attention(texts, layer=0)                   # (H, L, L) attention maps per text
  model.generate("Once upon a time", max_new_tokens=20)   # under its generation config
  model.save_hf("out/")                             # weights, config.json and tokenizer files

The forward pass is `lmsuite.convert.ConvertedModel`'s, so HF-style inputs mean what they mean
to HF (RoBERTa's positions counted past padding, ...). An lmsuite run whose model has no HF
twin runs the Transformer directly on the same inputs.
"""

import dataclasses
import os
import types
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from lmsuite.convert import ConvertedModel, TokenIds, to_hf
from lmsuite.evaluation import fill_mask as fill_mask_lib
from lmsuite.evaluation import generation_config as generation_lib
from lmsuite.evaluation import scoring
from lmsuite.models import ModelConfig, Transformer, families
from lmsuite.models.inputs import position_limit

PAD_MULTIPLE = 8  # batches are padded to a multiple of this: fewer shapes to compile


@dataclasses.dataclass(frozen=True)
class Encoded:
    """Per-token final hidden states (one (L_i, D) array per text, specials included) and
    their mean over each text's tokens, (N, D): a pooled vector that needs no trained pooler."""

    hidden: list[np.ndarray]
    pooled: np.ndarray
    input_ids: list[list[int]]


@dataclasses.dataclass(frozen=True)
class AttentionMap:
    """One text's attention probabilities, (H, L, L): query rows, key columns."""

    tokens: list[str]
    weights: np.ndarray


class NativeForward:
    """`ConvertedModel`'s `outputs` / `logits` for a model with no HF twin: the inputs go to
    the Transformer as they are."""

    def __init__(self, config: ModelConfig, params: Any):
        self.config, self.params = config, params
        model = Transformer(config)
        self._apply = jax.jit(lambda p, kw: model.apply({"params": p}, **kw))

    def outputs(self, input_ids, attention_mask=None, token_type_ids=None, decoder_input_ids=None):
        kwargs = dict(
            input_ids=np.asarray(input_ids),
            attention_mask=None if attention_mask is None else np.asarray(attention_mask),
            token_type_ids=None if token_type_ids is None else np.asarray(token_type_ids),
            decoder_input_ids=None if decoder_input_ids is None else np.asarray(decoder_input_ids),
        )
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return jax.tree.map(np.asarray, self._apply(self.params, kwargs))

    def logits(self, input_ids, attention_mask=None, token_type_ids=None, decoder_input_ids=None):
        out = self.outputs(input_ids, attention_mask, token_type_ids, decoder_input_ids)
        return out["mlm_logits"] if "mlm_logits" in out else out["lm_logits"]


def forward_for(config: ModelConfig, params: Any) -> tuple[Any, str | None]:
    """(forward, HF class) for an lmsuite model: `ConvertedModel` through its HF twin when
    `lmsuite.convert` has one, else `NativeForward` and None.

    Loading a run needs no `transformers` (the `hf` extra): the HF-style inputs read only the
    ids below from the HF config, and they are the lmsuite config's (what `to_hf` writes).
    """
    from lmsuite.convert import infer_hf_class, registry

    try:
        hf_class = infer_hf_class(config)
        family = registry.families_by_class()[hf_class]
    except (ValueError, KeyError):  # no HF twin: the model is still usable natively
        return NativeForward(config, params), None
    hf_fields = types.SimpleNamespace(
        pad_token_id=config.pad_id,
        decoder_start_token_id=config.decoder_start_id,
        type_vocab_size=config.type_vocab_size,
    )
    return ConvertedModel(config, params, hf_class, hf_fields, family), hf_class


def _padded(rows: list[list[int]], *, pad_id: int, limit: int | None):
    """(ids (B, L), mask (B, L)) with L the longest row rounded up to PAD_MULTIPLE (<= limit)."""
    longest = max(len(r) for r in rows)
    length = -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE
    if limit is not None:
        length = max(longest, min(length, limit))
    ids = np.full((len(rows), length), pad_id, np.int32)
    mask = np.zeros((len(rows), length), np.int32)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = row
        mask[b, : len(row)] = 1
    return ids, mask


class LoadedModel:
    """A model with its vocabulary, ready to predict, score, encode, generate and export.

    Args:
      forward: a `ConvertedModel` (or `NativeForward`): config, params, outputs(), logits().
      vocab: a `tokenizer_export.SentencePieceText` / `TokenizersText`, or None (ids only).
      hf_class: the HF class `save_hf` writes (None: `lmsuite.convert` infers it).
      decoder_start_id: what a seq2seq decoder reads first.
      causal_start_id: what an lmsuite decoder reads before the first token (SeqIO's LM
        features shift the targets right after id 0); None for HF models, which score from
        the second token.
      source: where it was loaded from, for messages; a HF directory's generation config is
        read from it.
      generation_config: the checkpoint's generation options (HF's names, or a transformers
        `GenerationConfig`); None: `source`'s when that is a HF directory, else the special ids
        the model knows (see `generation_config`).
    """

    def __init__(self, *, forward, vocab, hf_class=None, decoder_start_id=0,
                 causal_start_id=None, source: str = "",
                 generation_config=None) -> None:  # fmt: skip
        self._forward = forward
        self.vocab = vocab
        self.hf_class = hf_class
        self.decoder_start_id = decoder_start_id
        self.causal_start_id = causal_start_id
        self.source = source
        self._generation_given = generation_config

    @property
    def config(self) -> ModelConfig:
        return self._forward.config

    @property
    def params(self) -> Any:
        return self._forward.params

    def __repr__(self) -> str:
        c = self.config
        return (
            f"LoadedModel({self.source!r}: {families.family(c).name}, heads={c.heads}, "
            f"d_model={c.d_model}, layers={c.num_layers}, vocab={c.vocab_size})"
        )

    # --------------------------------------------------------------------------- forward
    def logits(self, input_ids, attention_mask=None, token_type_ids=None, decoder_input_ids=None,
               **extra):  # fmt: skip
        """What HF's `.logits` holds for the same inputs (numpy or torch)."""
        return self._forward.logits(
            input_ids, attention_mask, token_type_ids, decoder_input_ids, **extra
        )

    def _require_vocab(self, what: str):
        if self.vocab is None:
            raise ValueError(
                f"{what} needs a vocabulary, and {self.source or 'this model'} has none: load a "
                "HF directory with tokenizer.json, pass tokenizer=, or use ids (`logits`)"
            )
        return self.vocab

    def _inputs(self, rows, decoder_rows=None):
        """Padded (ids, attention mask, token types or None, decoder ids or None)."""
        cfg = self.config
        limit = position_limit(cfg)  # padding stops at the position table's end
        ids, mask = _padded(rows, pad_id=cfg.pad_id, limit=limit)
        types = np.zeros_like(ids) if cfg.type_vocab_size > 0 else None
        decoder_ids = None
        if decoder_rows is not None:
            decoder_ids, _ = _padded(decoder_rows, pad_id=cfg.pad_id, limit=limit)
        return ids, mask, types, decoder_ids

    def _logits_of(self, rows, decoder_rows=None) -> list[np.ndarray]:
        """One (L_i, V) logits array per row (per decoder row for seq2seq), padding cut off."""
        logits = np.asarray(self._forward.logits(*self._inputs(rows, decoder_rows)))
        lengths = [len(r) for r in (rows if decoder_rows is None else decoder_rows)]
        return [logits[b, :n] for b, n in enumerate(lengths)]

    # ------------------------------------------------------------------------- tasks
    @property
    def kind(self) -> str:
        """What `score` computes: "mlm", "causal", "seq2seq" (or "other": nothing)."""
        return families.family(self.config).scores(self.config) or "other"

    def fill_mask(self, text_or_texts: str | Sequence[str], top_k: int = 5):
        """HF fill-mask pipeline's output for the same texts (see `fill_mask.fill_mask`)."""
        if self.kind != "mlm":
            raise ValueError(
                f"fill_mask needs an encoder with an MLM head; this model is a "
                f"model of {families.describe(self.config)} with heads {self.config.heads}"
            )
        vocab = self._require_vocab("fill_mask")
        return fill_mask_lib.fill_mask(
            text_or_texts, vocab=vocab, logits_of=self._logits_of, top_k=top_k
        )

    def score(self, texts, targets=None) -> list[scoring.Score]:
        """Pseudo-log-likelihoods (MLM), log-likelihoods (causal LM) or, for seq2seq models,
        log p(target | input) of `score(inputs, targets)` / `score([(input, target), ...])`."""
        vocab = self._require_vocab("score")
        kind = self.kind
        if kind == "seq2seq":
            pairs = texts if targets is None else _pairs(texts, targets)
            return scoring.seq2seq_log_likelihood(
                pairs, vocab=vocab, logits_of=self._logits_of, start_id=self.decoder_start_id
            )
        if targets is not None:
            raise ValueError(f"targets are for seq2seq models; this one scores texts ({kind})")
        if kind == "mlm":
            return scoring.pseudo_log_likelihood(texts, vocab=vocab, logits_of=self._logits_of)
        if kind == "causal":
            return scoring.causal_log_likelihood(
                texts, vocab=vocab, logits_of=self._logits_of, start_id=self.causal_start_id
            )
        raise ValueError(
            f"score covers MLM encoders, causal decoders and seq2seq models; this model is a "
            f"model of {families.describe(self.config)} with heads {self.config.heads}"
        )

    def encode(self, texts: str | Sequence[str]) -> Encoded:
        """Final hidden states of each text and their mean (`Encoded`)."""
        if not families.family(self.config).one_stack:
            raise ValueError(
                f"encode reads one stack's states: an encoder or a decoder, not "
                f"{families.describe(self.config)}"
            )
        vocab = self._require_vocab("encode")
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts:
            raise ValueError("encode needs at least one text, got an empty list")
        rows = [vocab.encode(t) for t in texts]
        out = self._forward.outputs(*self._inputs(rows))
        hidden = [np.asarray(out["hidden"][b, : len(r)]) for b, r in enumerate(rows)]
        pooled = np.stack([h.mean(axis=0) for h in hidden])
        return Encoded(hidden=hidden, pooled=pooled, input_ids=rows)

    def attention(self, texts: str | Sequence[str], *, layer: int = 0) -> list[AttentionMap]:
        """Self-attention probabilities of `layer` of the first stack (the encoder; a
        decoder-only model's decoder), one `AttentionMap` (H, L_i, L_i) per text, as the
        Transformer computes them (`layers/attention.py` sows them; padding cut off)."""
        vocab = self._require_vocab("attention")
        texts = [texts] if isinstance(texts, str) else list(texts)
        rows = [vocab.encode(t) for t in texts]
        ids, mask, types, _ = self._inputs(rows)
        kwargs = {"attention_mask": mask} | ({} if types is None else {"token_type_ids": types})
        if families.family(self.config).seq2seq:
            kwargs["decoder_input_ids"] = np.zeros((len(rows), 1), np.int32)
        _, state = Transformer(self.config).apply(
            {"params": self.params}, ids, **kwargs, mutable=["intermediates"]
        )
        stack = next(iter(state["intermediates"].values()), {})
        key = f"layers_{layer}"
        sown = stack[key] if key in stack else stack.get("layers_shared")  # ALBERT: one block
        found = None if sown is None else sown.get("attention", {}).get("attention_weights")
        if found is None or (key not in stack and layer >= len(found)):
            raise ValueError(
                f"no attention weights for layer {layer}: the stack has {sorted(stack)} (a "
                f"{families.family(self.config).name} of {self.config.num_layers} layers; "
                "DeBERTa's and XLNet's attention layers record none)"
            )
        probs_BHLM = np.asarray(found[0] if key in stack else found[layer])
        return [
            AttentionMap(
                tokens=[vocab.decode([i]) for i in row],
                weights=probs_BHLM[b, :, : len(row), : len(row)],
            )
            for b, row in enumerate(rows)
        ]

    @property
    def generation_config(self) -> dict[str, Any]:
        """The generation options `generate` starts from, HF's names (unset ones: HF's defaults).

        A HF directory's generation_config.json (else its config.json's generation fields);
        for a model without one (an lmsuite run, a transformers instance) the ids it knows: the
        vocabulary's EOS and BOS, the config's pad and decoder start ids, as `to_hf` writes them.
        """
        return dict(self._generation()[0])

    def _generation(self) -> tuple[dict[str, Any], str]:
        """(stored generation options, where they come from)."""
        given = self._generation_given
        if given is not None:
            stored = given.to_diff_dict() if hasattr(given, "to_diff_dict") else dict(given)
            return {k: v for k, v in stored.items() if v is not None}, "the given generation config"
        if self.source and os.path.isfile(os.path.join(self.source, "config.json")):
            source = generation_lib.source_of(self.source)
            return generation_lib.read(self.source), source
        ids = {"pad_token_id": self.config.pad_id}
        if self.vocab is not None:
            ids |= {"eos_token_id": self.vocab.token_id("eos_token")}
            ids |= {"bos_token_id": self.vocab.token_id("bos_token")}
        if families.family(self.config).seq2seq:
            ids["decoder_start_token_id"] = self.decoder_start_id
        stored = {k: v for k, v in ids.items() if v is not None}
        return stored, f"the special ids of {self.source or 'this model'}"

    def generate(self, inputs, *, max_new_tokens: int | None = None, **options):
        """`lmsuite.evaluation.decoding.generate` on a text, texts or an id array, under the
        checkpoint's generation config, as HF's `model.generate(inputs, **options)`.

        `options` are HF's generation options (num_beams, do_sample, max_length,
        no_repeat_ngram_size, ...) and override `generation_config`, which overrides HF's
        defaults; with none, this decodes as HF's `generate` does with the checkpoint's
        config (`generation_config.resolve`: lengths, processors, ids). Options lmsuite does
        not implement raise ValueError unless neutral. Besides them: attention_mask, and seed
        for sampling.

        Texts are encoded with the vocabulary's framing and padded (left for decoders, whose
        continuation follows the prompt; right for seq2seq encoders); the returned ids are
        decoded without special tokens. Ids (B, L) are passed as they are and ids come back.
        """
        from lmsuite.evaluation import decoding  # written alongside; imported only when used

        call = {k: options.pop(k) for k in ("attention_mask", "seed") if k in options}
        given_text = isinstance(inputs, str) or (
            isinstance(inputs, Sequence) and inputs and all(isinstance(t, str) for t in inputs)
        )
        if given_text:
            vocab = self._require_vocab("generate on text")
            texts = [inputs] if isinstance(inputs, str) else list(inputs)
            framing = families.family(self.config).seq2seq
            rows = [vocab.encode(t, add_special_tokens=framing) for t in texts]
            pad = dict(pad_id=self.config.pad_id)
            input_ids, attention_mask = (
                _padded(rows, limit=None, **pad) if framing else _left_padded(rows, **pad)
            )
            call.setdefault("attention_mask", attention_mask)
        else:
            input_ids = np.asarray(inputs)
            if input_ids.ndim != 2:
                raise ValueError(f"generate takes texts or ids (B, L), got shape {input_ids.shape}")
        if max_new_tokens is not None:
            options["max_new_tokens"] = max_new_tokens
        stored, source = self._generation()
        encoder_decoder = families.family(self.config).seq2seq
        resolved = generation_lib.resolve(
            stored,
            options,
            config=self.config,
            prompt_length=1 if encoder_decoder else input_ids.shape[1],
            fallback_start_id=self.decoder_start_id,
            source=source,
        )
        out = decoding.generate(self.config, self.params, input_ids=input_ids, **resolved, **call)
        if not given_text:
            return out
        return [self.vocab.decode(row, skip_special_tokens=True) for row in np.asarray(out)]

    def save_hf(self, out_dir: str) -> list[str]:
        """Writes model.safetensors, config.json, generation_config.json (a model that
        generates) and the tokenizer files HF loads; their paths.

        The exported configs name this model's special ids and carry its generation options,
        so HF's `generate` on out_dir decodes as `generate` here does.
        `transformers.pipeline("fill-mask", model=out_dir)` works on an MLM.
        """
        vocab = self._require_vocab("save_hf (it writes the tokenizer too)")
        stored, _ = self._generation()
        ids = TokenIds(
            eos=stored.get("eos_token_id"),
            bos=stored.get("bos_token_id"),
            pad=vocab.token_id("pad_token"),
        )
        # Its decoding options go along; the ids are to_hf's, from special_ids and the config.
        kept = set(generation_lib.SUPPORTED) | set(generation_lib.UNSUPPORTED)
        kept -= generation_lib.ID_OPTIONS
        options = {k: v for k, v in stored.items() if k in kept}
        to_hf(
            self.config,
            self.params,
            out_dir,
            hf_class=self.hf_class,
            special_ids=ids,
            generation=options,
        )
        written = vocab.save_hf(out_dir)
        files = ["model.safetensors", "config.json", generation_lib.GENERATION_FILE]
        exported = [f"{out_dir}/{f}" for f in files if os.path.isfile(os.path.join(out_dir, f))]
        return sorted({*exported, *written})


def _pairs(inputs, targets) -> list[tuple[str, str]]:
    inputs = [inputs] if isinstance(inputs, str) else list(inputs)
    targets = [targets] if isinstance(targets, str) else list(targets)
    if len(inputs) != len(targets):
        raise ValueError(f"score got {len(inputs)} inputs and {len(targets)} targets")
    return list(zip(inputs, targets, strict=True))


def _left_padded(rows: list[list[int]], *, pad_id: int):
    """(ids, mask) with every row ending at the last column (prompts for a decoder)."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, np.int32)
    mask = np.zeros((len(rows), width), np.int32)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :] = row
        mask[b, width - len(row) :] = 1
    return ids, mask
