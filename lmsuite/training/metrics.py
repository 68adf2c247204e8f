"""Where training metrics go: CLU writers (TensorBoard event files) and MODEL_DIR/metrics.jsonl.

`metrics.jsonl` holds one JSON object per logged step, e.g.
  {"step": 10, "loss": 5.91, "learning_rate": 0.0001, "grad_norm": 1.3, "tokens_per_sec": 8123.0,
   "mlm_accuracy": 0.04, ...}
Floats are written with Python's shortest round-trip repr, so a float32 loss read back is
bit-identical. On resume, lines for steps after the restored step are dropped first, so the file
is one history.
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
        if self.is_writer:
            truncate_after(self.path, resume_step)

    def write(self, step: int, scalars: dict[str, Any]) -> None:
        scalars = {k: float(v) for k, v in scalars.items()}
        self.writer.write_scalars(step, scalars)
        if self.is_writer:
            record = {"step": step} | {k: _json_float(v) for k, v in scalars.items()}
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


def _json_float(x: float):
    # JSON has no NaN/Inf; write them as strings so a diverged step is still recorded.
    return x if math.isfinite(x) else str(x)


def read_jsonl(path: str | epath.PathLike) -> list[dict]:
    """The complete records of a metrics.jsonl (a torn last line from a kill is ignored)."""
    records = []
    path = epath.Path(path)
    if not path.exists():
        return records
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


def truncate_after(path: str | epath.PathLike, step: int) -> None:
    """Keeps only complete records with `step <= step` (atomically rewritten)."""
    path = epath.Path(path)
    if not path.exists():
        return
    kept = [r for r in read_jsonl(path) if r["step"] <= step]
    tmp = path.parent / (path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    tmp.replace(path)
