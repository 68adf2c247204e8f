"""The option groups nested in `ModelConfig`: what one family (XLNet and Transformer-XL,
ELECTRA) or one position scheme (DeBERTa, TUPE) reads beyond the fields every config shares.

Each group is a frozen dataclass that checks its own values, so a bad option is named by its
group (`XLNetOptions.mem_len must be ...`); how a group fits the rest of the config (which
architecture or position_type may carry it) is `ModelConfig`'s and the family's check.
"""

import dataclasses

XLNET_ATTENTION_TYPES = ("bi", "uni")


def check_bidirectional_buckets(owner: str, n, d) -> None:
    """T5's bidirectional buckets give each direction n // 2 ids, of which n // 4 hold exact
    distances: n must be an even int >= 4 (one exact bucket) and the largest distance d beyond
    them. `owner` names the fields in the error (`TupeOptions`, `ModelConfig`)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 4 or n % 2:
        raise ValueError(f"{owner}.relative_buckets must be an even int >= 4, got {n!r}")
    if not isinstance(d, int) or isinstance(d, bool) or d <= n // 4:
        raise ValueError(
            f"{owner}.relative_max_distance must be an int > relative_buckets // 4 = {n // 4} "
            f"(the exact distances), got {d!r}"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class XLNetOptions:
    """The options of architecture="xlnet" (Yang et al. 2019) and of "transformer_xl" (Dai et al.
    2019: attn_type="uni", reuse_len=None) that sizes alone do not decide.

    mem_len       states each layer keeps as memory for the next segment: the last mem_len of
                  concat(old memory, layer input). None keeps them all (what HF does for
                  mem_len None or 0); a training state needs a fixed number.
    reuse_len     only the first reuse_len positions of a segment enter the memory (XLNet's
                  pretraining reuses the first part of each example); None: all of them.
    clamp_len     relative distances beyond +-clamp_len share the encoding of clamp_len;
                  -1: no clamping.
    attn_type     "bi": every position sees every other (subject to perm_mask); "uni": causal
                  over memory and segment, as Transformer-XL.
    bi_data       the second half of the batch reads the relative distances negated (the
                  backward half of XLNet's bidirectional input pipeline); needs an even batch.
    untie_r       one set of content/position/segment biases per layer (True, as the released
                  checkpoints) or one set shared by all layers.
    same_length   with attn_type="uni", every query sees the same number of keys.
    """

    mem_len: int | None = None
    reuse_len: int | None = None
    clamp_len: int = -1
    attn_type: str = "bi"
    bi_data: bool = False
    untie_r: bool = True
    same_length: bool = False

    def __post_init__(self):
        if self.attn_type not in XLNET_ATTENTION_TYPES:
            raise ValueError(
                f"XLNetOptions.attn_type must be one of {XLNET_ATTENTION_TYPES}, "
                f"got {self.attn_type!r}"
            )
        for name in ("mem_len", "reuse_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(
                    f"XLNetOptions.{name} must be None or a positive int, got {value!r}"
                )
        if not isinstance(self.clamp_len, int) or (self.clamp_len != -1 and self.clamp_len < 1):
            raise ValueError(
                f"XLNetOptions.clamp_len must be -1 (no clamping) or >= 1, got {self.clamp_len!r}"
            )
        for name in ("bi_data", "untie_r", "same_length"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"XLNetOptions.{name} must be a bool, got {getattr(self, name)!r}")

    def replace(self, **changes) -> "XLNetOptions":
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ElectraOptions:
    """ELECTRA's joint pretraining model (Clark et al. 2020; `lmsuite.models.electra`): the
    config's sizes are the discriminator's, the generator is derived from them.

    generator_hidden_fraction  the generator's d_model as a fraction of the discriminator's
                               (the paper: 1/4 small and large, 1/3 base); heads and d_ff scale
                               with it, layers follow generator_layer_fraction.
    generator_layer_fraction   the generator's layers as a fraction of the discriminator's (1.0).
    temperature                the generator's softmax temperature when sampling (1.0).
    """

    generator_hidden_fraction: float = 0.25
    generator_layer_fraction: float = 1.0
    temperature: float = 1.0

    def __post_init__(self):
        for name in ("generator_hidden_fraction", "generator_layer_fraction"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
                raise ValueError(f"ElectraOptions.{name} must lie in (0, 1], got {value!r}")
        if not isinstance(self.temperature, (int, float)) or self.temperature <= 0:
            raise ValueError(f"ElectraOptions.temperature must be > 0, got {self.temperature!r}")

    def replace(self, **changes) -> "ElectraOptions":
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DebertaOptions:
    """DeBERTa's disentangled attention and enhanced mask decoder (He et al. 2021), the options
    of position_type="deberta".

    relative_attention       False: content attention only, still scaled by
                             sqrt(K * (1 + len(pos_att_type))).
    max_relative_positions   k: distances are clamped to +-k; -1: max_length.
    position_buckets         -1: exact distances (v1); v2/v3 put them in log buckets (256).
    share_att_key            positions are projected by the content query/key (v3).
    pos_att_type             a subset of ("c2p", "p2c"): content-to-position and
                             position-to-content terms.
    norm_rel_embeddings      LayerNorm on the relative position table (v3).
    position_biased_input    also add absolute position embeddings to the input.
    emd_layers               the enhanced mask decoder's passes for the MLM head
                             (`enhanced_mask_decoder.py`); 0: the MLM head reads the last layer,
                             as HF's; the paper pretrains with 2.
    """

    relative_attention: bool = True
    max_relative_positions: int = -1
    position_buckets: int = -1
    share_att_key: bool = False
    pos_att_type: tuple[str, ...] = ("c2p", "p2c")
    norm_rel_embeddings: bool = False
    position_biased_input: bool = False
    emd_layers: int = 0

    def __post_init__(self):
        object.__setattr__(self, "pos_att_type", tuple(self.pos_att_type))
        bad = [t for t in self.pos_att_type if t not in ("c2p", "p2c")]
        if bad or len(set(self.pos_att_type)) != len(self.pos_att_type):
            raise ValueError(
                "DebertaOptions.pos_att_type must be distinct entries of ('c2p', 'p2c'), got "
                f"{self.pos_att_type!r}"
            )
        if self.position_buckets != -1 and self.position_buckets < 2:
            raise ValueError(
                f"DebertaOptions.position_buckets must be -1 (none) or >= 2, got "
                f"{self.position_buckets}"
            )
        k = self.max_relative_positions
        if k != -1 and k < 1:
            raise ValueError(f"DebertaOptions.max_relative_positions must be -1 or >= 1, got {k}")
        n = self.emd_layers
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"DebertaOptions.emd_layers must be an int >= 0, got {n!r}")

    def replace(self, **changes) -> "DebertaOptions":
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TupeOptions:
    """TUPE's untied positions (Ke, He, Liu 2021, ICLR), the options of position_type="tupe".

    relative_bias          TUPE-R: add T5's bucketed relative bias, one (R + 1, H) table shared
                           by all layers (the reference's --rel-pos); False: TUPE-A.
    relative_buckets       R, the buckets of distances (even; the reference's rel_pos_bins, 32);
                           one more row holds the others->[CLS] bias.
    relative_max_distance  distances beyond it share the last bucket (max_rel_pos, 128).
    """

    relative_bias: bool = True
    relative_buckets: int = 32
    relative_max_distance: int = 128

    def __post_init__(self):
        if not isinstance(self.relative_bias, bool):
            raise ValueError(
                f"TupeOptions.relative_bias must be a bool, got {self.relative_bias!r}"
            )
        # n >= 4 also keeps a free bucket id n // 2 for the [CLS]->others bias.
        check_bidirectional_buckets(
            "TupeOptions", self.relative_buckets, self.relative_max_distance
        )

    def replace(self, **changes) -> "TupeOptions":
        return dataclasses.replace(self, **changes)
