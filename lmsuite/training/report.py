"""What a run reports about itself: model-info.txt, example inputs, FLOPs/MFU, loss curve."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import seqio

from lmsuite.objectives import Objective


def example_inputs(
    objective: Objective,
    sequence_length: Mapping[str, int],
    feature_converter: seqio.FeatureConverter,
) -> dict[str, np.ndarray]:
    """A one-row batch of zeros with the converter's model features, for `model.init`.

    Example: LMFeatureConverter, {"targets": 8} -> {"decoder_input_tokens": int32 (1, 8),
    "decoder_target_tokens": int32 (1, 8), "decoder_loss_weights": int32 (1, 8)}.
    """
    del objective
    lengths = feature_converter.get_model_feature_lengths(dict(sequence_length))
    specs = dict(feature_converter.MODEL_FEATURES)
    packing = dict(getattr(feature_converter, "PACKING_FEATURE_DTYPES", None) or {})
    out = {}
    for name, length in lengths.items():
        tf_dtype = specs[name].dtype if name in specs else packing.get(name)
        dtype = np.float32 if tf_dtype is not None and tf_dtype.is_floating else np.int32
        out[name] = np.zeros((1, length), dtype)
    return out


def num_params(params: Any) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def train_flops(params: Any, batch: Mapping[str, Any], objective: Objective) -> float:
    """6 * parameters * input tokens per step: the usual dense-model estimate (it leaves out
    attention scores, so MFU is slightly understated for long sequences)."""
    inputs = objective.model_inputs(batch)["input_ids"]
    return 6.0 * num_params(params) * float(np.prod(inputs.shape))


# Dense bf16 peak FLOP/s per jax device, by `device_kind` (v3/v2 devices are single cores).
PEAK_FLOPS = {
    "TPU v2": 22.5e12,
    "TPU v3": 61.5e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H200": 989e12,
}


def mfu(
    *, flops_per_step: float, steps_per_sec: float, peak_flops_per_device: float | None
) -> float | None:
    """Model FLOPs utilisation, or None when the device's peak is unknown (e.g. CPU).

    `peak_flops_per_device=None` looks the device up in `PEAK_FLOPS`.
    """
    if peak_flops_per_device is None:
        peak_flops_per_device = PEAK_FLOPS.get(jax.devices()[0].device_kind)
    if not peak_flops_per_device:
        return None
    return flops_per_step * steps_per_sec / (peak_flops_per_device * jax.device_count())


def write_model_info(path: Path, params: Any, logical_specs: Any, shardings: Any) -> None:
    """One line per parameter: path, shape, dtype, logical axes, mesh PartitionSpec."""
    lines = [f"# {num_params(params):,} parameters"]
    leaves = jax.tree_util.tree_leaves_with_path(params)
    specs = jax.tree.leaves(
        logical_specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)
    )
    for (key, x), logical, sharding in zip(leaves, specs, jax.tree.leaves(shardings), strict=True):
        lines.append(
            f"{jax.tree_util.keystr(key):70s} {str(tuple(x.shape)):18s} {str(x.dtype):9s} "
            f"logical={tuple(logical)} mesh={tuple(sharding.spec)}"
        )
    path.write_text("\n".join(lines) + "\n")


def plot_loss_curve(records: list[dict], png: Path) -> None:
    """Training loss (and eval loss where logged) against step, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    train = [(r["step"], r["loss"]) for r in records if isinstance(r.get("loss"), float)]
    evals = [(r["step"], r["eval/loss"]) for r in records if "eval/loss" in r]
    if train:
        ax.plot(*zip(*train, strict=True), label="train loss")
    if evals:
        ax.plot(*zip(*evals, strict=True), "o-", label="eval loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
