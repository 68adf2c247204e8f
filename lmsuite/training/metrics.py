"""Where training metrics go: CLU writers (TensorBoard event files) and MODEL_DIR/metrics.jsonl.

`metrics.jsonl` holds one JSON object per logged step, e.g.
  {"step": 10, "loss": 5.91, "learning_rate": 0.0001, "grad_norm": 1.3, "tokens_per_sec": 8123.0,
   "mlm_accuracy": 0.04, ...}
Floats are written with Python's shortest round-trip repr, so a float32 loss read back is
bit-identical. The file is only ever appended to: a resumed run first writes a marker,
  {"step": 20, "resumed": true}
and its own lines follow. `read_jsonl` reads one history from it: at a marker, the lines of the
steps after the restored one (logged by the run that was stopped, and about to be logged again)
are dropped. A torn last line (a kill mid-write) is ended before the marker, so it stays one
unreadable line.
"""

import json
import math
from typing import Any

import jax
from clu import metric_writers
from etils import epath


class MetricsLog:
    """Writes scalars to TensorBoard (via CLU) and to `metrics.jsonl`; only process 0 writes."""

    def __init__(self, *, model_dir: str | epath.PathLike, resume_step: int = 0):
        self.path = epath.Path(model_dir) / "metrics.jsonl"  # local or gs://
        self.is_writer = jax.process_index() == 0
        self.writer = metric_writers.create_default_writer(
            str(epath.Path(model_dir) / "tensorboard"), just_logging=not self.is_writer
        )
        if self.is_writer and resume_step:
            mark_resumed(self.path, resume_step)

    def write(self, step: int, scalars: dict[str, Any]) -> None:
        scalars = {k: float(v) for k, v in scalars.items()}
        self.writer.write_scalars(step, scalars)
        if self.is_writer:
            record = {"step": step} | {k: _json_float(v) for k, v in scalars.items()}
            self._append(json.dumps(record) + "\n")

    def _append(self, text: str) -> None:
        with self.path.open("a") as f:
            f.write(text)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


def _json_float(x: float):
    # JSON has no NaN/Inf; write them as strings so a diverged step is still recorded.
    return x if math.isfinite(x) else str(x)


RESUMED = "resumed"


def _marker(step: int) -> dict:
    return {"step": step, RESUMED: True}


def mark_resumed(path: str | epath.PathLike, step: int) -> None:
    """Appends the marker of a run resumed from `step` (see the module docstring)."""
    path = epath.Path(path)
    if not path.exists():
        return
    with path.open("a") as f:
        f.write(_end_torn_line(path) + json.dumps(_marker(step)) + "\n")


def _end_torn_line(path: epath.Path) -> str:
    """A newline when the file's last line is unfinished (a kill mid-write), else nothing."""
    text = path.read_text()
    return "\n" if text and not text.endswith("\n") else ""


def read_jsonl(path: str | epath.PathLike) -> list[dict]:
    """One history from a metrics.jsonl: the complete records, with the lines a resumed run
    replaced dropped (see the module docstring); unreadable (torn) lines are skipped."""
    records: list[dict] = []
    path = epath.Path(path)
    if not path.exists():
        return records
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get(RESUMED) is True:
            records = [r for r in records if r["step"] <= record["step"]]
        else:
            records.append(record)
    return records
