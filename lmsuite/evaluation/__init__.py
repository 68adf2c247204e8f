"""Loading trained models (`load`, `LoadedModel`), scoring and decoding them."""

from lmsuite.evaluation.handle import LoadedModel
from lmsuite.evaluation.load import load

__all__ = ["LoadedModel", "load"]
