"""Runs `lmsuite train` on experiments/smoke.gin in a subprocess, for the fault tests."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from lmsuite.training import metrics
from tests import xla_flags

REPO = Path(__file__).resolve().parents[2]
SMOKE_STEPS = 30
CHECKPOINT_EVERY = 10  # experiments/smoke.gin's


def env(**extra) -> dict[str, str]:
    out = dict(os.environ)
    out.update(
        PYTHONPATH=str(REPO),
        JAX_PLATFORMS="cpu",
        TF_CPP_MIN_LOG_LEVEL="3",
        XLA_FLAGS=xla_flags.with_devices(1),  # one device: faster on 2 cores
    )
    out.pop("LMSUITE_FAULT_KILL_DURING_SAVE", None)
    out.update(extra)
    return out


# XLNet with its memory in the train state, on the smoke run's schedule (30 steps, a checkpoint
# every 10, every step logged): a resumed run is bitwise only if the memory resumes too.
XLNET = (
    "--gin_file=experiments/xlnet_tiny.gin",
    "--gin.TRAIN_STEPS=30",
    "--gin.WARMUP_STEPS=5",
    "--gin.CHECKPOINT_EVERY=10",
    "--gin.SEQUENCE_LENGTH={'input_k': 64, 'target': 10}",
    "--gin.XLNetOptions.reuse_len=32",
    "--gin.XLNetOptions.mem_len=48",
    "--gin.BATCH_SIZE=8",
    "--gin.train.log_every=1",
    "--gin.train.eval_every=0",
    "--gin.train.final_eval=False",
    "--gin.train.progress_bar=False",
)


# Transformer-XL's LM on the same schedule: its memory is in the train state too.
TXL = (
    "--gin_file=experiments/txl_tiny.gin",
    "--gin.TRAIN_STEPS=30",
    "--gin.CHECKPOINT_EVERY=10",
    "--gin.SEQUENCE_LENGTH={'inputs': 32, 'targets': 32}",
    "--gin.XLNetOptions.mem_len=32",
    "--gin.BATCH_SIZE=8",
    "--gin.train.log_every=1",
    "--gin.train.eval_every=0",
    "--gin.train.final_eval=False",
    "--gin.train.progress_bar=False",
)


def command(model_dir: Path, *bindings: str) -> list[str]:
    """`lmsuite train` on smoke.gin, or on the gin file the bindings name first."""
    gin_file = [] if any(b.startswith("--gin_file=") for b in bindings) else [
        "--gin_file=experiments/smoke.gin"
    ]  # fmt: skip
    return [
        sys.executable,
        "-m",
        "lmsuite.cli",
        "train",
        *gin_file,
        f"--model_dir={model_dir}",
        *bindings,
    ]


def run(model_dir: Path, *bindings: str, timeout: float = 600, **extra_env):
    """Runs to completion; returns the CompletedProcess (stdout and stderr as text)."""
    return subprocess.run(
        command(model_dir, *bindings),
        env=env(**extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def start(model_dir: Path, *bindings: str, **extra_env) -> subprocess.Popen:
    """Starts a run; `wait_for_step` then reads only the lines it appends to metrics.jsonl."""
    path = model_dir / "metrics.jsonl"
    offset = path.stat().st_size if path.exists() else 0
    process = subprocess.Popen(
        command(model_dir, *bindings),
        env=env(**extra_env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    process.metrics_offset = offset
    return process


def new_steps(process: subprocess.Popen, model_dir: Path) -> list[int]:
    """The steps whose loss `process` has logged so far (complete lines)."""
    path = model_dir / "metrics.jsonl"
    if not path.exists():
        return []
    with path.open("rb") as f:
        f.seek(process.metrics_offset)
        text = f.read().decode()
    steps = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "loss" in record:
            steps.append(record["step"])
    return steps


def losses(model_dir: Path) -> dict[int, float]:
    """step -> loss from metrics.jsonl's history (see `metrics.read_jsonl`)."""
    records = metrics.read_jsonl(model_dir / "metrics.jsonl")
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def wait_for_step(process: subprocess.Popen, model_dir: Path, step: int, timeout: float = 600):
    """Polls metrics.jsonl until `step` is logged (or the process ends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if max(new_steps(process, model_dir), default=0) >= step or process.poll() is not None:
            return
        time.sleep(0.05)
    raise TimeoutError(f"step {step} not reached in {timeout} s")


def committed_steps(model_dir: Path) -> list[int]:
    """The steps Orbax committed (renamed from its temporary name), oldest first."""
    root = model_dir / "checkpoints"
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit())


def copy_run(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target
