"""How a classification probe reads each family of models: which states, pooled how, from
text framed how. One recipe fine-tunes every pretraining objective's model.

  family           states read                          pooled                framing
  encoder          the stack's (its own `classifier`    first ([CLS])         [CLS] x [SEP]
  (and ELECTRA's   head, BERT's fine-tuning; ELECTRA:
  discriminator)   the discriminator alone)
  encoder_decoder  the encoder stack's final states     mean over real        x </s>
                   (`EncoderDecoderModel.encode`)       tokens
  xlnet            the content stream: no query         last position         x [SEP] [CLS],
                   stream, permutation or memory                              padded left
  decoder,         the causal stack (no memory for      last real token       x </s>
  prefix_lm,       Transformer-XL; a prefix LM's
  transformer_xl   whole text is its prefix)

Why these readings:
  * encoder_decoder: the decoder is not used. T5 fine-tunes text-to-text and BART classifies
    from the decoder's last token; a probe shared by every objective instead reads the encoder,
    mean-pooled over the real tokens, the choice Sentence-T5 (Ni et al. 2021) made for its
    encoder-only models, so that span corruption, denoising and MASS are compared on what
    their encoders learned. The pooled state then passes `heads.Classifier`'s pooler (dense +
    tanh) and output layer.
  * xlnet: XLNet's own fine-tuning (zihangdai/xlnet `modeling.summarize_sequence` with
    summary_type="last", `classifier_utils`): the content stream, the text followed by <sep>
    <cls>, padding on the left so that <cls> is the last position, whose state passes a
    dense + tanh projection and the output layer.
  * decoder, transformer_xl: GPT's classification reads the last real token, the one state
    that has seen the whole text through causal attention.

The non-encoder probes keep their parameters as the pretrained tree does (checkpoints restore
by tree path) plus a new `classifier` ({pooler, output}); params the reading never touches
(a decoder, an LM head) are left out, or, for XLNet's one compact module, kept and unused.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from lmsuite.models import ModelConfig, Transformer, electra, families
from lmsuite.models.heads import Classifier


@dataclasses.dataclass(frozen=True)
class ProbeModel:
    """A family's backbone plus a classifier, as the probes run it.

    config     the backbone's config as fine-tuned (num_labels and dropout set).
    framing    `finetune_data.FRAMINGS`: how texts are framed for it.
    pooling    `heads.POOLINGS`: which state(s) the classifier reads.
    own_head   the family's own `classifier` head (the encoders, unchanged since BERT) rather
               than a `Classifier` over `states`.
    """

    config: ModelConfig
    framing: str
    pooling: str
    own_head: bool = False

    @property
    def family(self) -> str:
        return families.family(self.config).name

    def _head(self) -> Classifier:
        return Classifier(config=self.config, pooling=self.pooling)

    def init(self, rng, *, length: int = 8) -> dict:
        """Random parameters (unboxed): the backbone's and the `classifier`'s."""
        ids = jnp.zeros((1, length), jnp.int32)
        if self.own_head:
            variables = jax.jit(Transformer(self.config).init)(rng, ids)
            return nn.unbox(variables["params"])
        rng_backbone, rng_head = jax.random.split(rng)
        batch = {"input_ids": ids, "attention_mask": jnp.ones_like(ids), "token_type_ids": ids}
        backbone = jax.jit(lambda r: self._states(None, batch, True, None, init_rng=r))(
            rng_backbone
        )
        states = jnp.zeros((1, length, self.config.d_model), jnp.float32)
        head = jax.jit(self._head().init)(rng_head, states, mask_BL=batch["attention_mask"])
        return nn.unbox({**backbone, "classifier": head["params"]})

    def _states(self, params, batch, deterministic, rng, *, init_rng=None):
        """The backbone's states (B, L, D); with `init_rng`, its initial parameters instead."""
        model = Transformer(self.config)
        kwargs = dict(attention_mask=batch["attention_mask"], deterministic=deterministic)
        name = self.family
        if name == "encoder_decoder":
            kwargs["method"] = "encode"
        elif name == "xlnet":
            kwargs["token_type_ids"] = batch["token_type_ids"]
        elif name == "prefix_lm":  # the whole text is the bidirectional prefix
            kwargs["prefix_mask"] = batch["attention_mask"]
        if init_rng is not None:
            return model.init(init_rng, batch["input_ids"], **kwargs)["params"]
        rngs = {} if rng is None else {"dropout": rng}
        out = model.apply({"params": params}, batch["input_ids"], rngs=rngs, **kwargs)
        return out if name == "encoder_decoder" else out["hidden"]

    def states(self, params, batch, *, deterministic: bool = True, rng=None):
        """The states the classifier pools (B, L, D); not for `own_head` probes."""
        if self.own_head:
            raise ValueError(f"the {self.family} probe reads its own classifier head")
        return self._states(params, batch, deterministic, rng)

    def logits(self, params, batch, *, deterministic: bool = True, rng=None):
        """Classifier logits (B, num_labels) of a batch of `finetune_data.encode_examples`."""
        rngs = {} if rng is None else {"dropout": rng}
        if self.own_head:
            # (a model without a token-type table, DeBERTa v3's and RoBERTa's, reads none)
            types = batch["token_type_ids"] if self.config.type_vocab_size else None
            return Transformer(self.config).apply(
                {"params": params},
                batch["input_ids"],
                attention_mask=batch["attention_mask"],
                token_type_ids=types,
                deterministic=deterministic,
                rngs=rngs,
            )["classifier_logits"]
        if rng is not None:
            rng, head_rng = jax.random.split(rng)
            rngs = {"dropout": head_rng}
        states = self._states(params, batch, deterministic, rng)
        return self._head().apply(
            {"params": params["classifier"]},
            states,
            mask_BL=batch["attention_mask"],
            deterministic=deterministic,
            rngs=rngs,
        )

    def keep(self, key: str) -> bool:
        """Whether parameter `key` ("a/b/c") is taken from the pretrained checkpoint: BERT keeps
        a pretrained pooler where there is one; the other families' classifier is all new."""
        if self.own_head:
            return not key.startswith("classifier/output/")
        return not key.startswith("classifier/")


SUPPORTED = ("encoder", "electra", "encoder_decoder", "xlnet", "decoder", "prefix_lm",
             "transformer_xl")  # fmt: skip


def pretrained_backbone(config: ModelConfig, params) -> tuple[ModelConfig, dict]:
    """(config, params) of what a probe fine-tunes: ELECTRA's discriminator alone, laid out
    as a plain encoder (`electra.discriminator_params`); every other model as it is."""
    if families.family(config) is families.ELECTRA:
        return electra.discriminator_config(config), electra.discriminator_params(params)
    return config, params


def probe_for(config: ModelConfig, *, num_labels: int, dropout_rate=None) -> ProbeModel:
    """The `ProbeModel` of a (pretrained) config: see the module docstring's table.

    Raises:
      ValueError: num_labels < 2, or a family no probe reads (named, with those supported).
    """
    if num_labels < 2:
        raise ValueError(f"num_labels must be >= 2, got {num_labels}")
    if families.family(config) is families.ELECTRA:
        config = electra.discriminator_config(config)
    fam = families.family(config)
    if fam.name not in SUPPORTED:
        raise ValueError(
            f"classification probes cannot read {families.describe(config)} "
            f"(family {fam.name!r}); supported families: {SUPPORTED}"
        )
    changes = dict(num_labels=num_labels)
    if dropout_rate is not None:
        changes.update(dropout_rate=dropout_rate, attention_dropout_rate=dropout_rate)
    if fam.bidirectional:
        if config.emd_layers:  # DeBERTa's enhanced mask decoder feeds only the MLM head: its
            # fine-tuning reads the last layer (the released code and HF drop the decoder)
            changes["deberta"] = dataclasses.replace(config.deberta, emd_layers=0)
        config = config.replace(heads=("classifier",), **changes)
        return ProbeModel(config=config, framing="cls_sep", pooling="first", own_head=True)
    if fam.name == "encoder_decoder":
        return ProbeModel(config.replace(heads=(), **changes), framing="eos", pooling="mean")
    if fam.name == "xlnet":  # one direction of reading: XLNet fine-tunes without bi_data
        xlnet = config.xlnet.replace(bi_data=False)
        return ProbeModel(config.replace(xlnet=xlnet, **changes), framing="xlnet", pooling="last")
    if fam.name == "transformer_xl":  # its heads are ("lm",) by its check; the head goes unread
        return ProbeModel(config.replace(**changes), framing="eos", pooling="last")
    return ProbeModel(config.replace(heads=(), **changes), framing="eos", pooling="last")
