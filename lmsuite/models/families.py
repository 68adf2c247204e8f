"""One row per architecture family: its module and what callers may ask of it.

`ModelConfig.architecture` names a family; this module is the only code that reads it. A caller
that needs to know how a model is fed, scored or decoded asks the family's row
(`family(config).seq2seq`, `.decodes`, ...) instead of comparing names, so a new family is one
module and one row here.

    family           module                 examples
    encoder          EncoderModel           BERT, RoBERTa, ALBERT, DeBERTa, SpanBERT, UniLM,
                                            TUPE
    electra          ElectraPretrainer      ELECTRA's generator + discriminator (an encoder
                                            config with ModelConfig.electra)
    decoder          DecoderModel           GPT-2
    prefix_lm        PrefixLMModel          T5's decoder-only prefix LM (a DecoderModel)
    encoder_decoder  EncoderDecoderModel    T5, BART, MASS
    xlnet            TwoStreamTransformer   XLNet
    transformer_xl   TransformerXL          Transformer-XL's LM (XLNet's content stream alone,
                                            causal; options in ModelConfig.xlnet)
"""

import dataclasses
from collections.abc import Callable, Sequence

import flax.linen as nn
import numpy as np

from lmsuite.models import inputs as model_inputs
from lmsuite.models import segment_recurrence, stack, two_stream
from lmsuite.models.config import ModelConfig
from lmsuite.models.decoder import DecoderModel, PrefixLMModel
from lmsuite.models.electra import ElectraPretrainer
from lmsuite.models.encoder import EncoderModel
from lmsuite.models.encoder_decoder import EncoderDecoderModel
from lmsuite.models.option_groups import XLNetOptions
from lmsuite.models.two_stream import TransformerXL, TwoStreamTransformer


@dataclasses.dataclass(frozen=True)
class Family:
    """What the rest of lmsuite may know about a family of models.

    name         the family's name (ModelConfig.architecture, or "electra").
    module       the Flax module `Transformer(config)` builds.
    heads        the heads its configs may carry (ModelConfig.heads).
    score        what `LoadedModel.score` computes, given `score_head` where one is named:
                 "mlm" (pseudo-likelihood over masked tokens), "causal" (next-token
                 likelihood), "seq2seq" (targets given inputs), or None.
    decodes      it has a cached autoregressive path (`generate` needs it and an "lm" head).
    seq2seq      it reads encoder inputs and decoder inputs (`decoder_input_ids`), and its
                 cached steps go through the module's `decode` method.
    prefix       it needs `prefix_mask` (B, L): 1 on the bidirectional prefix.
    bidirectional  one stack that sees the whole text: texts are framed `[CLS] x [SEP]`,
                 extractive QA applies and the classification probes read its own `classifier`
                 head (the other families: `lmsuite.evaluation.probe_models`).
    one_stack    `encode` and `attention` read the states of its single stack from the text
                 alone.
    scans        its layers run under ModelConfig.scan_layers (its stacks are `stack.Stack`s).
    check        raises ValueError for a config this family cannot build (called by
                 ModelConfig itself, so gin's error names the file).
    """

    name: str
    module: type[nn.Module]
    heads: tuple[str, ...]
    score: str | None = None
    score_head: str | None = None
    decodes: bool = False
    seq2seq: bool = False
    prefix: bool = False
    bidirectional: bool = False
    one_stack: bool = False
    scans: bool = True
    check: Callable[[ModelConfig], None] = lambda config: None

    def scores(self, config: ModelConfig) -> str | None:
        """`score` when the config has the head it needs, else None."""
        if self.score_head is not None and self.score_head not in config.heads:
            return None
        return self.score

    def can_generate(self, config: ModelConfig) -> bool:
        return self.decodes and "lm" in config.heads


# ----------------------------------------------------------------------- config checks
def _refuse(config: ModelConfig, **expected):
    """Options this family's module does not read: refused rather than dropped silently."""
    for name, value in expected.items():
        if getattr(config, name) != value:
            raise ValueError(
                f"architecture={config.architecture!r} needs ModelConfig.{name}={value!r}, "
                f"got {getattr(config, name)!r}"
            )


def _check_encoder(config: ModelConfig):
    if "lm" in config.heads:
        raise ValueError("an encoder has no causal `lm` head; use `mlm`")


def _check_electra(config: ModelConfig):
    if set(config.heads) != {"mlm", "rtd"}:
        raise ValueError(
            "ModelConfig.electra needs architecture='encoder' and heads=('mlm', 'rtd') (the "
            f"generator's and the discriminator's), got {config.architecture!r}, {config.heads!r}"
        )


def _check_encoder_decoder(config: ModelConfig):
    if config.share_layers != "none":
        raise ValueError("cross-layer sharing is implemented for single-stack models only")
    if config.type_vocab_size:
        raise ValueError(
            "an encoder-decoder reads no token types: ModelConfig.type_vocab_size must be 0, "
            f"got {config.type_vocab_size}"
        )


def _check_xlnet(config: ModelConfig):
    name = config.architecture
    if not isinstance(config.xlnet, XLNetOptions):
        raise ValueError(
            f"architecture={name!r} needs ModelConfig.xlnet=XLNetOptions(...), got {config.xlnet!r}"
        )
    if tuple(config.heads) != ("lm",):
        raise ValueError(f"architecture={name!r} has heads=('lm',) only, got {config.heads!r}")
    _refuse(
        config,
        share_layers="none",
        embedding_dim=None,
        project_embeddings=False,
        norm_type="layernorm",
        norm_position="post",
    )
    if config.d_model % 2:
        raise ValueError(
            f"architecture={name!r} needs an even d_model for its sinusoids, got {config.d_model}"
        )


def _check_transformer_xl(config: ModelConfig):
    _check_xlnet(config)
    opts = config.xlnet
    if opts.attn_type != "uni":
        raise ValueError(
            "architecture='transformer_xl' is a causal LM: it needs XLNetOptions.attn_type="
            f"'uni', got {opts.attn_type!r}"
        )
    if opts.bi_data:
        raise ValueError(
            "architecture='transformer_xl' reads its rows forwards only: it needs "
            "XLNetOptions.bi_data=False, got True"
        )
    if opts.reuse_len is not None:
        raise ValueError(
            "architecture='transformer_xl' keeps every position of a segment in the memory: it "
            f"needs XLNetOptions.reuse_len=None, got {opts.reuse_len}"
        )


# ------------------------------------------------------------------------------ the table
ENCODER = Family(
    name="encoder",
    module=EncoderModel,
    heads=("mlm", "classifier", "rtd", "sbo"),
    score="mlm",
    score_head="mlm",
    bidirectional=True,
    one_stack=True,
    check=_check_encoder,
)
ELECTRA = dataclasses.replace(
    ENCODER, name="electra", module=ElectraPretrainer, heads=("mlm", "rtd"), check=_check_electra
)
DECODER = Family(
    name="decoder",
    module=DecoderModel,
    heads=("lm", "classifier"),
    score="causal",
    score_head="lm",
    decodes=True,
    one_stack=True,
)
PREFIX_LM = Family(
    name="prefix_lm", module=PrefixLMModel, heads=("lm", "classifier"), decodes=True, prefix=True
)
ENCODER_DECODER = Family(
    name="encoder_decoder",
    module=EncoderDecoderModel,
    heads=("lm", "classifier"),
    score="seq2seq",
    decodes=True,
    seq2seq=True,
    check=_check_encoder_decoder,
)
# Their own two-stream layer loop with per-layer memory is not scanned (remat applies).
XLNET = Family(
    name="xlnet", module=TwoStreamTransformer, heads=("lm",), scans=False, check=_check_xlnet
)
TRANSFORMER_XL = Family(
    name="transformer_xl",
    module=TransformerXL,
    heads=("lm",),
    scans=False,
    check=_check_transformer_xl,
)
# The families whose training state carries a memory (segment_recurrence.memory_shapes).
_WITH_MEMORY = (XLNET, TRANSFORMER_XL)

FAMILIES = {
    f.name: f for f in (ENCODER, DECODER, PREFIX_LM, ENCODER_DECODER, XLNET, TRANSFORMER_XL)
}
ARCHITECTURES = tuple(FAMILIES)  # the values of ModelConfig.architecture


def family(config: ModelConfig) -> Family:
    """The row of `config.architecture` (ELECTRA's when an encoder has ModelConfig.electra)."""
    if config.architecture not in FAMILIES:
        raise ValueError(
            f"unknown architecture {config.architecture!r}; expected one of {ARCHITECTURES}"
        )
    if config.electra is not None and config.architecture == "encoder":
        return ELECTRA
    return FAMILIES[config.architecture]


def check(config: ModelConfig):
    """The family-specific part of ModelConfig's validation (see `Family.check`)."""
    if config.architecture not in FAMILIES:
        raise ValueError(
            f"ModelConfig.architecture must be one of {ARCHITECTURES}, got {config.architecture!r}"
        )
    if config.electra is not None and config.architecture != "encoder":
        raise ValueError(
            "ModelConfig.electra needs architecture='encoder' and heads=('mlm', 'rtd') (the "
            f"generator's and the discriminator's), got {config.architecture!r}, {config.heads!r}"
        )
    if config.xlnet is not None and config.architecture not in ("xlnet", "transformer_xl"):
        raise ValueError(
            "ModelConfig.xlnet is for architecture='xlnet' or 'transformer_xl', not "
            f"{config.architecture!r}"
        )
    fam = family(config)
    if config.label_heads and (fam is not ENCODER or config.electra is not None):
        raise ValueError(
            "ModelConfig.label_heads are heads of a plain encoder (not ELECTRA's pretrainer); "
            f"architecture {config.architecture!r} has none, got "
            f"{[h.name for h in config.label_heads]}"
        )
    foreign = [h for h in config.heads if h not in fam.heads]
    if foreign:
        raise ValueError(
            f"heads {foreign} need another architecture: {fam.name!r} takes heads from "
            f"{fam.heads}, got heads={tuple(config.heads)!r}"
        )
    if config.position_type == "deberta" and not fam.bidirectional:
        raise ValueError("position_type='deberta' is implemented for encoders only")
    if config.position_type == "learned_relative" and config.architecture != "encoder":
        # UniLMv2's bias reads the position ids of one bidirectional stack; a decoder's cache and
        # an encoder-decoder's two stacks would need their own paths, and no paper uses them.
        raise ValueError(
            f"position_type='learned_relative' is implemented for architecture='encoder' only, "
            f"got architecture={config.architecture!r}: a decoder takes 'learned', "
            "'sinusoidal', 't5_relative' or 'none'"
        )
    if config.position_type == "tupe" and config.architecture != "encoder":
        # TUPE unties the [CLS] of a bidirectional encoder from the positions; the reference
        # (guolinke/TUPE) has no decoder, and XLNet reads no position_type at all.
        raise ValueError(
            f"position_type='tupe' is implemented for architecture='encoder' only, got "
            f"architecture={config.architecture!r}: other architectures take position_type "
            "'learned', 'sinusoidal', 't5_relative' or 'none'"
        )
    if config.scan_layers and not fam.scans:
        raise ValueError(
            f"ModelConfig.scan_layers=True cannot apply: {describe(config)} runs its own "
            "two-stream layer loop with per-layer memory, which is not scanned (remat applies)"
        )
    fam.check(config)


def accepts(config: ModelConfig, architectures: Sequence[str]) -> bool:
    """Whether the config's architecture is one of `architectures` (a recipe's list)."""
    return config.architecture in architectures


def architecture_name(config: ModelConfig) -> str:
    """The config's architecture name, for messages (ask the row for anything else)."""
    return config.architecture


def describe(config: ModelConfig) -> str:
    """`architecture='...'` for messages."""
    return f"architecture={architecture_name(config)!r}"


# ------------------------------------------------------------------------- building
def Transformer(config: ModelConfig) -> nn.Module:  # noqa: N802  (reads as the model's name)
    """The module of the config's family: `Transformer(config).init(rng, **inputs)`.

    Parameters live outside the module; every family keeps its parameters at the top of the
    tree, so checkpoints and converters address them the same whichever module holds them.
    """
    return family(config).module(config=config)


def example_inputs(config: ModelConfig, *, batch: int = 2, length: int = 8) -> dict:
    """Zero inputs of shape (batch, length) that every family's module accepts: what shape-only
    initialisation (`summary`, converters, AOT) feeds. Batch 2 suits XLNet's bi_data, which
    splits the batch into forward and backward halves."""
    ids = np.zeros((batch, length), np.int32)
    fam = family(config)
    inputs = {"input_ids": ids}
    if fam.seq2seq:
        inputs["decoder_input_ids"] = ids
    if fam.prefix:
        inputs["prefix_mask"] = ids
    return inputs


def init_cache(config: ModelConfig, *, batch_size: int, length: int) -> dict:
    """An empty key/value cache of the decoder stack for `length` positions (`stack.init_cache`).

    An encoder-decoder's first cached call adds each layer's "cross_attention" keys/values of
    the encoder output; later calls then skip the encoder and take input_ids=None.
    """
    fam = family(config)
    if not fam.decodes:
        raise ValueError(
            f"architecture={config.architecture!r} cannot decode with a cache; expected one of "
            f"{decoding_architectures()}"
        )
    return stack.init_cache(
        config,
        num_layers=config.decoder_layers if fam.seq2seq else config.num_layers,
        batch_size=batch_size,
        length=length,
    )


def validate_ids(config: ModelConfig, inputs: dict):
    """Checks a batch's ids against the config (ranges, shapes) on concrete values: inside jit
    the ids are tracers and the modules can check shapes only."""
    if family(config) in _WITH_MEMORY:
        two_stream.validate_inputs(
            config, inputs["input_ids"], token_type_ids=inputs.get("token_type_ids")
        )
        return
    model_inputs.validate_inputs(
        config,
        inputs["input_ids"],
        token_type_ids=inputs.get("token_type_ids"),
        decoder_input_ids=inputs.get("decoder_input_ids"),
    )


def memory_shapes(config: ModelConfig, batch_size: int) -> tuple:
    """The memory an XLNet or Transformer-XL training state carries from step to step
    (`segment_recurrence.memory_shapes`); ValueError for any other family."""
    if family(config) not in _WITH_MEMORY:
        raise ValueError(
            "only architecture='xlnet' or 'transformer_xl' carries memory between steps, got "
            f"{architecture_name(config)!r}"
        )
    return segment_recurrence.memory_shapes(config, batch_size)


def decoding_architectures() -> tuple[str, ...]:
    return tuple(name for name, f in FAMILIES.items() if f.decodes)
