"""Architectures assembled from `lmsuite.layers`, one module per family (`families`)."""

from lmsuite.models.config import DebertaOptions, ModelConfig, XLNetOptions
from lmsuite.models.families import Transformer, memory_shapes

__all__ = ["DebertaOptions", "ModelConfig", "Transformer", "XLNetOptions", "memory_shapes"]
