"""A study's records on disk: where each run of `lmsuite study` keeps what it did, how long it
took, which from-scratch baseline it is, and what `--export` copies of it.

DIR/study.json is the protocol; each run lives in runs/EXPERIMENT/BUDGET/seedN/ (BUDGET is
`budget_label(budget)`, or `SCRATCH` for the no-pretraining baseline) and its result.json is
written last, whole or not at all, so that a run which has one is finished.
"""

import json
import os
import time

from lmsuite.cli.config import ConfigError

STUDY_FILE = "study.json"
RESULT_FILE = "result.json"
SCRATCH = "scratch"  # the budget directory of the no-pretraining baseline
SEGMENTS_FILE = "pretrain_segments.json"


def write_json(path: str, value) -> None:
    """Writes `value` as JSON through a temporary file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1)
    os.replace(tmp, path)  # whole or absent: a kill never leaves half a result


def budget_label(budget: float) -> str:
    """A budget's directory name: 2.5e12 -> "2.5e+12"."""
    return f"{budget:.4g}"


def run_dir(out_dir: str, experiment: str, budget: float | None, seed: int) -> str:
    """The directory of one run (budget None: the from-scratch baseline)."""
    label = SCRATCH if budget is None else budget_label(budget)
    return os.path.join(out_dir, "runs", experiment, label, f"seed{seed}")


def begin_segment(run_dir: str, metrics_path: str) -> list[dict]:
    """Appends this process's pretraining segment ({"start": now}) to the run's segments and
    returns them. A segment left without an end (its process was stopped) ends when it last
    wrote a metric, the metrics file's modification time: the time it spent after that (at
    most one log window, or an evaluation) is not counted."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, SEGMENTS_FILE)
    segments = []
    if os.path.exists(path):
        with open(path) as f:
            segments = json.load(f)
    if segments and "end" not in segments[-1]:
        last_write = os.path.getmtime(metrics_path) if os.path.exists(metrics_path) else 0.0
        segments[-1]["end"] = max(segments[-1]["start"], last_write)
    segments.append({"start": time.time()})
    write_json(path, segments)
    return segments


def end_segment(run_dir: str, segments: list[dict]) -> float:
    """Closes the last segment now and returns the seconds of all of them: the run's
    pretraining wall time across every process that worked on it."""
    segments[-1]["end"] = time.time()
    write_json(os.path.join(run_dir, SEGMENTS_FILE), segments)
    return sum(segment["end"] - segment["start"] for segment in segments)


def scratch_key(model) -> str:
    """A digest of what a from-scratch baseline depends on besides the seed and the study's
    protocol: the architecture (the whole ModelConfig) and the vocabulary with its template."""
    import hashlib

    digest = hashlib.sha256(repr(model.config).encode())
    if model.vocab is not None:
        digest.update(model.vocab.template.encode())
        digest.update(model.vocab.proto.SerializeToString(deterministic=True))
    return digest.hexdigest()


def find_scratch(out_dir: str, seed: int, key: str, *, besides: str) -> dict | None:
    """A finished from-scratch record of another experiment with this seed and `scratch_key`
    (computed here, not itself reused), or None."""
    root = os.path.join(out_dir, "runs")
    for experiment in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        path = os.path.join(run_dir(out_dir, experiment, None, seed), RESULT_FILE)
        if experiment == besides or not os.path.isfile(path):
            continue
        with open(path) as f:
            record = json.load(f)
        if record.get("scratch_key") == key and "same_as" not in record:
            return record
    return None


def scratch_record(cost) -> dict:
    """The from-scratch baseline's record: the architecture's size, nothing spent. Its probes
    take only the config and vocabulary of the same experiment and seed's first budget run
    (`finetune_classifier(from_scratch=True)` initialises every weight from the seed)."""
    return {
        "params": cost.params,
        "flops_per_step": cost.flops,
        "tokens_per_step": cost.tokens,
        "steps": 0,
        "flops": 0.0,
        "tokens": 0,
    }


# What `--export` copies: the study's files, and per finished run what reading it back needs
# (result.json) and what shows how it ran; checkpoints, TensorBoard logs and metrics.jsonl stay.
EXPORTED_RUN_FILES = (RESULT_FILE, SEGMENTS_FILE, "pretrain/config.gin", "pretrain/run.json")


def export_records(out_dir: str, dest: str) -> int:
    """Copies `out_dir`'s study.json, its report's files and its finished runs' records
    (`EXPORTED_RUN_FILES`, each probe rate's metrics.json) to `dest`; returns how many runs.
    A run without result.json is left: without its checkpoints it would start again anyway.

    Raises:
      ConfigError: `out_dir` holds no study.
    """
    import shutil

    from lmsuite.evaluation import study_report

    if not os.path.isfile(os.path.join(out_dir, STUDY_FILE)):
        raise ConfigError([f"--out={out_dir} holds no study to export ({STUDY_FILE} is missing)"])
    study_files = (STUDY_FILE, *study_report.FILES)
    wanted = [f for f in study_files if os.path.isfile(os.path.join(out_dir, f))]
    runs = 0
    for root, _, files in os.walk(os.path.join(out_dir, "runs")):
        if RESULT_FILE not in files:
            continue
        runs += 1
        run = os.path.relpath(root, out_dir)
        wanted += [os.path.join(run, f) for f in EXPORTED_RUN_FILES]
        for probe_root, _, probe_files in os.walk(os.path.join(root, "probes")):
            if "metrics.json" in probe_files:
                wanted.append(os.path.join(os.path.relpath(probe_root, out_dir), "metrics.json"))
    for name in wanted:
        source = os.path.join(out_dir, name)
        if os.path.isfile(source):
            os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
            shutil.copy2(source, os.path.join(dest, name))
    return runs
