"""Orbax checkpoints: one save at a time, committed by Orbax when written, checksummed, verified
before they are loaded.

Layout: `MODEL_DIR/checkpoints/<step>/` holds Orbax's `state` item (the TrainState) and `data`
item (the input position: batches consumed). What is Orbax's and what is ours:
- The commit is Orbax's (its CheckpointManager's atomic rename on a disk, `commit_success.txt`
  on a bucket), made in its background thread once every process's shards are written, so a
  finished save is committed even if the process is killed a moment later.
- The checksums are ours (`checkpoint_integrity`): written inside the step by Orbax's
  `post_finalization_callback`, just before the commit, and checked on resume and on
  `lmsuite.load`. A damaged step is named with its file, moved to `checkpoints.damaged/`, and
  the previous step is restored.
- The bound is ours: Orbax queues any number of saves. `save` first waits for the save before
  it, so committed progress trails the loop by at most one checkpoint interval and one copy of
  the state is in flight. The time waited is `wait_seconds` (metrics.jsonl's
  `checkpoint_wait_sec`), and a wait of a second or more is printed.
- A failed save (a full disk) is one `CheckpointWriteError` naming the path and the free space;
  its unfinished directory is removed, the committed steps are untouched.
Orbax's temporary directories left by a killed save are named on stderr and removed at start.

Every Orbax call runs on one worker thread. With `nice` > 0 (the default on a CPU-only host,
`default_checkpoint_nice`) that thread, and the Orbax and TensorStore threads it starts, run at
low priority, and `save` returns at once after copying the state (the next train step donates
its buffers) instead of pausing the step for Orbax's blocking phase. With `nice` 0
(accelerators, pods), `save` waits for Orbax's blocking phase (its copy of the state to host
memory) and the file writes continue in the background, as Orbax intends.
"""

import errno
import os
import shutil
import signal
import sys
import time
from concurrent import futures
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import path as ocp_path

from lmsuite.training import checkpoint_integrity, thread_priority
from lmsuite.training.checkpoint_integrity import MANIFEST, DamagedCheckpointError, verify

__all__ = ["MANIFEST", "CheckpointWriteError", "Checkpointer", "DamagedCheckpointError", "verify"]

TMP_SUFFIX = ocp_path.atomicity_types.TMP_DIR_SUFFIX  # "<step>.orbax-checkpoint-tmp..."
# Fault injection for tests/integration: SIGKILL this process right after the (asynchronous)
# save of this step has started, so the kill lands while the checkpoint is being written.
KILL_DURING_SAVE_ENV = "LMSUITE_FAULT_KILL_DURING_SAVE"
REPORTED_WAIT_SECONDS = 1.0


class CheckpointWriteError(RuntimeError):
    """A checkpoint save failed (e.g. a full disk); the committed steps are intact."""


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


def _free_space(path: epath.Path) -> str:
    if "://" in str(path):
        return "unknown free space (a bucket)"
    try:
        return f"{shutil.disk_usage(path).free / 2**20:.1f} MiB free"
    except OSError:
        return "unknown free space"


def _disk_full(error: BaseException) -> bool:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def _write_replicated_arrays_whole() -> None:
    """In a single process, Orbax saves each replicated array whole, from one device.

    Orbax's default for jax.Array (replica-parallel saving) divides a replicated array's write
    among the replicas that hold it, so that on a pod each host writes a part instead of host 0
    writing all of it. In a single process that one process writes every part anyway, and each
    part is cut out by a slice compiled for its shape and device: the first save compiles one
    per replica of every array shape, most of a small model's save, to no end. Multi-process
    runs keep Orbax's default. What is saved, and how it restores, is the same either way.

    `StandardSave` takes no handler of its own, so this turns the setting off on Orbax's
    process-wide handler for jax.Array (registering another one would log a warning on stderr).
    """
    if jax.process_count() > 1:
        return
    registered = ocp.type_handlers.get_type_handler(jax.Array)
    if getattr(registered, "_use_replica_parallel", False):
        registered._use_replica_parallel = False


def _refuse_other_shapes(step_dir: epath.Path, abstract_state: Any) -> None:
    """Refuses, before any array is read, a checkpoint whose arrays have other shapes than
    `abstract_state`'s, naming the first such array and how many differ.

    Orbax would refuse it too, but only while reading, with a message naming no array, and
    with its other reads abandoned mid-flight. Arrays are matched by their path in the tree
    (`params/dense/kernel`); paths on one side only, or metadata Orbax cannot read, are left
    to Orbax's restore to judge.
    """
    handler = ocp.StandardCheckpointHandler()
    try:
        saved = handler.metadata(step_dir / "state")
    except Exception:  # a missing or unreadable _METADATA: the restore reports what is wrong
        return
    finally:
        handler.close()

    def shapes(tree) -> dict[str, tuple[int, ...]]:
        return {
            jax.tree_util.keystr(path, simple=True, separator="/"): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
            if getattr(leaf, "shape", None) is not None
        }

    stored, wanted = shapes(saved), shapes(abstract_state)
    differ = [path for path in wanted if path in stored and stored[path] != wanted[path]]
    if differ:
        first = differ[0]
        others = f" (and {len(differ) - 1} more arrays)" if len(differ) > 1 else ""
        raise ValueError(
            f"checkpoint {step_dir} is committed and complete but does not restore into this "
            f"run's train state (was the model or optimizer changed?): {first} is "
            f"{stored[first]} in the checkpoint and {wanted[first]} in this run{others}"
        )


def newest_data_position(directory: str | epath.PathLike) -> int:
    """The data position (batches consumed) of the newest step under `directory` whose record
    reads, or 0 when there is none; reads, never writes, and verifies nothing.

    A resume's checks read it before the run restores anything (`resume_checks`): the step it
    restores is this one or, if this one turns out damaged, an earlier one, never a later.
    """
    directory = absolute(directory)
    if not directory.exists():
        return 0
    manager = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(read_only=True, create=False),
        item_names=("state", "data"),
    )
    only_data = ocp.args.Composite(data=ocp.args.JsonRestore())
    try:
        for step in sorted(manager.all_steps(), reverse=True):
            try:
                restored = manager.restore(step, args=only_data)
                return int(dict(restored.data)["batches_consumed"])
            except (ValueError, OSError, KeyError, TypeError):
                continue  # a damaged record: the restore will skip this step too
        return 0
    finally:
        manager.close()


class Checkpointer:
    """Saves (asynchronously, one save at a time) and restores TrainState plus the data position.

    Args:
      directory: the checkpoint root, e.g. MODEL_DIR/checkpoints.
      keep: how many committed steps to keep (None: all).
      nice: the scheduling priority of the checkpoint thread, 0-19 (see the module docstring);
        above 0 `save` returns without waiting for Orbax. One process only.
    """

    def __init__(self, *, directory: str | epath.PathLike, keep: int | None = 3, nice: int = 0):
        if keep is not None and keep < 2:
            raise ValueError(f"keep must be >= 2 so that a damaged step has a fallback, got {keep}")
        thread_priority.check(nice, what="checkpoint nice")
        if nice and jax.process_count() > 1:
            raise ValueError(
                f"checkpoint nice {nice} needs a single process, this run has "
                f"{jax.process_count()}: use 0 (saves start in the caller, in step order)"
            )
        self.directory = absolute(directory)  # local or gs://
        _write_replicated_arrays_whole()
        self._nice = nice
        self._saving: int | None = None  # the step of the save in flight (at most one)
        self._inflight: futures.Future | None = None  # its start, handed to the worker
        self.wait_seconds = 0.0  # time `save` spent waiting for the save before it
        # Linux schedules threads individually: the worker's priority is inherited by the
        # threads Orbax and TensorStore start from it.
        self._worker = futures.ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="checkpoint",
            initializer=lambda: thread_priority.lower_this_thread(nice),
        )
        self.manager = self._call(self._open, keep)

    def _call(self, fn, *args):
        """Runs `fn` on the worker after everything queued before it; returns its result."""
        return self._worker.submit(fn, *args).result()

    def _open(self, keep: int | None) -> ocp.CheckpointManager:
        if jax.process_index() == 0 and self.directory.exists():
            # Orbax also cleans these, but silently and in a background future.
            for leftover in self.directory.glob(f"*{TMP_SUFFIX}*"):
                print(
                    f"lmsuite: removing {leftover}: an unfinished save (the process stopped "
                    "before Orbax committed it)",
                    file=sys.stderr,
                )
                leftover.rmtree()
        return ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                enable_async_checkpointing=True,
                cleanup_tmp_directories=True,
                async_options=ocp.AsyncOptions(post_finalization_callback=self._record_checksums),
            ),
            item_names=("state", "data"),
        )

    def _record_checksums(self) -> None:
        """Orbax's callback (primary process) once every shard is written, before the commit."""
        step = self._saving
        unfinished = self.directory / f"{step}{TMP_SUFFIX}"
        checkpoint_integrity.record(
            unfinished if unfinished.exists() else self.directory / str(step)
        )

    def save(self, step: int, state: Any, data_position: dict[str, int]) -> None:
        """Waits for the previous save to be committed, then starts saving `step`.

        With `nice` > 0 this returns after copying `state` (on the device, for the train step
        donates its buffers); otherwise after Orbax's blocking phase.

        Raises:
          CheckpointWriteError: the previous save (or this one's start) failed.
        """
        previous = self._saving
        waited = self._wait_for_save()
        if waited >= REPORTED_WAIT_SECONDS:
            print(
                f"lmsuite: step {step} waited {waited:.1f} s for checkpoint step {previous} to "
                "be written (one save at a time)",
                file=sys.stderr,
            )
        if self._nice:
            state = _copy(state)
        self._inflight = self._worker.submit(self._start_save, step, state, dict(data_position))
        if not self._nice:
            self._wait_for_start()

    def _start_save(self, step: int, state: Any, data_position: dict[str, int]) -> None:
        if step in self.manager.all_steps():  # a resumed run's first step, or the last again
            return
        self._saving = step
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_position)
            ),
            force=True,
        )
        if os.environ.get(KILL_DURING_SAVE_ENV) == str(step):
            os.kill(os.getpid(), signal.SIGKILL)

    def _wait_for_start(self) -> None:
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return
        try:
            inflight.result()
        except Exception as error:
            raise self._failed(error) from error

    def _wait_for_save(self) -> float:
        """Waits until the save in flight is committed; returns the seconds waited."""
        start = time.perf_counter()
        self._wait_for_start()
        if self._saving is not None:
            try:
                self._call(self.manager.wait_until_finished)
            except Exception as error:
                raise self._failed(error) from error
            self._saving = None
        waited = time.perf_counter() - start
        self.wait_seconds += waited
        return waited

    def _failed(self, error: Exception) -> CheckpointWriteError:
        """The error for a failed save of `self._saving`, its unfinished directory removed."""
        step, self._saving = self._saving, None
        if jax.process_index() == 0:
            for leftover in self.directory.glob(f"{step}{TMP_SUFFIX}*"):
                leftover.rmtree()
        self._call(self.manager.reload)
        committed = self.committed_steps()
        newest = f"step {committed[-1]}" if committed else "none"
        if _disk_full(error):
            reason = f"the disk is full ({_free_space(self.directory)})"
        else:
            reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        return CheckpointWriteError(
            f"checkpoint step {step} could not be written to {self.directory}: {reason}; the "
            f"newest committed checkpoint is {newest}"
        )

    def commit(self) -> None:
        """Waits until the save in flight is committed (raises CheckpointWriteError if not)."""
        self._wait_for_save()

    def committed_steps(self) -> list[int]:
        """Steps Orbax has committed, oldest first (not yet verified)."""
        return list(self._call(self.manager.all_steps))

    def commit_time(self, step: int) -> float:
        """When `step` was committed (its manifest's modification time, seconds since the epoch)."""
        step_dir = self.directory / str(step)
        marker = step_dir / MANIFEST
        return (marker if marker.exists() else step_dir).stat().mtime

    def restore_latest(self, abstract_state: Any) -> tuple[Any, dict[str, int]] | None:
        """Restores the newest verified step, or returns None when there is none.

        Damaged steps are reported on stderr with the file and the damage, moved aside, and
        skipped.
        """
        return self._call(self._restore_latest, abstract_state)

    def _restore_latest(self, abstract_state: Any) -> tuple[Any, dict[str, int]] | None:
        for step in sorted(self.manager.all_steps(), reverse=True):
            step_dir = self.directory / str(step)
            try:
                checked = verify(step_dir)
            except DamagedCheckpointError as error:
                print(f"lmsuite: not loading checkpoint step {step}: {error}", file=sys.stderr)
                self._move_aside(step)
                continue
            if not checked:
                print(
                    f"lmsuite: checkpoint step {step} has no checksums (written before lmsuite "
                    "recorded them): loading it unchecked",
                    file=sys.stderr,
                )
            _refuse_other_shapes(step_dir, abstract_state)
            try:
                restored = self.manager.restore(
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()
                    ),
                )
            except (ValueError, OSError) as error:
                # Complete and checked on disk but not this run's state: most likely a changed
                # model or optimizer configuration, which must not be papered over by a fallback.
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
        """Waits for the save in flight and stops the worker."""
        try:
            self.commit()
            self._call(self.manager.close)
        finally:
            self._worker.shutdown(wait=True)
