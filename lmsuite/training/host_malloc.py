"""glibc malloc settings for training steps that run on the host's CPU.

XLA:CPU takes each step's temporary buffer from malloc and frees it when the step ends. For
`make pretrain`'s model that buffer is 134 MB. glibc hands a block that large from a thread's
arena straight to mmap (whatever M_MMAP_MAX says) and munmaps it on free, so every step faults
its temporaries in again, page by page. Measured on 2 cores: 34,000 to 47,000 minor faults and
about 85 ms of kernel time per 135 ms step. With one arena (large blocks then come from the main
heap), no mmap and no trimming, the pages stay mapped: no faults per step, and the bare step is
about 1.5x faster (`benchmarks/train_loop.py`). The price: the heap keeps its high-water mark,
and all threads share one malloc lock, which matters little on a CPU host that trains.

glibc reads these settings once, when the process starts. So `relaunch_with_settings` re-executes
the current command with them; `lmsuite train` and `lmsuite pretrain` call it first, and the
Makefile sets them for benchmarks (tests run under glibc's defaults). Nothing changes when the
settings do not apply (`applies`): not Linux with glibc, an accelerator in use, any MALLOC_*
setting already chosen by the user, or LMSUITE_HOST_MALLOC=0.
"""

import importlib.metadata
import os
import platform
import sys
from collections.abc import Mapping

SETTINGS = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(4 << 30),
    "MALLOC_TOP_PAD_": str(64 << 20),
}
OPT_OUT = "LMSUITE_HOST_MALLOC"
# JAX plugins that put the step on an accelerator when they are installed.
ACCELERATOR_PACKAGES = ("libtpu", "libtpu-nightly", "jax-cuda12-plugin", "jax-cuda13-plugin")


def _accelerator_installed() -> bool:
    names = {d.metadata["Name"].lower() for d in importlib.metadata.distributions()}
    return any(p in names for p in ACCELERATOR_PACKAGES) or any(
        n.startswith("jax-rocm") for n in names
    )


def applies(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process would run its step on the CPU under glibc with default malloc."""
    if environ.get(OPT_OUT, "1") == "0":
        return False
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(key in environ for key in SETTINGS):
        return False  # already set, by us before a relaunch or by the user
    platforms = environ.get("JAX_PLATFORMS", "")
    if platforms:
        return platforms.split(",")[0].strip() == "cpu"
    return not _accelerator_installed()


def active(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process started with `SETTINGS`."""
    return all(environ.get(key) == value for key, value in SETTINGS.items())


def relaunch_with_settings() -> None:
    """Re-executes this process's command line with `SETTINGS` when they apply; else returns.

    Call it first thing in a command-line entry point: nothing before it is kept.
    """
    if not applies():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, {**os.environ, **SETTINGS})
