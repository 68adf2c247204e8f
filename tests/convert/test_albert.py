"""ALBERT parity: factorised embeddings, one shared layer, MLM + SOP logits; round-trip."""

import jax
import pytest
import transformers

import lmsuite.convert as convert
from tests.convert.parity import assert_close, hf_forward, make_inputs, roundtrip
from tests.convert.perturb import perturb


def _hf(**overrides):
    kw = dict(
        vocab_size=101,
        embedding_size=20,
        hidden_size=36,
        num_hidden_layers=3,
        num_attention_heads=3,
        intermediate_size=53,
        max_position_embeddings=40,
        type_vocab_size=2,
    )
    kw.update(overrides)
    transformers.set_seed(0)
    return perturb(transformers.AlbertForPreTraining(transformers.AlbertConfig(**kw)))


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # E=20 != D=36, 3 layers from one, gelu_new (ALBERT's default)
        dict(embedding_size=36, num_hidden_layers=2, hidden_act="gelu"),  # E == D still projects
    ],
)
def test_logits_match_hf_and_roundtrip(overrides, tmp_path):
    hf = _hf(**overrides)
    ids, mask, types = make_inputs(vocab_size=101)
    ours = convert.from_hf(hf)
    assert ours.config.share_layers == "all"
    assert "layers_shared" in ours.params["encoder"] and "layers_0" not in ours.params["encoder"]
    assert sum(p.size for p in jax.tree.leaves(ours.params)) == hf.num_parameters()
    out = ours.outputs(ids, mask, types)
    ref = hf_forward(hf, input_ids=ids, attention_mask=mask, token_type_ids=types)
    assert_close(out["mlm_logits"], ref.prediction_logits, "prediction_logits")
    assert_close(out["classifier_logits"], ref.sop_logits, "sop_logits")

    assert convert.infer_hf_class(ours.config) == "AlbertForPreTraining"
    back = roundtrip(ours, "AlbertForPreTraining", tmp_path)
    ref2 = hf_forward(back, input_ids=ids, attention_mask=mask, token_type_ids=types)
    assert_close(ref2.prediction_logits, ref.prediction_logits, "round-trip", tol=1e-6)
    assert_close(ref2.sop_logits, ref.sop_logits, "round-trip sop", tol=1e-6)


@pytest.mark.parametrize(
    "option, value", [("num_hidden_groups", 3), ("inner_group_num", 2), ("hidden_act", "tanh")]
)
def test_unsupported_options_are_named(option, value):
    hf = transformers.AlbertForPreTraining(
        transformers.AlbertConfig(
            vocab_size=11,
            embedding_size=4,
            hidden_size=8,
            num_attention_heads=2,
            intermediate_size=8,
            num_hidden_layers=3,
            **{option: value},
        )
    )
    with pytest.raises(ValueError, match=f"{option}={value!r}"):
        convert.from_hf(hf)


def test_export_refuses_a_head_activation_albert_lacks(tmp_path):
    ours = convert.from_hf(_hf(num_hidden_layers=1))
    with pytest.raises(ValueError, match="head_activation='relu' differs"):
        convert.to_hf(ours.config.replace(head_activation="relu"), ours.params, str(tmp_path))
