"""A quiet start for the command line: TensorFlow's, absl's and the data libraries' start-up
chatter silenced, everything else left as it was (`lmsuite ... --verbose` keeps it all).

What a run printed before its first line of its own, and where each line is silenced:

  WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
  I0000 ... port.cc:153] oneDNN custom operations are on. ...  (CPUs with AVX-512 VNNI/BF16, AMX)
  I0000 ... cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
  I0000 ... cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use ...
      TensorFlow's shared libraries log these while they load, twice per import (two of them
      log), and TF_CPP_MIN_LOG_LEVEL does not reach them (3 still prints them).
      `import_tensorflow` points file descriptor 2 at a temporary file while TensorFlow loads
      and writes back every line that is not one of these. (Turning oneDNN off instead,
      TF_ENABLE_ONEDNN_OPTS=0, would change the numerics.)
  E0000 ... cuda_platform.cc:52] failed call to cuInit: ...
  E0000 ... util.cc:131] oneDNN supports DT_INT64 only on platforms with AVX-512. ...
      TF's C++ log at run time (the first op, a tf.data thread): TF_CPP_MIN_LOG_LEVEL=3. It
      hides the C++ ERROR lines of TensorFlow and XLA; a failure that matters there reaches
      Python as an exception, which still prints.
  WARNING:absl:Using an uncached FunctionDataset for training is not recommended ...
      SeqIO, for every in-memory corpus; shuffling is the task's business here
      (`lmsuite.data.corpora.base`). A filter on the "absl" logger drops this message only.
  WARNING:absl:Variant folder .../wikipedia/... has no dataset_info.json
      TFDS, while the preflight checks look for a prepared dataset; the preflight names an
      unprepared one itself, with the command that prepares it. Filtered the same way.
  WARNING:absl:Metadata file does not exist: .../checkpoints/2000/state/_CHECKPOINT_METADATA
      Orbax, when `lmsuite.load` (`lmsuite pretrain`'s fill-mask lines) restores a step's
      `state` item alone: the CheckpointManager keeps that file one level up, in the step's
      directory. The restore does not need it. Filtered the same way.

  ERROR:absl:[process=0][thread=array_type_handler] _SignalingThread.run() raised an exception:
  RESOURCE_EXHAUSTED: ... No space left on device  (and ~400 lines of tracebacks)
      Orbax, from each of its background threads, when a checkpoint save fails. The same
      failure reaches the training loop, which ends with one `CheckpointWriteError` line naming
      the step, the path and the free space (`lmsuite.training.checkpointing`). Orbax's ERROR
      records are dropped by the same filter; `--verbose` keeps them.
  Traceback (most recent call last): ... call_soon_threadsafe ...
  RuntimeError: Event loop is closed  (once per array write still pending)
      TensorStore, when its pending writes finish after Orbax has closed the event loop of the
      failed save: its callbacks report through `sys.unraisablehook` (or `sys.excepthook`),
      which drop exactly this error raised by `call_soon_threadsafe` (`_closed_loop_callback`).

Environment variables are set with `setdefault`, so a user's own TF_CPP_MIN_LOG_LEVEL wins.
`lmsuite train/pretrain` re-execute themselves first (`host_malloc.relaunch_with_settings`)
and parse their flags again, so all of this is done in the process that runs, --verbose or not.
"""

import contextlib
import logging
import os
import re
import sys
import tempfile

# Lines that TensorFlow's shared libraries write to fd 2 while they load.
IMPORT_NOISE = (
    re.compile(r"WARNING: All log messages before absl::InitializeLog\(\) is called"),
    re.compile(r"[IW]\d{4} [\d:. ]+\d+ (port|cudart_stub|cpu_feature_guard)\.cc:\d+\] "),
    re.compile(r"To enable the following instructions: .* rebuild TensorFlow with the"),
)
# Python log messages (their format strings, as logged) of the "absl" logger.
ABSL_NOISE = (
    "Using an uncached FunctionDataset for training",  # seqio.FunctionDataSource
    "Variant folder %s has ",  # tensorflow_datasets.core.utils.file_utils
    "Metadata file does not exist: %s",  # orbax.checkpoint's metadata reader
)
# How Orbax's log records begin ("[process=0][thread=...]"): its failed-save ERROR records.
ORBAX_PREFIX = "[process="
QUIET_ENVIRONMENT = {"TF_CPP_MIN_LOG_LEVEL": "3"}


class _DropKnownMessages(logging.Filter):
    """Drops the records whose message starts with one of `ABSL_NOISE`."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and str(record.msg).startswith(ORBAX_PREFIX):
            return False  # re-raised as one CheckpointWriteError (see the module docstring)
        return not str(record.msg).startswith(ABSL_NOISE)


_FILTER = _DropKnownMessages()


def quiet_start(*, verbose: bool) -> None:
    """Silences the known start-up noise (see the module docstring) unless `verbose`.

    Call it before anything imports TensorFlow; calling it again is harmless, and
    `verbose=True` removes the log filter an earlier call installed.
    """
    absl_logger = logging.getLogger("absl")
    if verbose:
        absl_logger.removeFilter(_FILTER)
        return
    for key, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    if _FILTER not in absl_logger.filters:
        absl_logger.addFilter(_FILTER)
    if sys.excepthook is not _drop_closed_loop_callbacks:
        global _previous_excepthook, _previous_unraisablehook
        _previous_excepthook = sys.excepthook
        sys.excepthook = _drop_closed_loop_callbacks
        _previous_unraisablehook = sys.unraisablehook
        sys.unraisablehook = _drop_unraisable_closed_loop_callbacks
    import_tensorflow()


_previous_excepthook = sys.excepthook
_previous_unraisablehook = sys.unraisablehook


def _closed_loop_callback(kind, value, tb) -> bool:
    """Whether this is TensorStore calling back into the closed event loop of a failed save."""
    if kind is not RuntimeError or str(value) != "Event loop is closed":
        return False
    frames, frame = [], tb
    while frame is not None:
        frames.append(frame.tb_frame.f_code.co_name)
        frame = frame.tb_next
    return "call_soon_threadsafe" in frames


def _drop_closed_loop_callbacks(kind, value, tb) -> None:
    """`sys.excepthook`, without TensorStore's late callbacks into a closed event loop."""
    if not _closed_loop_callback(kind, value, tb):
        _previous_excepthook(kind, value, tb)


def _drop_unraisable_closed_loop_callbacks(unraisable) -> None:
    """`sys.unraisablehook`, likewise (the path TensorStore's C++ callbacks report through)."""
    if not _closed_loop_callback(
        unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback
    ):
        _previous_unraisablehook(unraisable)


def import_tensorflow() -> None:
    """Imports TensorFlow with its load-time log lines (`IMPORT_NOISE`) dropped.

    Every lmsuite command reads its data through SeqIO, so TensorFlow is imported anyway; doing
    it here is what lets its loaders' lines be told apart from the rest.
    """
    if "tensorflow" in sys.modules:
        return
    with _stderr_without(IMPORT_NOISE):
        import tensorflow  # noqa: F401


@contextlib.contextmanager
def _stderr_without(patterns):
    """Sends what is written to file descriptor 2 (C libraries and Python alike) to a temporary
    file, then writes back every line that matches none of `patterns`, in order."""
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to redirect (a daemon): nothing to keep quiet either
        yield
        return
    with tempfile.TemporaryFile() as captured:
        sys.stderr.flush()
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode("utf-8", errors="replace").splitlines(keepends=True)
            kept = [line for line in lines if not any(p.match(line) for p in patterns)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
