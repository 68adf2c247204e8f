"""lmsuite: a JAX/Flax suite for pretraining and studying BERT-family language models."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # `lmsuite.load` without importing jax on `import lmsuite` (the CLI's start stays cheap).
    if name == "load":
        from lmsuite.evaluation.load import load

        return load
    raise AttributeError(f"module 'lmsuite' has no attribute {name!r}")
