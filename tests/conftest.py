"""Suite-wide settings: rank promotion raises (STYLE rule 11); CPU only; one persistent
compilation cache per session.

The cache lets a test skip XLA's backend compile of a program an earlier test (in either xdist
worker, or a subprocess) already compiled: many tests train the same tiny models on the same
shapes, and the backend compile is about half of a two-step `lmsuite train`. Tracing and lowering
still run, and the cache key holds the lowered module, the compile options, the devices and the
jaxlib version, so a hit is the executable that compiling would have produced. Each session gets
an empty directory (made by the controller before xdist starts its workers, which inherit it),
so timings do not depend on an earlier run; a `JAX_COMPILATION_CACHE_DIR` already set is used
as it is, and `LMSUITE_TEST_JAX_CACHE=0` turns the cache off. `make test` also has XLA:CPU skip
LLVM's optimisation of the code it generates (the Makefile's `FAST_SUITE_XLA_FLAGS`).

The heaviest files run first. `make test` hands whole files to its two workers in collection order
(`--dist loadfile`), and tests/training, the heaviest directory, sorts last: a file of several
minutes handed out near the end kept one worker busy while the other sat idle. Longest first,
the workers finish together.
"""

import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
_made_cache: list[str] = []


def pytest_configure(config):
    if os.environ.get("LMSUITE_TEST_JAX_CACHE", "1") == "0":
        return
    if CACHE_ENV not in os.environ:  # the controller (or a run without xdist)
        directory = tempfile.mkdtemp(prefix="lmsuite-test-jax-cache-")
        _made_cache.append(directory)
        os.environ[CACHE_ENV] = directory
        # Every program, however quick to compile: the tiny models' steps each take ~1 s.
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    jax.config.update("jax_compilation_cache_dir", os.environ[CACHE_ENV])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# The fast suite's heaviest files, longest first (`make test` prints the slowest tests); the rest
# keep their order after them.
HEAVY_FIRST = (
    "tests/training/test_recipes.py",
    "tests/training/test_aot.py",
    "tests/integration/test_faults.py",
    "tests/integration/test_install.py",
    "tests/training/test_step.py",
    "tests/training/test_mesh_gradients.py",
    "tests/models/test_scan_remat.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(HEAVY_FIRST)}
    root = config.rootpath
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))


def pytest_unconfigure(config):
    for directory in _made_cache:
        shutil.rmtree(directory, ignore_errors=True)
