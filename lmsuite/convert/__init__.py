"""HuggingFace <-> lmsuite weights: `from_hf`, `to_hf`."""

from lmsuite.convert.api import ConvertedModel, from_hf, infer_hf_class, to_hf

__all__ = ["ConvertedModel", "from_hf", "infer_hf_class", "to_hf"]
