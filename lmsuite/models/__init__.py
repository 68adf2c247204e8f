"""Architectures assembled from `lmsuite.layers`, one module per family (`families`)."""

from lmsuite.models.config import LabelHead, ModelConfig
from lmsuite.models.families import Transformer, memory_shapes
from lmsuite.models.option_groups import DebertaOptions, TupeOptions, XLNetOptions

__all__ = [
    "DebertaOptions",
    "LabelHead",
    "ModelConfig",
    "Transformer",
    "TupeOptions",
    "XLNetOptions",
    "memory_shapes",
]
