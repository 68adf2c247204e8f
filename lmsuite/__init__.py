"""lmsuite: a JAX/Flax suite for pretraining and studying BERT-family language models."""

__version__ = "0.2.0"  # pyproject.toml reads it (`[tool.setuptools.dynamic]`)

from lmsuite import extras as _extras

_extras.load_triton_before_tensorflow()  # lmsuite imports TensorFlow; torch may come later


def __getattr__(name: str):
    # `lmsuite.load` without importing jax on `import lmsuite` (the CLI's start stays cheap).
    if name == "load":
        from lmsuite.evaluation.load import load

        return load
    raise AttributeError(f"module 'lmsuite' has no attribute {name!r}")
