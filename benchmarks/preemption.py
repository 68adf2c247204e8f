"""What a preemption costs: SIGTERM's exit time, the steps lost to SIGKILL, and the process's
peak host memory while it saves, for a tiny and a base-sized model on this machine's CPU.

  python benchmarks/preemption.py [--configs=tiny,base] [--kills=3]

For each config, `lmsuite train` runs in a subprocess:
- SIGTERM once step `--term_at` is logged; the time until the process exits (it commits the
  current step first: at most the save in flight plus one more) and whether the newest
  committed step is the step it stopped at.
- `--kills` times: SIGKILL at a random logged step, then read the newest committed step: the
  steps lost, against the bound (one checkpoint interval plus the steps run while the next
  save was written, at most another interval).
- The peak resident memory of the training process (VmHWM) over the SIGTERM run, and its
  resident memory just before the first save, so the save queue's share shows.
The tiny config is experiments/smoke.gin (a checkpoint every 10 steps); the base-sized one is
BERT-Base (110M parameters, Adam: 1.3 GB of train state) on the embedded wiki_sample corpus at
batch 2 x 128, a checkpoint every 4 steps. The target is SIGTERM's exit under 30 s for both.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lmsuite.training import metrics  # noqa: E402

CONFIGS = {
    "tiny": dict(
        flags=["--gin_file=experiments/smoke.gin", "--gin.TRAIN_STEPS=200"],
        every=10,
    ),
    "base": dict(
        flags=[
            "--gin_file=experiments/bert_base.gin",
            "--gin.TASK='wiki_sample_bert_mlm_nsp'",
            "--gin.SEQUENCE_LENGTH={'input_ids': 128, 'masked_ids': 20}",
            "--gin.BATCH_SIZE=2",
            "--gin.TRAIN_STEPS=60",
            "--gin.WARMUP_STEPS=2",
            "--gin.CHECKPOINT_EVERY=4",
            "--gin.train.eval_every=0",
            "--gin.train.final_eval=False",
        ],
        every=4,
    ),
}


def _start(model_dir: Path, flags: list[str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "lmsuite.cli", "train", f"--model_dir={model_dir}", *flags]
    command += ["--gin.train.progress_bar=False", "--gin.train.log_every=1"]
    environment = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    return subprocess.Popen(
        command, cwd=REPO, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def _logged(model_dir: Path) -> int:
    records = metrics.read_jsonl(model_dir / "metrics.jsonl")
    return max((r["step"] for r in records if "loss" in r), default=0)


def _committed(model_dir: Path) -> int:
    root = model_dir / "checkpoints"
    return max((int(p.name) for p in root.iterdir() if p.name.isdigit()), default=0)


def _rss_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


def _wait_for(process, model_dir: Path, step: int, timeout: float = 1800) -> dict:
    deadline = time.monotonic() + timeout
    before_save = 0
    while _logged(model_dir) < step:
        if process.poll() is not None:
            raise RuntimeError(f"the run ended early: {process.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"step {step} not logged in {timeout} s")
        if not (model_dir / "checkpoints").exists() or _committed(model_dir) == 0:
            before_save = max(before_save, _rss_kib(process.pid, "VmRSS"))
        time.sleep(0.02)
    return {"rss_before_first_save_mib": before_save / 1024}


def sigterm(name: str, term_at: int, workdir: Path) -> dict:
    config = CONFIGS[name]
    model_dir = workdir / f"{name}-term"
    process = _start(model_dir, config["flags"])
    seen = _wait_for(process, model_dir, term_at)
    peak = _rss_kib(process.pid, "VmHWM")
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    while process.poll() is None:
        peak = max(peak, _rss_kib(process.pid, "VmHWM"))
        time.sleep(0.01)
    exit_seconds = time.monotonic() - sent
    process.communicate()
    stopped = _logged(model_dir)
    return {
        "config": name,
        "sigterm_exit_s": round(exit_seconds, 2),
        "exit_code": process.returncode,
        "stopped_at": stopped,
        "committed": _committed(model_dir),
        "peak_rss_mib": round(peak / 1024, 1),
        "rss_before_first_save_mib": round(seen["rss_before_first_save_mib"], 1),
    }


def kills(name: str, count: int, workdir: Path, seed: int = 0) -> list[dict]:
    config, rng, out = CONFIGS[name], random.Random(seed), []
    every = config["every"]
    for trial in range(count):
        model_dir = workdir / f"{name}-kill{trial}"
        process = _start(model_dir, config["flags"])
        step = rng.randint(every + 1, 6 * every)
        _wait_for(process, model_dir, step)
        time.sleep(rng.uniform(0, 0.5))
        process.kill()
        process.communicate()
        logged, committed = _logged(model_dir), _committed(model_dir)
        out.append({"config": name, "killed_after": logged, "committed": committed,
                    "steps_lost": logged - committed, "bound": 2 * every})  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="tiny,base")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--term_at", type=int, default=0, help="default: 3 intervals + 3")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.configs.split(","):
            every = CONFIGS[name]["every"]
            result = sigterm(name, args.term_at or 3 * every + 3, Path(workdir))
            print(json.dumps(result), flush=True)
            for row in kills(name, args.kills, Path(workdir)):
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
