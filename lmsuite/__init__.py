"""lmsuite: a JAX/Flax suite for pretraining and studying BERT-family language models."""

__version__ = "0.2.0"  # pyproject.toml reads it (`[tool.setuptools.dynamic]`)

from lmsuite import extras as _extras

_extras.load_triton_before_tensorflow()  # lmsuite imports TensorFlow; torch may come later

# name -> (module, attribute): imported on first use, so `import lmsuite` does not import jax
# (the CLI's start stays cheap).
_LAZY = {
    "load": ("lmsuite.evaluation.load", "load"),
    "train": ("lmsuite.training.loop", "train"),
    "RunResult": ("lmsuite.training.loop", "RunResult"),
    "TrainConfig": ("lmsuite.training.train_config", "TrainConfig"),
    "run_from_gin": ("lmsuite.cli.gin_run", "run_from_gin"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'lmsuite' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY])
