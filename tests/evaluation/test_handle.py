"""`LoadedModel` pads a batch no further than the model's position table reaches."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmsuite.evaluation.handle import PAD_MULTIPLE, LoadedModel, NativeForward
from lmsuite.models import DebertaOptions, ModelConfig, Transformer

TINY = dict(vocab_size=40, d_model=16, num_heads=2, d_ff=32, num_layers=1, max_length=13)


class IdVocab:
    """Each character's id is its digit: "1234" -> [1, 2, 3, 4]."""

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return [int(c) for c in text]


@pytest.mark.parametrize(
    "changes",
    [
        dict(position_type="learned"),
        dict(position_type="tupe"),
        dict(position_type="deberta", deberta=DebertaOptions(position_biased_input=True)),
    ],
    ids=["learned", "tupe", "deberta_biased_input"],
)
def test_a_text_that_fits_the_position_table_is_not_padded_past_it(changes):
    """13 positions, not a multiple of PAD_MULTIPLE: a 12-token text pads to 13, not 16 (which
    the position table cannot index, and the model refuses)."""
    assert TINY["max_length"] % PAD_MULTIPLE
    config = ModelConfig(**TINY, **changes)
    params = Transformer(config).init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))
    loaded = LoadedModel(
        forward=NativeForward(config, nn.meta.unbox(params["params"])), vocab=IdVocab()
    )
    texts = ["123456789123", "1234"]
    found = loaded.encode(texts)
    assert [h.shape for h in found.hidden] == [(12, 16), (4, 16)]
    assert np.isfinite(found.pooled).all()
