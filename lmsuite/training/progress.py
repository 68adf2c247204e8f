"""What the training loop reports while it runs: each step's metrics read back (a NaN/Inf loss
stops the run), logged every `log_every` steps with steps/s, tokens/s and MFU to metrics.jsonl,
TensorBoard and the progress bar."""

import collections
import time
from collections.abc import Callable

import jax
from tqdm import tqdm

from lmsuite.training import report
from lmsuite.training.checkpointing import Checkpointer
from lmsuite.training.metrics import MetricsLog
from lmsuite.training.train_config import TrainerConfig


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm became NaN/Inf; the message names the step."""


class RateWindow:
    """Steps/s and tokens/s of the training loop, for the progress bar and metrics.jsonl.

    Each rate spans the steps since the previous log, stretched back to cover at least
    `min_seconds` (but not before the first step, which includes compilation; only the first log
    reaches back to the loop's start). The host reads step k's metrics only after dispatching
    step k + 1 and logging the step before, so the moment a read returns lags the step's end by
    however long the host was busy; over a single-step window that lag can exceed the step
    itself (a log_every=1 run read 4,042 steps/s for an 80 steps/s step). Over seconds the lag
    at a span's two ends is small against the span.
    """

    def __init__(self, start: float, min_seconds: float = 2.0):
        self.min_seconds = min_seconds
        self._points = collections.deque([(start, 0, 0.0)])  # (time, steps, tokens), cumulative
        self._last_log = self._points[0]

    def add(self, now: float, tokens: float) -> None:
        _, steps, total = self._points[-1]
        self._points.append((now, steps + 1, total + tokens))

    def rates(self) -> tuple[float, float]:
        """(steps/s, tokens/s) ending at the newest point, which becomes the last log."""
        now, steps, tokens = self._points[-1]
        points = self._points
        if self._last_log[1] == 0:  # the first log: everything since the loop started
            start = self._last_log
        else:
            # Keep the newest point at least min_seconds old (or the first step's, if none is
            # that old); amortised O(1) per step, as each point is dropped once.
            while len(points) > 1 and (points[0][1] == 0 or now - points[1][0] >= self.min_seconds):
                points.popleft()
            start = min(points[0], self._last_log)  # by time: the earlier of the two
        self._last_log = points[-1]
        elapsed = max(now - start[0], 1e-9)
        return (steps - start[1]) / elapsed, (tokens - start[2]) / elapsed


class StepLog:
    """Reads the loop's step metrics back and logs them (see the module docstring).

    `flops_per_step` is set by the loop once the step is lowered; `last_logged` holds the last
    logged scalars (the run's final training metrics).
    """

    def __init__(
        self,
        trainer: TrainerConfig,
        *,
        log: MetricsLog,
        checkpointer: Checkpointer,
        input_wait: Callable[[], float],
        start_step: int,
    ):
        self._log, self._ckpt, self._input_wait = log, checkpointer, input_wait
        self._train_steps, self._log_every = trainer.train_steps, trainer.log_every
        self._skip_nonfinite = trainer.skip_nonfinite
        peak = trainer.peak_flops_per_device
        # Resolved now: on CPU it is measured, which must not happen while a step runs.
        self._peak_flops = report.device_peak_flops() if peak is None else peak
        self.flops_per_step: float | None = None
        self.last_logged: dict[str, float] = {}
        show = trainer.progress_bar and jax.process_index() == 0
        self._bar = tqdm(total=self._train_steps, initial=start_step, disable=not show, unit="step")
        self._rates = RateWindow(time.perf_counter())

    def __call__(self, done: int, metrics: dict) -> None:
        """Reads step `done`'s metrics: stops on NaN/Inf, logs every `log_every` steps."""
        host = jax.device_get(metrics)
        self._rates.add(time.perf_counter(), float(host["num_tokens"]))
        if host["nonfinite"] and not self._skip_nonfinite:
            committed = self._ckpt.committed_steps()
            where = (
                f"The last good checkpoint is step {max(committed)} in {self._ckpt.directory}"
                if committed
                else f"No checkpoint had been written yet (none in {self._ckpt.directory})"
            )
            raise NonFiniteLossError(
                f"loss is {float(host['loss'])} (grad_norm {float(host['grad_norm'])}) at "
                f"step {done}; stopping without saving. {where}"
            )
        self._bar.update(1)
        if done % self._log_every and done != self._train_steps:
            return
        steps_per_sec, tokens_per_sec = self._rates.rates()
        scalars = {k: v for k, v in host.items() if k != "nonfinite"}
        scalars["tokens_per_sec"] = tokens_per_sec
        scalars["steps_per_sec"] = steps_per_sec
        scalars["input_wait_sec"] = self._input_wait()
        scalars["checkpoint_wait_sec"] = self._ckpt.wait_seconds
        mfu = report.mfu(
            flops_per_step=self.flops_per_step,
            steps_per_sec=steps_per_sec,
            peak_flops_per_device=self._peak_flops,
        )
        if mfu is not None:
            scalars["mfu"] = mfu
        self._log.write(done, scalars)
        self.last_logged = {k: float(v) for k, v in scalars.items()}
        self._bar.set_postfix(
            loss=f"{float(host['loss']):.4f}",
            tok_s=f"{scalars['tokens_per_sec']:.0f}",
            mfu="n/a" if mfu is None else f"{100 * mfu:.1f}%",
        )

    def close(self) -> None:
        self._bar.close()
