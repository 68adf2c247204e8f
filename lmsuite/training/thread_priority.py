"""Per-thread nice values for host work that shares the cores with a CPU train step.

Linux schedules threads individually: `setpriority(PRIO_PROCESS, thread id)` changes one
thread, and a thread starts with its creator's value. Elsewhere that id would name a process,
so thread priorities are Linux-only. Used by the input pipeline (tf.data's threads) and the
checkpoint worker.

Example:
  >>> check(19, what="input nice")  # raises off Linux, or outside [0, 19]
  >>> lower_this_thread(19)         # this thread and the threads it starts from now on
"""

import os
import sys
import threading


def supported() -> bool:
    """Whether one thread's priority can be set (Linux)."""
    return sys.platform.startswith("linux")


def check(nice: int, *, what: str) -> None:
    """Raises ValueError, naming `what` (e.g. "input nice"), for a nice value that is not an
    integer in [0, 19], or is > 0 off Linux."""
    if isinstance(nice, bool) or not isinstance(nice, int) or not 0 <= nice <= 19:
        raise ValueError(f"{what} must be an integer in [0, 19], got {nice!r}")
    if nice and not supported():
        raise ValueError(
            f"{what} {nice} needs Linux (per-thread priorities); this is {sys.platform}: use 0"
        )


def lower_this_thread(nice: int) -> None:
    """Sets the calling thread's nice value (0 leaves it alone)."""
    if nice:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
