"""lmsuite: a JAX/Flax suite for pretraining and studying BERT-family language models."""

__version__ = "0.1.0"
