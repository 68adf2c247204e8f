"""`ModelConfig`: the one frozen dataclass that describes every lmsuite architecture."""

import dataclasses
from typing import Any

import jax.numpy as jnp

from lmsuite.layers.mlp import ACTIVATIONS
from lmsuite.layers.norm import NORM_TYPES

# The types of ModelConfig's option-group fields (and the bucket check it shares with TUPE's);
# also importable from here, for code written before the groups had a module of their own.
from lmsuite.models.option_groups import (
    DebertaOptions,
    ElectraOptions,
    TupeOptions,
    XLNetOptions,
    check_bidirectional_buckets,
)

POSITION_TYPES = (
    "learned", "learned_relative", "sinusoidal", "t5_relative", "deberta", "tupe", "none",
)  # fmt: skip
# Position types whose absolute table (or sinusoids) enters the embeddings, with position_offset.
ABSOLUTE_INPUT_POSITIONS = ("learned", "learned_relative", "sinusoidal")
SHARING = ("none", "all", "attention", "ffn")
HEADS = ("mlm", "lm", "classifier", "rtd", "sbo")
DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = ("none", "dots", "full")

# ModelConfig fields before the DeBERTa options were nested (run.json files written then):
# "deberta_<name>" is DebertaOptions.<name>.
_FLAT_DEBERTA_PREFIX = "deberta_"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LabelHead:
    """One more classification head of a multi-task encoder (ERNIE 2.0's tasks, whose arities
    differ): `{name}_logits` over `num_labels` classes for each row (the first token's state
    through its own pooler, as `classifier`) or, with `per_token`, for every token.

    Example: LabelHead(name="sentence_distance", num_labels=3) -> outputs["sentence_distance_
    logits"] of shape (B, 3), parameters under `label_sentence_distance/`.
    """

    name: str
    num_labels: int
    per_token: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier() or self.name in HEADS:
            raise ValueError(
                f"LabelHead.name must be an identifier other than the heads {HEADS}, got "
                f"{self.name!r}"
            )
        if not isinstance(self.num_labels, int) or self.num_labels < 2:
            raise ValueError(
                f"LabelHead {self.name!r}: num_labels must be an int >= 2, got {self.num_labels!r}"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Everything that decides parameter shapes and the forward computation.

    Variants are made with `config.replace(...)`. Field groups:
      sizes            vocab_size V, d_model D, num_heads H, head_dim K (default D // H), d_ff F,
                       num_layers (encoder or decoder-only stack), num_decoder_layers,
                       embedding_dim E (default D; E != D factorises the embedding as in ALBERT),
                       project_embeddings (keep the E -> D projection even when E == D: ALBERT
                       always has one),
                       type_vocab_size T (0: no segment embeddings), max_length (position table).
      positions        position_type; position_offset (RoBERTa/BART reserve the first 2 rows);
                       relative_buckets / relative_max_distance (T5's buckets, for t5_relative
                       and learned_relative: BERT's learned table plus one bucketed bias over
                       the position-id distances shared by the layers, UniLMv2's); deberta
                       (DebertaOptions, set exactly when position_type="deberta"; left None,
                       it takes the defaults); tupe (TupeOptions, likewise for "tupe").
      block            activation (gelu, gelu_tanh, relu, silu, geglu, geglu_tanh, swiglu),
                       norm_type, norm_eps, norm_position ("post" as BERT, "pre" as GPT-2/T5),
                       use_bias, scale_attention (False: T5 folds 1/sqrt(K) into the init).
      embeddings       embedding_norm (LayerNorm after the sum, BERT), scale_embeddings
                       (multiply tokens by sqrt(D), BART/Transformer), final_norm (after the
                       last block, needed by pre-norm stacks), embedding_projection_first /
                       embedding_projection_bias (DeBERTa: the E -> D projection comes before
                       the norm and has no bias), mask_padded_embeddings (DeBERTa: zero the
                       embeddings of padded tokens given a (B, L) attention_mask).
      sharing          share_layers: none, all (ALBERT), attention, ffn (ALBERT's ablation).
      layers           remat: what each block keeps for the backward pass (its memory against
                       recomputation; the parameters and outputs are the same whichever):
                         "none"  every activation (no rematerialisation);
                         "dots"  the outputs of the matmuls against weights (projections, FFN),
                                 through jax.checkpoint_policies.dots_with_no_batch_dims_saveable:
                                 the attention einsums (B and H are batch dimensions there) and
                                 every elementwise op are recomputed, so the (B, H, L, L) scores
                                 are never stored, which checkpoint_dots would keep;
                         "full"  nothing inside a block: its input only, the block is run again
                                 in the backward pass.
                       scan_layers: the stack runs one block under nn.scan over parameters
                       stacked on a leading "layers" axis (`<stack>/layers/...` instead of
                       `<stack>/layers_{i}/...`; `scan_layout` converts): the compiled step holds
                       one block, not num_layers. Pair it with remat: under a scan without one,
                       every layer's residuals are stacked, more than the unrolled step keeps
                       (docs/tpu.md). Not with share_layers (nothing to stack), the enhanced
                       mask decoder or XLNet / Transformer-XL; cached decoding runs the
                       unscanned layout.
      heads            any of mlm (transform + vocabulary), lm (vocabulary), classifier
                       (pooler + num_labels, used for NSP/SOP/fine-tuning), rtd (ELECTRA),
                       sbo (SpanBERT's span boundary head, `span_boundary.py`: sbo_max_span
                       offset rows of width sbo_position_dim); label_heads (LabelHead:
                       a multi-task encoder's row or token classifiers of their own arity).
      xlnet            XLNetOptions, set exactly when architecture="xlnet" or "transformer_xl"
                       (which also reads scale_embeddings). XLNet reads the
                       sizes, activation, norm_eps, dropout, init_stddev, tie_embeddings,
                       output_bias and dtype; its positions are relative sinusoids, so
                       position_type, max_length and type_vocab_size play no part.
      attention        attention_dropout_rate; attention_impl ("plain": einsum and softmax; "fused":
                       a kernel per backend, with the plain path where it cannot apply, see
                       `lmsuite.layers.fused_attention`); float32_scores (under bfloat16 the
                       plain path's scores q.k accumulate and stay float32, as fused kernels
                       keep them; False rounds them to dtype, moving fewer bytes at a risk to
                       learning: `lmsuite.layers.attention.attention_scores`).
      electra          ElectraOptions: the sizes are the discriminator's, a generator is derived
                       (`lmsuite.models.electra`); needs heads ("mlm", "rtd").
    """

    architecture: str = "encoder"
    vocab_size: int = 30522
    d_model: int = 768
    num_heads: int = 12
    head_dim: int | None = None
    d_ff: int = 3072
    num_layers: int = 12
    num_decoder_layers: int | None = None
    embedding_dim: int | None = None
    project_embeddings: bool = False  # ALBERT: an E -> D projection even when E == D
    type_vocab_size: int = 2
    max_length: int = 512

    position_type: str = "learned"
    position_offset: int = 0
    relative_buckets: int = 32
    relative_max_distance: int = 128
    deberta: DebertaOptions | None = None  # DeBERTa's disentangled attention
    tupe: TupeOptions | None = None  # TUPE's untied positional attention

    activation: str = "gelu"
    head_activation: str | None = None  # MLM/RTD transform activation; default: activation
    norm_type: str = "layernorm"
    norm_eps: float = 1e-12
    norm_position: str = "post"
    use_bias: bool = True
    use_key_bias: bool = True
    scale_attention: bool = True
    embedding_norm: bool = True
    scale_embeddings: bool = False
    final_norm: bool = False
    mask_padded_queries: bool = False  # DeBERTa: padded queries attend to nothing
    embedding_projection_first: bool = False  # DeBERTa: E -> D projection before the norm
    embedding_projection_bias: bool = True  # DeBERTa's embed_proj has none
    mask_padded_embeddings: bool = False  # DeBERTa: embeddings * attention_mask

    share_layers: str = "none"
    remat: str = "none"  # one of REMAT_POLICIES; see "layers" above
    scan_layers: bool = False  # nn.scan over one block with stacked parameters

    heads: tuple[str, ...] = ("mlm",)
    mlm_transform: bool = True
    tie_embeddings: bool = True
    output_bias: bool = True
    scale_tied_output: bool = False  # T5 1.0: multiply by D**-0.5 before the tied projection
    num_labels: int = 2
    sbo_max_span: int = 15  # SpanBERT's --max-pair-targets: tokens per span with an SBO target
    sbo_position_dim: int = 200  # the width of SpanBERT's offset embeddings
    label_heads: tuple[LabelHead, ...] = ()  # a multi-task encoder's further heads

    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    attention_impl: str = "plain"  # "fused": splash (TPU) / cuDNN (GPU), see layers/fused_attention
    float32_scores: bool = True  # attention scores in float32 under bfloat16 (see "attention")
    mlp_inner_dropout: bool = False  # T5 applies dropout between the two FFN matmuls
    init_stddev: float = 0.02

    pad_id: int = 0
    decoder_start_id: int = 0
    dtype: str = "float32"

    xlnet: XLNetOptions | None = None
    electra: ElectraOptions | None = None  # ELECTRA: a joint generator + discriminator

    def __post_init__(self):
        if self.position_type == "deberta" and self.deberta is None:
            object.__setattr__(self, "deberta", DebertaOptions())
        if self.position_type == "tupe" and self.tupe is None:
            object.__setattr__(self, "tupe", TupeOptions())
        self._validate()

    # ----------------------------------------------------------------------------- derived
    @property
    def emd_layers(self) -> int:
        """The enhanced mask decoder's passes (DebertaOptions.emd_layers); 0 without one."""
        return 0 if self.deberta is None else self.deberta.emd_layers

    @property
    def head_width(self) -> int:
        """K: the per-head width."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

    @property
    def embed_width(self) -> int:
        """E: the token-embedding width."""
        return self.embedding_dim if self.embedding_dim is not None else self.d_model

    @property
    def decoder_layers(self) -> int:
        return self.num_decoder_layers if self.num_decoder_layers is not None else self.num_layers

    @property
    def compute_dtype(self) -> Any:
        return jnp.dtype(self.dtype)

    @property
    def mlm_activation(self) -> str:
        return self.head_activation if self.head_activation is not None else self.activation

    def to_json(self) -> dict[str, Any]:
        """The config as JSON-ready values (tuples become lists); `from_json` reverses it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> "ModelConfig":
        """The config `to_json` wrote. Fields this lmsuite does not know are refused by name
        (a run written by another version); fields it added since take their defaults.

        Example: ModelConfig.from_json({"d_model": 64, "heads": ["lm"], "xlnet": {"mem_len": 8}})
          -> ModelConfig(d_model=64, heads=("lm",), xlnet=XLNetOptions(mem_len=8), ...)
        """
        values = _nest_flat_deberta(values)
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(
                f"ModelConfig has no fields {unknown} (a config written by another lmsuite?); "
                f"its fields are {sorted(known)}"
            )
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        if isinstance(fields.get("xlnet"), dict):
            fields["xlnet"] = XLNetOptions(**fields["xlnet"])
        if isinstance(fields.get("electra"), dict):
            fields["electra"] = ElectraOptions(**fields["electra"])
        if isinstance(fields.get("deberta"), dict):
            fields["deberta"] = DebertaOptions(**fields["deberta"])
        if isinstance(fields.get("tupe"), dict):
            fields["tupe"] = TupeOptions(**fields["tupe"])
        fields["label_heads"] = tuple(
            LabelHead(**h) if isinstance(h, dict) else h for h in fields.get("label_heads", ())
        )
        return cls(**fields)

    @property
    def max_positions(self) -> int:
        """The longest sequence the position table can index: an absolute table read from
        row position_offset on (DeBERTa's too, with position_biased_input) has that many fewer."""
        biased = self.deberta is not None and self.deberta.position_biased_input
        if self.position_type in ABSOLUTE_INPUT_POSITIONS or biased:
            return self.max_length - self.position_offset
        return self.max_length

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    # -------------------------------------------------------------------------- validation
    def _validate(self):
        def choice(name, options):
            value = getattr(self, name)
            if value not in options:
                raise ValueError(f"ModelConfig.{name} must be one of {options}, got {value!r}")

        def positive(name):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")

        choice("position_type", POSITION_TYPES)
        choice("share_layers", SHARING)
        choice("norm_type", NORM_TYPES)
        choice("norm_position", ("pre", "post"))
        choice("activation", tuple(ACTIVATIONS))
        choice("dtype", DTYPES)
        choice("attention_impl", ("plain", "fused"))
        if not isinstance(self.float32_scores, bool):
            raise ValueError(
                f"ModelConfig.float32_scores must be True or False, got {self.float32_scores!r}"
            )
        if self.head_activation is not None:
            choice("head_activation", tuple(ACTIVATIONS))
        for name in ("vocab_size", "d_model", "num_heads", "d_ff", "num_layers", "max_length"):
            positive(name)
        for name in ("sbo_max_span", "sbo_position_dim"):
            positive(name)
        if self.position_type == "learned_relative":
            check_bidirectional_buckets(
                "ModelConfig", self.relative_buckets, self.relative_max_distance
            )
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; "
                "set head_dim explicitly"
            )
        if self.type_vocab_size < 0:
            raise ValueError(f"type_vocab_size must be >= 0, got {self.type_vocab_size}")
        if not 0 <= self.position_offset < self.max_length:
            raise ValueError(
                f"position_offset={self.position_offset} must lie in "
                f"[0, max_length={self.max_length})"
            )
        unknown = [h for h in self.heads if h not in HEADS]
        if unknown:
            raise ValueError(f"unknown heads {unknown}; expected a subset of {HEADS}")
        if not all(isinstance(h, LabelHead) for h in self.label_heads):
            raise ValueError(f"label_heads must be LabelHead values, got {self.label_heads!r}")
        names = [h.name for h in self.label_heads]
        if len(set(names)) != len(names):
            raise ValueError(f"label_heads need distinct names, got {names}")
        if self.deberta is not None and self.position_type != "deberta":
            raise ValueError(
                f"ModelConfig.deberta is for position_type='deberta', not {self.position_type!r}"
            )
        if self.tupe is not None and self.position_type != "tupe":
            raise ValueError(
                f"ModelConfig.tupe is for position_type='tupe', not {self.position_type!r}"
            )
        self._validate_emd()
        self._validate_layers()
        for name in ("dropout_rate", "attention_dropout_rate"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"ModelConfig.{name} must lie in [0, 1), got {value}")
        # The family's own checks (heads it carries, options it reads): `families.check`. Imported
        # here because the family modules import this one.
        from lmsuite.models import families

        families.check(self)

    def _validate_emd(self):
        n = self.emd_layers
        if n == 0:
            return
        # The reference decoder (DeBERTa apps/models/masked_language_model.py) exists for the
        # post-norm, relative-position DeBERTa only; it runs no EMD with position_biased_input.
        if self.deberta.position_biased_input:
            raise ValueError(
                f"DebertaOptions.emd_layers={n} needs DebertaOptions.position_biased_input=False, "
                "got True"
            )
        expected = dict(norm_position="post", final_norm=False)
        for name, value in expected.items():
            if getattr(self, name) != value:
                raise ValueError(
                    f"DebertaOptions.emd_layers={n} needs ModelConfig.{name}={value!r}, "
                    f"got {getattr(self, name)!r}"
                )
        if "mlm" not in self.heads:
            raise ValueError(
                f"DebertaOptions.emd_layers={n} feeds the mlm head, but heads={self.heads}"
            )
        if self.num_layers < 2:
            raise ValueError(
                f"DebertaOptions.emd_layers={n} reads the second-to-last layer: needs "
                f"num_layers >= 2, got {self.num_layers}"
            )

    def _validate_layers(self):
        # Which families scan at all is their row's `scans` (`families.check`).
        if self.remat not in REMAT_POLICIES:
            raise ValueError(
                f"ModelConfig.remat must be one of {REMAT_POLICIES}, got {self.remat!r}"
            )
        if not isinstance(self.scan_layers, bool):
            raise ValueError(f"ModelConfig.scan_layers must be a bool, got {self.scan_layers!r}")
        if not self.scan_layers:
            return
        why = None
        if self.share_layers != "none":
            why = (
                f"share_layers={self.share_layers!r} shares parameters between layers, so there "
                "is no per-layer stack to scan over (remat still applies)"
            )
        elif self.emd_layers:
            why = (
                f"DebertaOptions.emd_layers={self.emd_layers}: the enhanced mask decoder reruns "
                "the last block on the second-to-last layer's output, which a scan does not expose"
            )
        if why:
            raise ValueError(f"ModelConfig.scan_layers=True cannot apply: {why}")


def _nest_flat_deberta(values: dict[str, Any]) -> dict[str, Any]:
    """A config written before DebertaOptions existed, with its "deberta_<name>" fields nested
    as "deberta": {...} (kept for position_type="deberta", where they applied; dropped
    elsewhere, where they were unread defaults)."""
    flat = {k: v for k, v in values.items() if k.startswith(_FLAT_DEBERTA_PREFIX)}
    if not flat:
        return values
    out = {k: v for k, v in values.items() if k not in flat}
    if values.get("position_type") == "deberta":
        out["deberta"] = {k.removeprefix(_FLAT_DEBERTA_PREFIX): v for k, v in flat.items()}
    return out
