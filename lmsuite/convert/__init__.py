"""HuggingFace <-> lmsuite weights: `from_hf`, `to_hf`."""

from lmsuite.convert.api import (
    LMSUITE_TOKEN_IDS,
    ConvertedModel,
    TokenIds,
    from_hf,
    infer_hf_class,
    to_hf,
)

__all__ = [
    "LMSUITE_TOKEN_IDS",
    "ConvertedModel",
    "TokenIds",
    "from_hf",
    "infer_hf_class",
    "to_hf",
]
