"""`from_hf` / `to_hf`: HuggingFace checkpoints in and out of lmsuite.

model = from_hf(hf_model_or_dir)      # .config, .params, .logits(...) == HF's .logits
model.logits_and_mems(...)             # XLNet: (HF's .logits, HF's .mems)
to_hf(config, params, out_dir)         # safetensors + config.json that transformers loads
to_hf(config, params, out_dir, special_ids=vocab.special_ids(v))   # another vocabulary's ids
from_hf(hf_model, scan_layers=True)    # params in the scanned layout (ModelConfig.scan_layers)

HF checkpoints hold one entry per layer: a scanned config's parameters are unscanned on export
and scanned after import (`lmsuite.models.scan_layout`).
"""

import dataclasses
import json
import os
import pickle
import re
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from lmsuite import extras
from lmsuite.convert import common
from lmsuite.models import ModelConfig, Transformer, families, scan_layout


def _families() -> dict[str, common.Family]:
    # Imported here so that `import lmsuite.convert` stays cheap; each module defines FAMILY.
    from lmsuite.convert import registry

    return registry.families_by_class()


@dataclasses.dataclass
class ConvertedModel:
    """An lmsuite model built from a HF checkpoint."""

    config: ModelConfig
    params: Any
    hf_class: str
    hf_config: Any
    family: common.Family

    def __post_init__(self):
        model = Transformer(self.config)
        self._apply = jax.jit(lambda p, kw: model.apply({"params": p}, **kw))

    def outputs(
        self, input_ids, attention_mask=None, token_type_ids=None, decoder_input_ids=None, **extra
    ) -> dict[str, Any]:
        """Every output of the lmsuite model, on HF-style inputs (numpy or torch).

        `extra` holds the HF keyword inputs only some families take (`Family.extra_inputs`,
        e.g. XLNet's perm_mask, target_mapping, mems).
        """
        unknown = sorted(set(extra) - set(self.family.extra_inputs))
        if unknown:
            raise ValueError(
                f"{self.hf_class} takes no {unknown}; its extra inputs are "
                f"{list(self.family.extra_inputs)}"
            )
        kwargs = self.family.model_inputs(
            self.hf_config,
            _np(input_ids),
            attention_mask=_np(attention_mask),
            token_type_ids=_np(token_type_ids),
            decoder_input_ids=_np(decoder_input_ids),
            **{k: jax.tree.map(_np, v) for k, v in extra.items()},
        )
        # Checked here, on concrete values, since inside jit the ids are tracers.
        families.validate_ids(self.config, kwargs)
        return jax.tree.map(np.asarray, self._apply(self.params, kwargs))

    def logits(
        self, input_ids, attention_mask=None, token_type_ids=None, decoder_input_ids=None, **extra
    ):
        """The array HF's `.logits` (or `.prediction_logits`) holds for the same inputs."""
        out = self.outputs(input_ids, attention_mask, token_type_ids, decoder_input_ids, **extra)
        return self.family.hf_logits(out, self.hf_class)

    def logits_and_mems(self, input_ids, attention_mask=None, token_type_ids=None, **extra):
        """(HF's `.logits`, HF's `.mems`) for a family with a memory (XLNet, with use_mems)."""
        if self.family.hf_mems is None:
            raise ValueError(f"{self.hf_class} keeps no memory between segments")
        out = self.outputs(input_ids, attention_mask, token_type_ids, **extra)
        return self.family.hf_logits(out, self.hf_class), self.family.hf_mems(out, self.hf_class)


def _np(x):
    if x is None:
        return None
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _import_transformers(feature: str = "HF import/export"):
    return extras.require("transformers", feature=feature)


def _state_dict(hf_model) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().float().numpy() for k, v in hf_model.state_dict().items()}


def _from_pretrained(hf_class, path: str):
    """`hf_class.from_pretrained(path)`, a pickled checkpoint that torch's safe loader refuses
    named as a bad input. lmsuite never loads such a file unsafely: it can run any code."""
    try:
        return hf_class.from_pretrained(path)
    except pickle.UnpicklingError as error:
        files = sorted(f for f in os.listdir(path) if f.endswith((".bin", ".pt", ".pth")))
        named = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
        what = f" (e.g. {named.group(1)})" if named else ""
        raise ValueError(
            f"{os.path.join(path, files[0]) if files else path} holds Python objects{what} that "
            "torch's safe loader refuses, and lmsuite does not load it otherwise; use a "
            "checkpoint saved as model.safetensors instead"
        ) from error


def from_hf(hf_model_or_dir, *, scan_layers: bool = False) -> ConvertedModel:
    """Converts a HF model (an instance, or a directory holding config.json and weights).

    `scan_layers`: the config gets ModelConfig.scan_layers and the parameters its layout.
    """
    families = _families()
    if isinstance(hf_model_or_dir, str | os.PathLike):
        path = os.fspath(hf_model_or_dir)
        config_path = os.path.join(path, "config.json")
        if not os.path.exists(config_path):
            raise ValueError(f"{path!r} is not a HF checkpoint directory: no config.json")
        with open(config_path) as f:
            archs = json.load(f).get("architectures") or []
        if len(archs) != 1 or archs[0] not in families:
            raise ValueError(
                f"{config_path} names architectures {archs}; lmsuite converts exactly one of "
                f"{sorted(families)}"
            )
        transformers = _import_transformers()
        hf_model = _from_pretrained(getattr(transformers, archs[0]), path)
    else:
        hf_model = hf_model_or_dir
    hf_class = type(hf_model).__name__
    if hf_class not in families:
        raise ValueError(f"cannot convert {hf_class}; supported classes: {sorted(families)}")
    family = families[hf_class]
    hf_model.eval()
    config = family.config_from_hf(hf_model.config, hf_class)
    flat = family.params_from_hf(_state_dict(hf_model), config, hf_class)
    params = common.check_params(config, flat)
    if scan_layers:
        config = config.replace(scan_layers=True)
        params = scan_layout.scan_params(params, config)
    return ConvertedModel(config, params, hf_class, hf_model.config, family)


def infer_hf_class(config: ModelConfig) -> str:
    """The HF class an lmsuite config corresponds to, when that is unambiguous."""
    from lmsuite.convert import registry

    return registry.infer_hf_class(config)


@dataclasses.dataclass(frozen=True)
class TokenIds:
    """The special ids an export names in config.json and generation_config.json.

    Any object with `eos`, `bos` and `pad` attributes does as well, e.g.
    `lmsuite.data.vocab.special_ids(vocab)`. `pad` None: the model's own ModelConfig.pad_id;
    given, it must be that id (RoBERTa's positions and BART's decoder shift read it).
    """

    eos: int | Sequence[int] | None
    bos: int | None
    pad: int | None = None


# lmsuite.data.vocab's layout: <s> 5, </s> 6 (convert may not import data; a test pins them).
LMSUITE_TOKEN_IDS = TokenIds(eos=6, bos=5)
# The generation options to_hf writes from `special_ids` and the ModelConfig, not `generation`.
_ID_OPTIONS = ("eos_token_id", "bos_token_id", "pad_token_id", "decoder_start_token_id")


def _checked_ids(special_ids, config: ModelConfig) -> dict[str, Any]:
    """{HF id option: id} for config.json and generation_config.json, each id checked."""
    missing = [a for a in ("eos", "bos", "pad") if not hasattr(special_ids, a)]
    if missing:
        raise ValueError(
            f"special_ids needs attributes eos, bos and pad (a TokenIds or a vocabulary's "
            f"SpecialIds); {special_ids!r} lacks {missing}"
        )
    pad = special_ids.pad
    if pad is not None and pad != config.pad_id:
        raise ValueError(
            f"special_ids.pad={pad} differs from ModelConfig.pad_id={config.pad_id}, the id the "
            "model pads with: export with a vocabulary whose pad id is the model's"
        )
    ids = {"eos_token_id": special_ids.eos, "bos_token_id": special_ids.bos}
    ids["pad_token_id"] = config.pad_id
    if families.family(config).seq2seq:
        ids["decoder_start_token_id"] = config.decoder_start_id
    for name, value in ids.items():
        values = value if isinstance(value, Sequence) else [value]
        if not all(v is None or 0 <= v < config.vocab_size for v in values):
            raise ValueError(f"{name}={value!r} is not an id of the {config.vocab_size} tokens")
    if isinstance(ids["eos_token_id"], Sequence):
        ids["eos_token_id"] = list(ids["eos_token_id"])
    return ids


def to_hf(
    config: ModelConfig,
    params,
    out_dir: str,
    *,
    hf_class: str | None = None,
    special_ids=None,
    generation: Mapping[str, Any] | None = None,
) -> str:
    """Writes model.safetensors, config.json and, for a class that generates,
    generation_config.json, that `transformers` loads; returns out_dir.

    config.json holds the vocabulary's special ids and the head's true tying, so that HF's
    `generate` stops at the vocabulary's EOS and keeps an untied head its own.

    Args:
      hf_class: the HF class to write (None: `infer_hf_class`).
      special_ids: the vocabulary's EOS, BOS and pad ids (`TokenIds`, or
        `lmsuite.data.vocab.special_ids(vocab)`); None: lmsuite's vocabulary layout
        (`LMSUITE_TOKEN_IDS`), right for every lmsuite run, wrong for a model converted from
        a HF vocabulary (pass its ids). The pad and decoder start ids are the ModelConfig's.
      generation: further HF generation options for generation_config.json (e.g. a HF
        checkpoint's num_beams); unset ones stay HF's defaults, as `generate` uses them for an
        lmsuite run.
    """
    from safetensors.numpy import save_file

    from lmsuite.convert import registry

    registry.refuse_without_hf_class(config)  # also when hf_class names a class that would load
    transformers = _import_transformers("HF export (to_hf)")  # the HF config classes
    families = _families()
    hf_class = hf_class or infer_hf_class(config)
    if hf_class not in families:
        raise ValueError(f"cannot export to {hf_class}; supported classes: {sorted(families)}")
    family = families[hf_class]
    if config.scan_layers:
        params = scan_layout.unscan_params(nn.unbox(params), config)
        config = config.replace(scan_layers=False)
    flat = common.flatten(params)
    common.check_params(config, flat)
    generation = dict(generation or {})
    clashes = sorted(set(generation) & set(_ID_OPTIONS))
    if clashes:
        raise ValueError(f"generation= may not set {clashes}: they come from special_ids")
    ids = _checked_ids(LMSUITE_TOKEN_IDS if special_ids is None else special_ids, config)
    hf_config = family.config_to_hf(config, hf_class)
    hf_config.architectures = [hf_class]
    for name, value in ids.items():
        setattr(hf_config, name, value)
    # BART's config carries forced_eos_token_id=2 (BART's EOS); config.json says what
    # generation_config.json says.
    for name in ("forced_bos_token_id", "forced_eos_token_id"):
        if hasattr(hf_config, name):
            setattr(hf_config, name, generation.get(name))
    json_fields = family.config_json(config) if family.config_json else {}
    tied = json_fields.get("tie_word_embeddings", hf_config.tie_word_embeddings)
    if tied and not config.tie_embeddings:
        raise ValueError(
            f"{hf_class}'s config says tie_word_embeddings=True for an untied head: HF would "
            "replace the head's weights with the embeddings"
        )
    state = family.params_to_hf(flat, config, hf_class)
    os.makedirs(out_dir, exist_ok=True)
    save_file(
        {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in state.items()},
        os.path.join(out_dir, "model.safetensors"),
        metadata={"format": "pt"},
    )
    hf_config.save_pretrained(out_dir)
    if json_fields:
        path = os.path.join(out_dir, "config.json")
        with open(path) as f:
            saved = json.load(f)
        with open(path, "w") as f:
            json.dump(saved | json_fields, f, indent=2, sort_keys=True)
            f.write("\n")
    if getattr(transformers, hf_class).can_generate():
        transformers.GenerationConfig(**ids, **generation).save_pretrained(out_dir)
    return out_dir
