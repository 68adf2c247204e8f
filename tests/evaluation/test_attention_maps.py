"""`LoadedModel.attention`: the sown probabilities equal softmax(Q K^T / sqrt(K)) recomputed
from each layer's input and its query/key weights, over the text's own tokens."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmsuite.evaluation.handle import LoadedModel, NativeForward
from lmsuite.models import Transformer
from tests.training.tiny import CONFIG

TEXTS = ["attention", "maps!"]  # different lengths: the shorter one is padded


class CharVocab:
    """[CLS]=2, one id per printable character, [SEP]=3: what `attention` needs of a vocabulary."""

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return [2] + [5 + ord(c) - 32 for c in text] + [3]

    def decode(self, ids, *, skip_special_tokens: bool = False) -> str:
        return "".join("[CLS]" if i == 2 else "[SEP]" if i == 3 else chr(i - 5 + 32) for i in ids)


@pytest.fixture(scope="module")
def model_and_params():
    model = Transformer(CONFIG)
    params = model.init(jax.random.PRNGKey(3), jnp.zeros((1, 8), jnp.int32))["params"]
    params = nn.meta.unbox(params)

    # Sharper than the 0.02 initialisation's near-uniform maps, so a wrong scale shows.
    def sharpen(path, x):
        name = jax.tree_util.keystr(path)
        return x * 30 if "'query'" in name or "'key'" in name else x

    params = jax.tree_util.tree_map_with_path(sharpen, params)
    return LoadedModel(forward=NativeForward(CONFIG, params), vocab=CharVocab()), params


def _layer_inputs(params, ids, mask):
    """The hidden states entering layers_0 and layers_1 (the embedder's and layers_0's
    outputs), captured from a plain forward pass."""
    _, state = Transformer(CONFIG).apply(
        {"params": params},
        ids,
        attention_mask=mask,
        token_type_ids=np.zeros_like(ids),
        capture_intermediates=True,
        mutable=["intermediates"],
    )
    captured = state["intermediates"]
    return [captured["embedder"]["__call__"][0], captured["encoder"]["layers_0"]["__call__"][0]]


def _direct_attention(x_BLD, attention_params, mask_BL):
    q_BLHK = jnp.einsum("BLD,DHK->BLHK", x_BLD, attention_params["query"]["kernel"])
    q_BLHK = q_BLHK + attention_params["query"]["bias"][None, None]
    k_BMHK = jnp.einsum("BMD,DHK->BMHK", x_BLD, attention_params["key"]["kernel"])
    k_BMHK = k_BMHK + attention_params["key"]["bias"][None, None]
    head_dim = q_BLHK.shape[-1]
    logits_BHLM = jnp.einsum("BLHK,BMHK->BHLM", q_BLHK, k_BMHK) / np.sqrt(head_dim)
    logits_BHLM = jnp.where(mask_BL[:, None, None, :] > 0, logits_BHLM, -1e30)
    return np.asarray(jax.nn.softmax(logits_BHLM, axis=-1))


@pytest.mark.parametrize("layer", [0, 1])
def test_attention_equals_softmax_of_scaled_query_key_products(model_and_params, layer):
    loaded, params = model_and_params
    maps = loaded.attention(TEXTS, layer=layer)
    rows = [CharVocab().encode(t) for t in TEXTS]
    width = max(map(len, rows))
    ids = np.zeros((len(rows), width), np.int32)
    mask = np.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, : len(row)], mask[b, : len(row)] = row, 1
    x_BLD = _layer_inputs(params, ids, mask)[layer]
    expected_BHLM = _direct_attention(
        x_BLD, params["encoder"][f"layers_{layer}"]["attention"], mask
    )
    for b, (found, row) in enumerate(zip(maps, rows, strict=True)):
        n = len(row)
        assert found.weights.shape == (CONFIG.num_heads, n, n)
        assert found.tokens[0] == "[CLS]" and found.tokens[-1] == "[SEP]"
        np.testing.assert_allclose(found.weights, expected_BHLM[b, :, :n, :n], atol=1e-5)
        np.testing.assert_allclose(found.weights.sum(-1), 1.0, atol=1e-5)
    # the heads differ: a map that averaged or repeated one head would not
    assert not np.allclose(maps[0].weights[0], maps[0].weights[1], atol=1e-2)
    assert maps[0].weights.max() > 2.0 / len(rows[0])  # not a uniform map


def test_a_layer_the_model_lacks_is_named(model_and_params):
    loaded, _ = model_and_params
    with pytest.raises(ValueError, match="no attention weights for layer 2.*layers_0"):
        loaded.attention(TEXTS, layer=2)


def test_the_plain_forward_pass_keeps_no_intermediates(model_and_params):
    _, params = model_and_params
    out = Transformer(CONFIG).apply({"params": params}, np.ones((1, 4), np.int32))
    assert isinstance(out, dict) and "mlm_logits" in out  # not an (outputs, state) pair
