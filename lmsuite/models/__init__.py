"""Architectures assembled from `lmsuite.layers`, one module per family (`families`)."""

from lmsuite.models.config import (
    DebertaOptions,
    LabelHead,
    ModelConfig,
    TupeOptions,
    XLNetOptions,
)
from lmsuite.models.families import Transformer, memory_shapes

__all__ = [
    "DebertaOptions",
    "LabelHead",
    "ModelConfig",
    "Transformer",
    "TupeOptions",
    "XLNetOptions",
    "memory_shapes",
]
