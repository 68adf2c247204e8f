"""Orbax checkpoints that are committed explicitly and verified before they are loaded.

Layout: `MODEL_DIR/checkpoints/<step>/` holds Orbax's `state` item (the TrainState) and `data`
item (the input position: batches consumed), plus our `COMMITTED` manifest, written only after
the asynchronous save has finished: a JSON map from every file of the step to its size. A step
without the manifest, or whose files are missing or have other sizes (a truncated array), is
damaged: `restore_latest` names it and why, moves it to `MODEL_DIR/checkpoints.damaged/`, and
falls back to the previous committed step. A complete step that does not fit the current train
state (a changed config) is an error, not a fallback. Orbax's own temporary directories left by
a killed save are removed when the manager starts.

Every Orbax call runs on one worker thread. With `nice` > 0 (the default on a CPU-only host,
`default_checkpoint_nice`) that thread, and the Orbax and TensorStore threads it starts, run at
low priority, and `save` returns at once after copying the state (the next train step donates
its buffers) instead of pausing the step for Orbax's blocking phase (20-60 ms on 2 cores).
With `nice` 0 (accelerators), `save` waits for Orbax's blocking phase (its copy of the state to
host memory) and the file writes continue in the background, as Orbax intends.
"""

import json
import os
import signal
import sys
import time
from concurrent import futures
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from lmsuite.training import thread_priority

MANIFEST = "COMMITTED"
TMP_MARKER = ".orbax-checkpoint-tmp-"  # Orbax writes a step here, then renames it
# Fault injection for tests/integration: SIGKILL this process right after the (asynchronous)
# save of this step has started, so the kill lands while the checkpoint is being written.
KILL_DURING_SAVE_ENV = "LMSUITE_FAULT_KILL_DURING_SAVE"


def default_checkpoint_nice() -> int:
    """19 when the step runs on the host's cores (the CPU backend) in one process, else 0.

    A background save in several processes could order Orbax's cross-process barriers
    differently from the train step's collectives, so multi-process runs save in the caller.
    """
    if not thread_priority.supported():
        return 0
    return 19 if jax.default_backend() == "cpu" and jax.process_count() == 1 else 0


@jax.jit
def _copy(tree: Any) -> Any:
    """New buffers with the same values and shardings."""
    return jax.tree.map(lambda x: x.copy(), tree)


class DamagedCheckpointError(ValueError):
    """A checkpoint step that must not be loaded; the message names the step and the damage."""


def absolute(path: str | epath.PathLike) -> epath.Path:
    """A local path with `~` expanded, made absolute; a gs:// (or other URI) path as it is.

    Orbax refuses relative paths, and epath's own `absolute()` would turn gs://bucket/run into
    $PWD/gs:/bucket/run.
    """
    if "://" in str(path):
        return epath.Path(path)
    return epath.Path(os.path.abspath(os.path.expanduser(os.fspath(path))))


def run_directory(path: str | epath.PathLike, *, flag: str = "model_dir") -> str:
    """`absolute(path)` as a string, refusing a regular file (a run is a directory).

    Raises:
      ValueError: naming the flag and the file, when `path` is an existing regular file.
    """
    resolved = absolute(path)
    if "://" not in str(resolved) and os.path.isfile(resolved):
        raise ValueError(
            f"{flag} {os.fspath(path)!r} is a file ({resolved}); expected a run directory "
            "(the folder `lmsuite train --model_dir` wrote: run.json, checkpoints/)"
        )
    return str(resolved)


def _files(step_dir: epath.Path) -> dict[str, int]:
    """Every file under `step_dir` (but the manifest) -> its size in bytes."""
    found = {}
    pending = [step_dir]
    while pending:  # epath has no rglob (on GCS it would be one listing per directory anyway)
        for path in pending.pop().iterdir():
            if path.is_dir():
                pending.append(path)
            elif path.name != MANIFEST:
                found[str(path.relative_to(step_dir))] = path.stat().length
    return dict(sorted(found.items()))


def verify(step_dir: str | epath.PathLike) -> None:
    """Raises DamagedCheckpointError unless `step_dir` is committed and complete."""
    step_dir = epath.Path(step_dir)
    manifest = step_dir / MANIFEST
    if not manifest.exists():
        raise DamagedCheckpointError(
            f"checkpoint {step_dir} has no {MANIFEST} marker: its save never finished"
        )
    try:
        expected = json.loads(manifest.read_text())
    except json.JSONDecodeError as error:
        raise DamagedCheckpointError(
            f"checkpoint {step_dir}: unreadable {MANIFEST}: {error}"
        ) from error
    found = _files(step_dir)
    problems = [f"missing {name}" for name in expected if name not in found]
    problems += [
        f"{name} has {found[name]} bytes, expected {size}"
        for name, size in expected.items()
        if name in found and found[name] != size
    ]
    if problems:
        raise DamagedCheckpointError(f"checkpoint {step_dir} is damaged: " + "; ".join(problems))


class Checkpointer:
    """Saves (asynchronously) and restores TrainState plus the data position.

    Args:
      directory: the checkpoint root, e.g. MODEL_DIR/checkpoints.
      keep: how many committed steps to keep (None: all).
      async_save: write in a background thread while training continues.
      nice: the scheduling priority of the checkpoint thread, 0-19 (see the module docstring);
        above 0 `save` returns without waiting for Orbax. One process only.
    """

    def __init__(
        self,
        *,
        directory: str | epath.PathLike,
        keep: int | None = 3,
        async_save: bool = True,
        nice: int = 0,
    ):
        if keep is not None and keep < 2:
            raise ValueError(f"keep must be >= 2 so that a damaged step has a fallback, got {keep}")
        thread_priority.check(nice, what="checkpoint")
        if nice and jax.process_count() > 1:
            raise ValueError(
                f"checkpoint nice {nice} needs a single process, this run has "
                f"{jax.process_count()}: use 0 (saves start in the caller, in step order)"
            )
        self.directory = absolute(directory)  # local or gs://
        self._nice = nice
        self._pending: list[int] = []  # started, not yet committed; touched by the worker only
        self._inflight: list[futures.Future] = []  # saves handed to the worker
        # Linux schedules threads individually: the worker's priority is inherited by the
        # threads Orbax and TensorStore start from it.
        self._worker = futures.ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="checkpoint",
            initializer=lambda: thread_priority.lower_this_thread(nice),
        )
        self.manager = self._call(self._open, async_save, keep)

    def _call(self, fn, *args):
        """Runs `fn` on the worker after everything queued before it; returns its result."""
        return self._worker.submit(fn, *args).result()

    def _open(self, async_save: bool, keep: int | None) -> ocp.CheckpointManager:
        if jax.process_index() == 0 and self.directory.exists():
            # Orbax also cleans these, but in a background future; do it before anything reads.
            for leftover in self.directory.glob(f"*{TMP_MARKER}*"):
                print(f"lmsuite: removing unfinished checkpoint {leftover}", file=sys.stderr)
                leftover.rmtree()
        return ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                enable_async_checkpointing=async_save,
                cleanup_tmp_directories=True,
            ),
            item_names=("state", "data"),
        )

    def save(self, step: int, state: Any, data_position: dict[str, int]) -> None:
        """Starts saving `state` and `data_position` as `step`; commits earlier saves first.

        With `nice` > 0 this returns after copying `state` (on the device, for the train step
        donates its buffers); otherwise after Orbax's blocking phase. An error in the save is
        raised by the next `save`, `commit` or `close`.
        """
        inflight, self._inflight = self._inflight, []
        for future in inflight:
            if future.done():
                future.result()  # raises a failed background save here
            else:
                self._inflight.append(future)
        if self._nice:
            state = _copy(state)
        future = self._worker.submit(self._start_save, step, state, dict(data_position))
        self._inflight.append(future)
        if not self._nice:
            future.result()

    def _start_save(self, step: int, state: Any, data_position: dict[str, int]) -> None:
        if step in self._pending or step in self.manager.all_steps():
            return
        self._commit()
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_position)
            ),
            force=True,
        )
        self._pending.append(step)
        if os.environ.get(KILL_DURING_SAVE_ENV) == str(step):
            os.kill(os.getpid(), signal.SIGKILL)

    def commit(self) -> None:
        """Waits for pending saves and writes their manifests (process 0)."""
        inflight, self._inflight = self._inflight, []
        for future in inflight:
            future.result()
        self._call(self._commit)

    def _commit(self) -> None:
        self.manager.wait_until_finished()
        if jax.process_index() == 0:
            for step in self._pending:
                step_dir = self.directory / str(step)
                if step_dir.exists():  # it may already be rotated out by `keep`
                    tmp = step_dir / (MANIFEST + ".tmp")
                    tmp.write_text(json.dumps(_files(step_dir), indent=0))
                    tmp.rename(step_dir / MANIFEST)
        self._pending = []

    def committed_steps(self) -> list[int]:
        """Steps with a manifest, oldest first (not yet verified)."""
        steps = self._call(self.manager.all_steps)
        return [s for s in steps if (self.directory / str(s) / MANIFEST).exists()]

    def restore_latest(self, abstract_state: Any) -> tuple[Any, dict[str, int]] | None:
        """Restores the newest verified step, or returns None when there is none.

        Damaged steps are reported on stderr with the reason, moved aside, and skipped.
        """
        return self._call(self._restore_latest, abstract_state)

    def _restore_latest(self, abstract_state: Any) -> tuple[Any, dict[str, int]] | None:
        for step in sorted(self.manager.all_steps(), reverse=True):
            step_dir = self.directory / str(step)
            try:
                verify(step_dir)
            except DamagedCheckpointError as error:
                print(f"lmsuite: not loading checkpoint step {step}: {error}", file=sys.stderr)
                self._move_aside(step)
                continue
            try:
                restored = self.manager.restore(
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()
                    ),
                )
            except (ValueError, OSError) as error:
                # Complete on disk but not this run's state: most likely a changed model or
                # optimizer configuration, which must not be papered over by a fallback.
                raise ValueError(
                    f"checkpoint {step_dir} is committed and complete but does not restore into "
                    f"this run's train state (was the model or optimizer changed?): {error}"
                ) from error
            return restored.state, dict(restored.data)
        return None

    def _move_aside(self, step: int) -> None:
        if jax.process_index() == 0:
            damaged = self.directory.parent / (self.directory.name + ".damaged")
            damaged.mkdir(exist_ok=True)
            target = damaged / f"{step}-{int(time.time())}"
            (self.directory / str(step)).rename(target)
            print(f"lmsuite: moved damaged step {step} to {target}", file=sys.stderr)
        if jax.process_count() > 1:
            # The other processes must not list the steps before process 0 has moved this one:
            # a process that still saw it would skip saving that step while process 0 saves it,
            # and the pod would hang in the save's barrier. (The main thread waits in `_call`,
            # so this collective cannot interleave with a train step's.)
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"lmsuite_moved_aside_{step}")
        self.manager.reload()

    def close(self) -> None:
        """Commits pending saves and stops the worker."""
        try:
            self.commit()
            self._call(self.manager.close)
        finally:
            self._worker.shutdown(wait=True)
