"""ELECTRA parity: discriminator (rtd head) and generator (E-width MLM head); round-trip."""

import jax
import pytest
import transformers

import lmsuite.convert as convert
from tests.convert.parity import assert_close, hf_forward, make_inputs, roundtrip
from tests.convert.perturb import perturb


def _hf(hf_class, **overrides):
    kw = dict(
        vocab_size=101,
        embedding_size=20,
        hidden_size=36,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=53,
        max_position_embeddings=40,
        type_vocab_size=2,
    )
    kw.update(overrides)
    transformers.set_seed(0)
    return perturb(getattr(transformers, hf_class)(transformers.ElectraConfig(**kw)))


@pytest.mark.parametrize(
    "hf_class, overrides",
    [
        # The discriminator head applies hidden_act; the generator head gelu whatever it says.
        ("ElectraForPreTraining", dict(hidden_act="gelu_new")),
        ("ElectraForMaskedLM", dict(hidden_act="relu")),
    ],
)
def test_logits_match_hf_and_roundtrip(hf_class, overrides, tmp_path):
    hf = _hf(hf_class, **overrides)
    ids, mask, types = make_inputs(vocab_size=101)
    ours = convert.from_hf(hf)
    assert "embedding_projection" in ours.params["embedder"]
    assert sum(p.size for p in jax.tree.leaves(ours.params)) == hf.num_parameters()
    ref = hf_forward(hf, input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    assert_close(ours.logits(ids, mask, types), ref, "logits")  # all positions

    assert convert.infer_hf_class(ours.config) == hf_class
    back = roundtrip(ours, hf_class, tmp_path)
    ref2 = hf_forward(back, input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    assert_close(ref2, ref, "round-trip logits", tol=1e-6)


def test_generator_without_factorisation_has_no_projection():
    hf = _hf("ElectraForMaskedLM", embedding_size=36)
    ours = convert.from_hf(hf)
    assert "embedding_projection" not in ours.params["embedder"]
    assert sum(p.size for p in jax.tree.leaves(ours.params)) == hf.num_parameters()
    ids, mask, types = make_inputs(vocab_size=101)
    ref = hf_forward(hf, input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    assert_close(ours.logits(ids, mask, types), ref, "logits")


def test_unsupported_options_are_named(tmp_path):
    with pytest.raises(ValueError, match="is_decoder=True"):
        convert.from_hf(_hf("ElectraForPreTraining", is_decoder=True))
    with pytest.raises(ValueError, match="hidden_act='quick_gelu'"):
        convert.from_hf(_hf("ElectraForPreTraining", hidden_act="quick_gelu"))
    generator = convert.from_hf(_hf("ElectraForMaskedLM"))
    with pytest.raises(ValueError, match="head activation 'relu'"):
        convert.to_hf(
            generator.config.replace(head_activation="relu"), generator.params, str(tmp_path)
        )
