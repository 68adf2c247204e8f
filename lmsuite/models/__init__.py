"""Architectures assembled from `lmsuite.layers`."""

from lmsuite.models.config import ModelConfig, XLNetOptions
from lmsuite.models.transformer import Transformer

__all__ = ["ModelConfig", "Transformer", "XLNetOptions"]
