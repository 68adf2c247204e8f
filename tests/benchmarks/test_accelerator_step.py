"""`benchmarks/accelerator_step.py`'s CPU dry run: both variants of the real step, measured."""

import importlib.util
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "accelerator_step.py"


def _load():
    spec = importlib.util.spec_from_file_location("accelerator_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # compiles four steps
def test_dry_run_measures_both_variants(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    rows = _load().main(
        ["--dry_run", "--experiments=bert_base", "--steps=1", "--warmup=0", f"--out={out}"]
    )
    printed = capsys.readouterr().out
    # bert_base's dry run is its tiny twin, both variants at the dry run's batch.
    assert [(r["experiment"], r["variant"], r["batch_size"]) for r in rows] == [
        ("bert_tiny", "baseline", 4),
        ("bert_tiny", "fast", 4),
    ]
    baseline, fast = rows
    assert baseline["bindings"]["ModelConfig.dtype"] == "'float32'"
    assert fast["bindings"]["ModelConfig.dtype"] == "'bfloat16'"
    assert fast["bindings"]["train.prng_impl"] == "'rbg'"
    assert math.isfinite(fast["steps_per_sec_ratio"]) and fast["steps_per_sec_ratio"] > 0
    assert baseline["xla_flops"] > 0 and 0 < fast["mfu"] < 1
    assert all(math.isfinite(r["final_loss"]) for r in rows)
    table = [line.split() for line in printed.splitlines() if line.startswith("bert_tiny ")]
    table = [line for line in table if line[1] in ("baseline", "fast")]  # not progress lines
    assert [line[1] for line in table] == ["baseline", "fast"]
    assert table[1][-1] == f"x{fast['steps_per_sec_ratio']:.2f}"
    assert len(out.read_text().splitlines()) == 2


def test_out_of_memory_halves_the_batch_for_both_variants(monkeypatch, capsys):
    module = _load()
    measured = []

    def fake_measure(run, batch_np, *, steps, warmup):
        rows = len(batch_np["input_ids"])
        measured.append((run.model.dtype, rows))
        if rows > 2 and run.model.dtype == "bfloat16":  # only the fast variant runs out
            raise module.OutOfMemory("RESOURCE_EXHAUSTED: out of memory")
        return dict(
            batch_size=rows,
            steps_per_sec=2.0 if run.model.dtype == "bfloat16" else 1.0,
            tokens_per_step=rows,
            xla_flops=1e9,
            plain_attention_reasons=[],
        )

    monkeypatch.setattr(module, "measure", fake_measure)
    monkeypatch.setattr(
        module, "read_batch", lambda run, built, rows: ({"input_ids": [[0]] * rows}, "task")
    )
    monkeypatch.setattr(module.report, "device_peak_flops", lambda: 1e12)
    rows = module.measure_experiment("bert_tiny", batch_size=8, steps=1, warmup=0)
    assert measured == [
        ("float32", 8),
        ("bfloat16", 8),
        ("float32", 4),
        ("bfloat16", 4),
        ("float32", 2),
        ("bfloat16", 2),
    ]
    assert [(r["variant"], r["batch_size"]) for r in rows] == [("baseline", 2), ("fast", 2)]
    assert rows[1]["steps_per_sec_ratio"] == 2.0
    assert rows[1]["mfu"] == 2e9 / 1e12
    assert "out of memory at batch 8" in capsys.readouterr().out
