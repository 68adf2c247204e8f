"""Optional dependencies, each named after the pip extra that installs it.

lmsuite's own dependencies train, evaluate and load runs; a few features need more:
HuggingFace import/export and tokenizers (`hf`), libtpu (`tpu`), JAX's CUDA wheels (`gpu`), a
Jupyter kernel (`notebooks`). A feature imports what it needs through `require`, so a missing
package is reported with the command that installs it, not as a bare ModuleNotFoundError.

  >>> transformers = require("transformers", feature="HF export")
  ImportError: HF export needs `transformers` (not installed): pip install 'lmsuite[hf]'
"""

import importlib
from types import ModuleType

# module -> the extra of pyproject.toml that installs it
EXTRA_OF = {
    "transformers": "hf",
    "torch": "hf",
    "tokenizers": "hf",
    "libtpu": "tpu",
    "jax_cuda12_plugin": "gpu",
    "ipykernel": "notebooks",
    "nbclient": "notebooks",
}


def install_hint(module: str) -> str:
    """The pip command that installs `module`'s extra (the extra's name alone if unknown)."""
    extra = EXTRA_OF.get(module.split(".")[0])
    if extra is None:
        raise ValueError(f"{module!r} belongs to no lmsuite extra; known: {sorted(EXTRA_OF)}")
    return f"pip install 'lmsuite[{extra}]'"


def require(module: str, *, feature: str) -> ModuleType:
    """Imports `module`, or raises ImportError naming `feature` and the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if error.name is not None and error.name.split(".")[0] != module.split(".")[0]:
            raise  # the package is there but one of its own imports failed: show that
        raise ImportError(
            f"{feature} needs `{module.split('.')[0]}` (not installed): {install_hint(module)}"
        ) from error


def load_triton_before_tensorflow() -> None:
    """Loads triton, when installed, before TensorFlow is: afterwards it cannot load at all.

    PyPI's Linux torch (the `hf` extra) brings triton, whose libtriton.so crashes the process
    (SIGSEGV in dlopen, a clash with the LLVM inside TensorFlow) when it is loaded after
    TensorFlow; transformers loads it on first use of a model. Loaded first, both work. When
    TensorFlow is already in (someone imported it before lmsuite), triton is marked missing
    instead, so torch runs without it (lmsuite needs none of its GPU kernels): an ImportError
    that torch handles, in place of a crash.
    """
    import sys
    from importlib import util

    if "triton" in sys.modules or util.find_spec("triton") is None:
        return
    if "tensorflow" in sys.modules:
        sys.modules["triton"] = None
        return
    importlib.import_module("triton")
