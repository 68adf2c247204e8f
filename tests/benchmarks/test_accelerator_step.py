"""`benchmarks/accelerator_step.py`'s CPU dry run: both variants of the real step, measured."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lmsuite.models import ModelConfig

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


def _prepared(module, rows: int):
    variants = [
        module.Variant(
            name=name,
            bindings={},
            model=ModelConfig(dtype=dtype),
            loss=None,
            loss_options={},
            optimizer=None,
            trainer={},
            sequence_length={"input_ids": 1},
        )
        for name, dtype in (("baseline", "float32"), ("fast", "bfloat16"))
    ]
    batch = {"input_ids": np.arange(rows)[:, None]}
    return module.Prepared(
        experiment="bert_tiny", variants=variants, notes=[], batch=batch, shapes_task="task"
    )


_PRINTED = dict(compile_seconds=1.0, xla_memory_bytes=2**30, cudnn_attention_calls=0)


def test_out_of_memory_halves_the_batch_for_both_variants(monkeypatch, capsys):
    module = _load()
    measured = []

    def fake_measure(variant, batch_np, *, steps, warmup, trace_dir=None, host_flops=None):
        rows = len(batch_np["input_ids"])
        measured.append((variant.model.dtype, batch_np["input_ids"][:, 0].tolist()))
        if rows > 2 and variant.model.dtype == "bfloat16":  # only the fast variant runs out
            raise module.OutOfMemory("RESOURCE_EXHAUSTED: out of memory")
        return dict(
            batch_size=rows,
            steps_per_sec=2.0 if variant.model.dtype == "bfloat16" else 1.0,
            tokens_per_step=rows,
            xla_flops=1e9,
            plain_attention_reasons=[],
            top_ops=[],
            **_PRINTED,
        )

    monkeypatch.setattr(module, "measure", fake_measure)
    monkeypatch.setattr(module.report, "device_peak_flops", lambda: 1e12)
    rows = module.measure_experiment(_prepared(module, 8), steps=1, warmup=0)
    # Each halving keeps the batch's first rows, the same rows for both variants.
    assert measured == [
        ("float32", list(range(8))),
        ("bfloat16", list(range(8))),
        ("float32", [0, 1, 2, 3]),
        ("bfloat16", [0, 1, 2, 3]),
        ("float32", [0, 1]),
        ("bfloat16", [0, 1]),
    ]
    assert [(r["variant"], r["batch_size"]) for r in rows] == [("baseline", 2), ("fast", 2)]
    assert rows[1]["steps_per_sec_ratio"] == 2.0
    assert rows[1]["mfu"] == 2e9 / 1e12
    assert "out of memory at batch 8" in capsys.readouterr().out


def test_variants_select_and_mfu_without_the_baseline_uses_the_hosts_count(monkeypatch, capsys):
    module = _load()
    prepared = _prepared(module, 4)
    with pytest.raises(ValueError, match=r"has variants \['baseline', 'fast'\]"):
        module.select_variants(prepared, ["fast", "bf16"])
    prepared.variants = module.select_variants(prepared, ["fast"])
    prepared.host_flops = 3e9  # the baseline's count where it was prepared

    def fake_measure(variant, batch_np, *, steps, warmup, trace_dir=None, host_flops=None):
        # Only the first prepared variant is the baseline: no other is handed its count.
        assert host_flops is None
        return dict(
            batch_size=len(batch_np["input_ids"]),
            steps_per_sec=2.0,
            tokens_per_step=4,
            xla_flops=1e6,  # e.g. a GPU's compiled count, which leaves out cuBLAS' GEMMs
            plain_attention_reasons=[],
            top_ops=[],
            **_PRINTED,
        )

    monkeypatch.setattr(module, "measure", fake_measure)
    monkeypatch.setattr(module.report, "device_peak_flops", lambda: 1e12)
    (row,) = module.measure_experiment(prepared, steps=1, warmup=0)
    assert row["variant"] == "fast" and "steps_per_sec_ratio" not in row
    assert row["model_flops"] == 3e9 and row["mfu"] == 2 * 3e9 / 1e12
    assert "2.000 steps/s" in capsys.readouterr().out  # printed as soon as it is measured


def test_a_missing_prepared_experiment_names_the_command_that_writes_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"--experiments=bert_tiny --prepare="):
        _load().load_prepared(str(tmp_path), "bert_tiny")


# The accelerator image of the `device` tool has JAX, Flax and Optax but no TensorFlow or SeqIO:
# `--setup` must measure with both unimportable.
_WITHOUT_DATA_STACK = """
import sys
for name in ("tensorflow", "seqio", "tensorflow_text", "tensorflow_datasets", "gin"):
    sys.modules[name] = None
import importlib.util
spec = importlib.util.spec_from_file_location("accelerator_step", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.main(sys.argv[2:])
"""


@pytest.mark.slow  # compiles two steps
def test_prepared_experiments_measure_without_the_data_stack(tmp_path):
    module = _load()
    folder = str(tmp_path / "prepared")
    module.main(["--dry_run", "--experiments=bert_base", f"--prepare={folder}"])
    prepared = module.load_prepared(folder, "bert_tiny")
    assert [v.name for v in prepared.variants] == ["baseline", "fast"]
    assert prepared.variants[1].model.dtype == "bfloat16"
    assert len(prepared.batch["input_ids"]) == module.DRY_RUN["batch_size"]
    assert prepared.host_flops > 0  # the baseline's count over those rows, lowered here
    out = tmp_path / "rows.jsonl"
    argv = ["--dry_run", "--experiments=bert_base", f"--setup={folder}", "--steps=1"]
    argv += ["--warmup=0", "--batch_size=2", f"--out={out}"]
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_DATA_STACK, str(SCRIPT), *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["variant"], r["batch_size"]) for r in rows] == [("baseline", 2), ("fast", 2)]
    assert all(math.isfinite(r["final_loss"]) and r["xla_flops"] > 0 for r in rows)
    # The host's count is of 4 rows: at 2 the CPU's own lowered count stands.
    assert "the host's FLOP count is of 4 rows" in done.stdout
    assert rows[0]["flops_source"] == "lowered"
