"""`from_hf` / `to_hf`: HuggingFace checkpoints in and out of lmsuite.

model = from_hf(hf_model_or_dir)      # .config, .params, .logits(...) == HF's .logits
model.logits_and_mems(...)             # XLNet: (HF's .logits, HF's .mems)
to_hf(config, params, out_dir)         # safetensors + config.json that transformers loads
"""

import dataclasses
import json
import os
from typing import Any

import jax
import numpy as np

from lmsuite.convert import common
from lmsuite.models import ModelConfig, Transformer
from lmsuite.models.inputs import validate_inputs


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
        validate_inputs(
            self.config,
            kwargs["input_ids"],
            token_type_ids=kwargs.get("token_type_ids"),
            decoder_input_ids=kwargs.get("decoder_input_ids"),
        )
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


def _import_transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "lmsuite.convert needs `transformers` (and torch to read checkpoints): "
            "pip install -e '.[test]'"
        ) from e
    return transformers


def _state_dict(hf_model) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().float().numpy() for k, v in hf_model.state_dict().items()}


def from_hf(hf_model_or_dir) -> ConvertedModel:
    """Converts a HF model (an instance, or a directory holding config.json and weights)."""
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
        hf_model = getattr(transformers, archs[0]).from_pretrained(path)
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
    return ConvertedModel(config, params, hf_class, hf_model.config, family)


def infer_hf_class(config: ModelConfig) -> str:
    """The HF class an lmsuite config corresponds to, when that is unambiguous."""
    from lmsuite.convert import registry

    return registry.infer_hf_class(config)


def to_hf(config: ModelConfig, params, out_dir: str, *, hf_class: str | None = None) -> str:
    """Writes `model.safetensors` + `config.json` that `transformers` loads; returns out_dir."""
    from safetensors.numpy import save_file

    families = _families()
    hf_class = hf_class or infer_hf_class(config)
    if hf_class not in families:
        raise ValueError(f"cannot export to {hf_class}; supported classes: {sorted(families)}")
    family = families[hf_class]
    flat = common.flatten(params)
    common.check_params(config, flat)
    hf_config = family.config_to_hf(config, hf_class)
    hf_config.architectures = [hf_class]
    state = family.params_to_hf(flat, config, hf_class)
    os.makedirs(out_dir, exist_ok=True)
    save_file(
        {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in state.items()},
        os.path.join(out_dir, "model.safetensors"),
        metadata={"format": "pt"},
    )
    hf_config.save_pretrained(out_dir)
    return out_dir
