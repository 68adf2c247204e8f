"""What a run reports about itself: model-info.txt, example inputs, FLOPs/MFU, loss curve."""

import functools
import io
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from lmsuite.objectives import Objective


def example_inputs(element_spec: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """A one-row batch of zeros shaped like a batched dataset's rows, for `model.init`.

    Built from the `element_spec` of the run's own batched input, so every feature has its real
    rank and dtype (a rank-0 label becomes (1,), XLNet's perm_mask (1, L, L)).

    Example: {"decoder_input_tokens": TensorSpec((32, 8), int32)} -> {"decoder_input_tokens":
    int32 zeros (1, 8)}.
    """
    out = {}
    for name, spec in element_spec.items():
        shape = tuple(spec.shape)
        if not shape or any(d is None for d in shape[1:]):
            raise ValueError(
                f"feature {name!r} has shape {shape} in the batched input; expected a batch "
                "dimension and static sizes after it (the feature converter pads them)"
            )
        dtype = np.float32 if spec.dtype.is_floating else np.int32
        out[name] = np.zeros((1,) + shape[1:], dtype)
    return out


def num_params(params: Any) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def train_flops(params: Any, batch: Mapping[str, Any], objective: Objective) -> float:
    """6 * parameters * input tokens per step: the usual dense-model estimate (it leaves out
    attention scores, and counts embedding tables as if they were matmuls on every token, which
    overstates small-model FLOPs). The loop prefers `lowered_flops`."""
    inputs = objective.model_inputs(batch)["input_ids"]
    return 6.0 * num_params(params) * float(np.prod(inputs.shape))


def lowered_flops(lowered, *, loop_trips: int = 1) -> float | None:
    """FLOPs of one call of a lowered jit function, as XLA's cost analysis counts them (before
    optimisation: forward, backward and optimizer update, attention included); None when the
    backend gives no count.

    XLA counts a loop's body once: a step that accumulates gradients over `loop_trips`
    microbatches (a scan) is counted as if it ran one. The count is scaled by `loop_trips`,
    which also counts the optimizer update that many times; the update is small against the
    forward and backward passes it follows (a few FLOPs per parameter against 6 per parameter
    per token).
    """
    try:
        cost = lowered.cost_analysis()
    except Exception:  # not every backend implements it
        return None
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    flops = None if not cost else cost.get("flops")
    return float(flops) * loop_trips if flops and flops > 0 else None


@functools.cache
def measured_cpu_peak_flops() -> float:
    """The host's float32 matmul FLOP/s (best of 5 jit 1024^3 products), shared by every CPU
    device: the ceiling CPU MFU is reported against, since CPUs publish no single peak."""
    n = 1024
    a = jnp.ones((n, n), jnp.float32)
    matmul = jax.jit(lambda x, y: x @ y)
    matmul(a, a).block_until_ready()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        matmul(a, a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best


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


def device_peak_flops() -> float | None:
    """Peak FLOP/s of one jax device: `PEAK_FLOPS` by device kind; CPU devices divide the host's
    `measured_cpu_peak_flops()` among themselves (the first call measures it, for ~0.1 s: make
    it before training, not while a step runs)."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        return measured_cpu_peak_flops() / jax.local_device_count()
    return PEAK_FLOPS.get(device.device_kind)


def mfu(
    *, flops_per_step: float, steps_per_sec: float, peak_flops_per_device: float | None
) -> float | None:
    """Model FLOPs utilisation, or None when the FLOPs or the device's peak are unknown.

    `peak_flops_per_device=None` means `device_peak_flops()`.
    """
    if peak_flops_per_device is None:
        peak_flops_per_device = device_peak_flops()
    if not peak_flops_per_device or not flops_per_step:
        return None
    return flops_per_step * steps_per_sec / (peak_flops_per_device * jax.device_count())


def write_model_info(path: epath.PathLike, params: Any, logical_specs: Any, shardings: Any) -> None:
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
    epath.Path(path).write_text("\n".join(lines) + "\n")


def majority_baseline(
    batches: Iterable[Mapping[str, np.ndarray]],
    *,
    targets: str = "masked_ids",
    weights: str = "masked_weights",
) -> float | None:
    """Accuracy of always predicting the most frequent target of these batches.

    No model that ignores its input does better on them, so a held-out MLM accuracy near this
    value means the model has not learnt to use the context yet (BERT's unigram plateau).
    None when the batches carry no such targets.

    >>> majority_baseline([{"masked_ids": np.array([[5, 5, 7, 0]]),
    ...                     "masked_weights": np.array([[1, 1, 1, 0]])}])
    0.6666666666666666
    """
    counts = _target_counts(batches, targets, weights)
    if counts is None or not counts.sum():
        return None
    return float(counts.max() / counts.sum())


class Baselines(NamedTuple):
    """What a model that ignores its input scores on held-out predictions."""

    majority: float | None  # accuracy of always the most frequent held-out target
    unigram_cross_entropy: float | None  # nats per held-out target under train-split unigrams
    held_out_targets: int
    train_targets: int


def _target_counts(batches, targets: str, weights: str) -> np.ndarray | None:
    counts = None
    for batch in batches:
        if targets not in batch or weights not in batch:
            return None
        ids, w = np.asarray(batch[targets]).ravel(), np.asarray(batch[weights]).ravel()
        row = np.bincount(ids[w > 0], minlength=1).astype(np.float64)
        if counts is None:
            counts = row
        else:
            size = max(len(counts), len(row))
            counts = np.pad(counts, (0, size - len(counts))) + np.pad(row, (0, size - len(row)))
    return counts


def baselines(
    held_out: Iterable[Mapping[str, np.ndarray]],
    *,
    train_batches: Iterable[Mapping[str, np.ndarray]],
    targets: str,
    weights: str,
    vocab_size: int,
) -> Baselines:
    """The majority-class accuracy on `held_out` and its cross-entropy under the unigram
    distribution of the train split's targets (add-one smoothed over `vocab_size` ids, so a
    held-out target never seen in training costs log(N + V), not infinity).

    A model below that cross-entropy and above that accuracy uses its input, not only the
    target frequencies.

    >>> baselines([{"t": np.array([[5, 5, 7]]), "w": np.array([[1, 1, 1]])}],
    ...           train_batches=[{"t": np.array([[5, 7, 7, 7]]), "w": np.ones((1, 4))}],
    ...           targets="t", weights="w", vocab_size=8).majority
    0.6666666666666666
    """
    held = _target_counts(held_out, targets, weights)
    train = _target_counts(train_batches, targets, weights)
    if held is None or held.sum() == 0:
        return Baselines(None, None, 0, 0 if train is None else int(train.sum()))
    majority = float(held.max() / held.sum())
    if train is None or train.sum() == 0:
        return Baselines(majority, None, int(held.sum()), 0)
    size = max(vocab_size, len(held), len(train))
    train = np.pad(train, (0, size - len(train)))
    held = np.pad(held, (0, size - len(held)))
    log_p = np.log(train + 1.0) - np.log(train.sum() + size)
    unigram = float(-(held * log_p).sum() / held.sum())
    return Baselines(majority, unigram, int(held.sum()), int(train.sum()))


def plot_loss_curve(
    records: list[dict], png: epath.PathLike, *, baseline: float | None = None
) -> None:
    """Loss, and accuracy where logged, against step (train and eval), saved as a PNG.

    `baseline` (e.g. `majority_baseline`) is drawn as a horizontal line on the accuracy panel.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(key):
        return [(r["step"], r[key]) for r in records if isinstance(r.get(key), float)]

    accuracy_keys = sorted(
        {k for r in records for k in r if k.endswith("_accuracy") and not k.startswith("eval/")}
    )
    panels = 2 if accuracy_keys else 1
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), squeeze=False)
    loss_ax = axes[0][0]
    for key, style, label in (("loss", "-", "train loss"), ("eval/loss", "o-", "eval loss")):
        if points := series(key):
            loss_ax.plot(*zip(*points, strict=True), style, label=label)
    loss_ax.set_xlabel("step")
    loss_ax.set_ylabel("loss")
    loss_ax.legend()
    if accuracy_keys:
        acc_ax = axes[0][1]
        for key in accuracy_keys:
            for name, style in ((key, "-"), (f"eval/{key}", "o-")):
                if points := series(name):
                    acc_ax.plot(*zip(*points, strict=True), style, label=name)
        if baseline is not None:
            acc_ax.axhline(baseline, color="gray", linestyle="--", label="most frequent target")
        acc_ax.set_xlabel("step")
        acc_ax.set_ylabel("accuracy")
        acc_ax.legend()
    _save_png(fig, png)


def _save_png(fig, png: epath.PathLike) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    image = io.BytesIO()  # via epath, so that png may be on gs://
    fig.savefig(image, format="png", dpi=100)
    plt.close(fig)
    epath.Path(png).write_bytes(image.getvalue())


def label_majority(batches: Iterable[Mapping[str, np.ndarray]], *, label: str) -> tuple[float, int]:
    """(share of the most frequent value of `label`, number of labelled entries) over batches:
    the accuracy of a classifier that ignores its input (NSP, SOP: about 1/2; StructBERT's
    sentence structure: about 1/3). Every labelled row (or token) counts, as the loss's
    denominator counts them; -1 marks an entry a multi-task example's task does not label.

    >>> label_majority([{"y": np.array([1, 0, 1, 1, -1])}], label="y")
    (0.75, 4)
    """
    counts: np.ndarray = np.zeros(1)
    for batch in batches:
        if label not in batch:
            raise ValueError(f"the batches carry no {label!r}; they have {sorted(batch)}")
        values = np.asarray(batch[label]).ravel().astype(np.int64)
        row = np.bincount(values[values >= 0])
        size = max(len(counts), len(row))
        counts = np.pad(counts, (0, size - len(counts))) + np.pad(row, (0, size - len(row)))
    total = int(counts.sum())
    return (float(counts.max() / total) if total else 0.0), total


def binomial_upper_tail(successes: int, trials: int, p: float) -> float:
    """P[X >= successes] for X ~ Binomial(trials, p), summed exactly in log space: the chance
    that a classifier right with probability p (the majority share) gets this many right.

    >>> round(binomial_upper_tail(9, 10, 0.5), 6)   # (10 + 1) / 2**10
    0.010742
    """
    if not 0 <= successes <= trials or not 0.0 < p < 1.0:
        raise ValueError(f"need 0 <= successes ({successes}) <= trials ({trials}), 0 < p ({p}) < 1")
    terms = [
        math.lgamma(trials + 1) - math.lgamma(k + 1) - math.lgamma(trials - k + 1)
        + k * math.log(p) + (trials - k) * math.log1p(-p)
        for k in range(successes, trials + 1)
    ]  # fmt: skip
    peak = max(terms)
    return float(min(1.0, math.exp(peak) * sum(math.exp(t - peak) for t in terms)))


def label_line(
    metric: str, label: str, accuracy: float, *, rows: int, majority: float, unit: str
) -> str:
    """The held-out line of classification head `metric` (labels `label`): its accuracy against
    always the most frequent label over `rows` labelled entries (`unit`), with the binomial
    chance of doing that well (what `lmsuite pretrain` and `lmsuite eval` print).

    Example: ("sentence_accuracy", "y", 0.9, rows=10, majority=0.5, unit="rows") -> "held-out
    sentence accuracy: 0.9000 over 10 rows (always the most frequent y: 0.5000; binomial
    p = 0.011)".
    """
    p_value = binomial_upper_tail(min(rows, round(accuracy * rows)), rows, majority)
    name = metric.removesuffix("_accuracy").replace("_", " ")
    return (
        f"held-out {name} accuracy: {accuracy:.4f} over {rows:,} {unit} (always the most "
        f"frequent {label}: {majority:.4f}; binomial p = {p_value:.2g})"
    )


STAGE_KEY = "data/stage"  # metrics.jsonl: the 1-based stage that begins after the record's step


class StageChange(NamedTuple):
    """A held-out metric across the start of a continual schedule's stage (`data.stages`)."""

    metric: str  # e.g. "eval/capitalization_labels_accuracy"
    stage: int  # the stage that began, 1-based (>= 2)
    step: int  # the step it began after
    before: float  # at the last evaluation at or before `step`
    lowest_after: float  # the lowest of the evaluations after `step`

    @property
    def fall(self) -> float:
        return self.before - self.lowest_after


def _eval_accuracies(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """ "eval/..._accuracy" (not per task) -> [(step, value)], in step order."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in sorted(records, key=lambda r: r["step"]):
        for key, value in r.items():
            if key.startswith("eval/") and key.endswith("_accuracy") and "/" not in key[5:]:
                if isinstance(value, float):
                    out.setdefault(key, []).append((r["step"], value))
    return out


def stage_starts(records: list[dict]) -> list[tuple[int, int]]:
    """[(step, stage)] of each stage after the first, from metrics.jsonl's records."""
    return sorted({(r["step"], int(r[STAGE_KEY])) for r in records if r.get(STAGE_KEY, 1) > 1})


def stage_changes(records: list[dict]) -> list[StageChange]:
    """Every held-out accuracy before each later stage began and its lowest after: how much a
    task trained earlier lost when later tasks joined (ERNIE 2.0's point is that it loses little).

    Example: evaluations at steps 2, 4, 6 of 0.50, 0.70, 0.65 and stage 2 beginning after step
    4 -> StageChange(metric, stage=2, step=4, before=0.70, lowest_after=0.65): fall 0.05.
    """
    out = []
    for key, points in _eval_accuracies(records).items():
        for step, stage in stage_starts(records):
            before = [v for s, v in points if s <= step]
            after = [v for s, v in points if s > step]
            if before and after:
                out.append(StageChange(key, stage, step, before[-1], min(after)))
    return out


def plot_stages(records: list[dict], png: epath.PathLike) -> None:
    """Each held-out accuracy against step, with a dashed line where each stage began."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for key, points in sorted(_eval_accuracies(records).items()):
        label = key.removeprefix("eval/").removesuffix("_accuracy").replace("_", " ")
        ax.plot(*zip(*points, strict=True), "o-", markersize=3, label=label)
    for step, stage in stage_starts(records):
        ax.axvline(step, color="gray", linestyle="--", linewidth=1)
        ax.text(
            step, 0.01, f" stage {stage}", va="bottom", fontsize=8, color="gray",
            transform=ax.get_xaxis_transform(),
        )  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(0.0, 1.02)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    _save_png(fig, png)
