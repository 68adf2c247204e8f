"""metrics.jsonl bookkeeping and the logical-axis helpers the train state relies on."""

import json

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from lmsuite import partitioning
from lmsuite.training import metrics, report


def test_a_resumed_log_appends_and_reads_back_as_one_history(tmp_path):
    path = tmp_path / "metrics.jsonl"
    loss = float(np.float32(2.7182817))
    lines = [json.dumps({"step": s, "loss": loss + s}) for s in range(1, 6)]
    before = "\n".join(lines) + '\n{"step": 6, "lo'  # killed while writing step 6
    path.write_text(before)
    assert [r["step"] for r in metrics.read_jsonl(path)] == [1, 2, 3, 4, 5]
    log = metrics.MetricsLog(model_dir=tmp_path, resume_step=3)  # restored from step 3
    for step in (4, 5, 6):
        log.write(step, {"loss": -step})
    log.close()
    text = path.read_text()
    assert text.startswith(before + "\n")  # nothing of the stopped run is rewritten
    records = metrics.read_jsonl(path)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[0]["loss"] == loss + 1  # bit-exact round trip
    assert [r["loss"] for r in records[3:]] == [-4, -5, -6]  # the resumed run's lines


def test_metrics_log_writes_jsonl_and_tensorboard(tmp_path):
    log = metrics.MetricsLog(model_dir=tmp_path)
    log.write(1, {"loss": np.float32(1.5), "grad_norm": float("nan")})
    log.close()
    assert metrics.read_jsonl(tmp_path / "metrics.jsonl") == [
        {"step": 1, "loss": 1.5, "grad_norm": "nan"}
    ]
    assert any((tmp_path / "tensorboard").iterdir())


def test_logical_names_map_through_the_rules():
    assert partitioning.mesh_axes(("batch", "length")) == PartitionSpec(("data", "fsdp"), None)
    # A mesh axis shards one dimension only.
    assert partitioning.mesh_axes(("embed", "embed")) == PartitionSpec("fsdp", None)
    assert partitioning.mesh_axes(("vocab", "embed")) == PartitionSpec("tensor", "fsdp")
    with pytest.raises(ValueError, match=r"\['hidden'\] have no rule"):
        partitioning.mesh_axes(("hidden",))


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (forced CPU) devices")
def test_indivisible_dimensions_are_listed():
    mesh = partitioning.make_mesh(data=2, fsdp=4, tensor=1)
    shapes = {"w": jax.ShapeDtypeStruct((6, 10), np.float32)}
    shardings = {"w": partitioning.named_sharding(mesh, ("embed", "mlp"))}
    with pytest.raises(ValueError, match=r"\['w'\] shape \(6, 10\): 6 not divisible by"):
        partitioning.check_divisible(shapes, shardings, what="params")
    shapes = {"w": jax.ShapeDtypeStruct((8, 10), np.float32)}
    partitioning.check_divisible(shapes, shardings, what="params")


def test_lowered_flops_counts_a_matmul_exactly():
    lowered = jax.jit(lambda a, b: a @ b).lower(np.ones((64, 32)), np.ones((32, 16)))
    assert report.lowered_flops(lowered) == 2 * 64 * 32 * 16


def test_cpu_mfu_is_measured_against_the_hosts_matmul_peak():
    peak = report.measured_cpu_peak_flops()
    assert 1e8 < peak < 1e14
    assert report.measured_cpu_peak_flops() == peak  # measured once per process
    # Half the host's matmul peak, spread over however many CPU devices the host shows.
    got = report.mfu(flops_per_step=peak / 2, steps_per_sec=1.0, peak_flops_per_device=None)
    assert got == pytest.approx(0.5)
    assert report.mfu(flops_per_step=None, steps_per_sec=1.0, peak_flops_per_device=1e12) is None


STAGED_RECORDS = [
    {"step": 0, "data/stage": 1.0},
    {"step": 2, "eval/a_accuracy": 0.50, "eval/b_accuracy": 0.30, "eval/mlm_accuracy/t": 0.1},
    {"step": 4, "eval/a_accuracy": 0.70, "eval/b_accuracy": 0.31},
    {"step": 4, "data/stage": 2.0},
    {"step": 6, "eval/a_accuracy": 0.65, "eval/b_accuracy": 0.60, "loss": 1.0},
    {"step": 8, "eval/a_accuracy": 0.68, "eval/b_accuracy": 0.62},
    {"step": 8, "data/stage": 3.0},
    {"step": 10, "eval/a_accuracy": 0.69, "eval/b_accuracy": 0.55},
]


def test_stage_changes_by_hand():
    """Each held-out accuracy (not the per-task ones) at the last evaluation before a stage
    began against its lowest after: a fell 0.70 -> 0.65 after stage 2 began at step 4."""
    got = {(c.metric, c.stage): c for c in report.stage_changes(STAGED_RECORDS)}
    assert set(got) == {(m, s) for m in ("eval/a_accuracy", "eval/b_accuracy") for s in (2, 3)}
    a2 = got["eval/a_accuracy", 2]
    assert (a2.step, a2.before, a2.lowest_after) == (4, 0.70, 0.65)
    assert a2.fall == pytest.approx(0.05)
    b3 = got["eval/b_accuracy", 3]
    assert (b3.before, b3.lowest_after) == (0.62, 0.55)
    assert report.stage_starts(STAGED_RECORDS) == [(4, 2), (8, 3)]
    assert report.stage_changes(STAGED_RECORDS[:3]) == []  # one stage: nothing began later


def test_the_stage_plot_is_a_png(tmp_path):
    report.plot_stages(STAGED_RECORDS, tmp_path / "stages.png")
    assert (tmp_path / "stages.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
