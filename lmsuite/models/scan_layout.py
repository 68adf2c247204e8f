"""Parameters between the unscanned and the scanned layout of a model's stacks.

With ModelConfig.scan_layers a stack keeps one subtree `layers` whose every leaf has a leading
axis of one entry per layer; without, one subtree `layers_{i}` per layer. Both layouts describe
the same network: `scan_params` and `unscan_params` move the arrays exactly, nothing else.

    {"encoder": {"layers_0": {"mlp": {"wi": {"kernel": w0}}},
                 "layers_1": {"mlp": {"wi": {"kernel": w1}}},
                 "relative_bias": {...}}}
      -- scan_params ->
    {"encoder": {"layers": {"mlp": {"wi": {"kernel": stack([w0, w1])}}},
                 "relative_bias": {...}}}

Checkpoints keep the layout their run trained with; HF conversion and the evaluation loader
(cached decoding runs unscanned) convert.
"""

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax.core.meta import AxisMetadata

from lmsuite.models import families
from lmsuite.models.config import ModelConfig

SCANNED = "layers"


def stack_paths(config: ModelConfig) -> tuple[tuple[tuple[str, ...], int], ...]:
    """(path of each `Stack` in the parameter tree, its number of layers).

    Example: a T5 config -> ((("encoder",), num_layers), (("decoder",), decoder_layers)).

    Raises:
      ValueError: a config whose layers cannot be stacked (shared layers, XLNet's own loop).
    """
    if config.share_layers != "none" or not families.family(config).scans:
        raise ValueError(
            "scan_layout converts stacks of distinct layers; "
            f"{families.describe(config)} with share_layers={config.share_layers!r} has none"
        )
    family = families.family(config)
    if family is families.ELECTRA:
        from lmsuite.models.electra import generator_config

        return (
            (("generator", "encoder"), generator_config(config).num_layers),
            (("discriminator", "encoder"), config.num_layers),
        )
    if family.seq2seq:
        return ((("encoder",), config.num_layers), (("decoder",), config.decoder_layers))
    if family is families.ENCODER:
        return ((("encoder",), config.num_layers),)
    return ((("decoder",), config.num_layers),)


def scan_params(params: Mapping, config: ModelConfig) -> dict:
    """The parameters with each stack's `layers_{i}` stacked into `layers` (see the module
    docstring). `params` is the unboxed `params` collection; numpy leaves stay numpy."""
    out = _copy(params)
    for path, num_layers in stack_paths(config):
        stack = _subtree(out, path)
        names = [f"layers_{i}" for i in range(num_layers)]
        missing = [n for n in names if n not in stack]
        if missing or SCANNED in stack:
            raise ValueError(
                f"{'/'.join(path)} is not an unscanned stack of {num_layers} layers: it holds "
                f"{sorted(stack)}"
            )
        layers = [stack.pop(n) for n in names]
        stack[SCANNED] = jax.tree.map(lambda *xs: _xp(xs).stack(xs), *layers)
    return out


def unscan_params(params: Mapping, config: ModelConfig) -> dict:
    """The inverse of `scan_params`: each stack's `layers` split into `layers_{i}`."""
    out = _copy(params)
    for path, num_layers in stack_paths(config):
        stack = _subtree(out, path)
        if SCANNED not in stack or any(k.startswith("layers_") for k in stack):
            raise ValueError(f"{'/'.join(path)} is not a scanned stack: it holds {sorted(stack)}")
        layers = stack.pop(SCANNED)
        lengths = {np.shape(x)[0] for x in jax.tree.leaves(layers)}
        if lengths != {num_layers}:
            raise ValueError(
                f"{'/'.join(path)}/{SCANNED} must stack {num_layers} layers on its leading "
                f"axis, got leading sizes {sorted(lengths)}"
            )
        for i in range(num_layers):
            stack[f"layers_{i}"] = jax.tree.map(lambda x, i=i: x[i], layers)
    return out


def _xp(arrays) -> Any:
    return np if all(isinstance(x, np.ndarray) for x in arrays) else jnp


def _copy(tree: Mapping) -> dict:
    """Fresh dicts down to the leaves (which are shared), so the caller's tree is untouched."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, AxisMetadata):
            raise ValueError(
                f"{key!r} holds a boxed {type(value).__name__}: pass the params through "
                "flax.linen.unbox first (the logical axis names do not follow the arrays)"
            )
        out[key] = _copy(value) if isinstance(value, Mapping) else value
    return out


def _subtree(tree: dict, path: tuple[str, ...]) -> dict:
    node = tree
    for i, key in enumerate(path):
        if not isinstance(node, dict) or key not in node:
            where = "/".join(path[:i]) or "the top"
            held = sorted(node) if isinstance(node, dict) else type(node).__name__
            raise ValueError(f"no stack {'/'.join(path)}: {where} holds {held}")
        node = node[key]
    return node
