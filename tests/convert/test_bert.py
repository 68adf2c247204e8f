"""BERT parity: converted random HF models give HF's logits; to_hf round-trips."""

import copy

import numpy as np
import pytest
import torch
import transformers

import lmsuite.convert as convert
from tests.convert.parity import (
    assert_bf16_close,
    assert_close,
    at_bf16,
    hf_forward,
    make_inputs,
    roundtrip,
)
from tests.convert.perturb import perturb


def _hf(hf_class, **overrides):
    torch.manual_seed(0)
    kw = dict(
        vocab_size=101,
        hidden_size=36,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=53,
        max_position_embeddings=40,
        type_vocab_size=2,
    )
    kw.update(overrides)
    cfg = transformers.BertConfig(**kw)
    return getattr(transformers, hf_class)(cfg).eval()


@pytest.mark.parametrize("hf_class", ["BertForPreTraining", "BertForMaskedLM"])
def test_logits_match_hf_and_roundtrip(hf_class, tmp_path):
    hf = _hf(hf_class)
    ids, mask, types = make_inputs(vocab_size=101)
    ours = convert.from_hf(hf)
    out = ours.outputs(ids, mask, types)
    ref = hf_forward(hf, input_ids=ids, attention_mask=mask, token_type_ids=types)
    if hf_class == "BertForPreTraining":
        assert_close(out["mlm_logits"], ref.prediction_logits, "prediction_logits")
        assert_close(out["classifier_logits"], ref.seq_relationship_logits, "nsp logits")
    else:
        assert_close(ours.logits(ids, mask, types), ref.logits, "logits")
    back = roundtrip(ours, hf_class, tmp_path)
    ref2 = hf_forward(back, input_ids=ids, attention_mask=mask, token_type_ids=types)
    first = ref.prediction_logits if hf_class == "BertForPreTraining" else ref.logits
    second = ref2.prediction_logits if hf_class == "BertForPreTraining" else ref2.logits
    assert_close(second, first, "round-trip logits", tol=1e-6)


def test_bf16_logits_near_f32_hf():
    """Float32 weights computing in bfloat16 stay within rounding of HF's float32 logits."""
    hf = perturb(_hf("BertForPreTraining"))
    ids, mask, types = make_inputs(vocab_size=101)
    ref = hf_forward(hf, input_ids=ids, attention_mask=mask, token_type_ids=types)
    wrong = at_bf16(convert.from_hf(perturb(copy.deepcopy(hf), seed=1, scale=0.01)))
    wrong_out = wrong.outputs(ids, mask, types)
    out = at_bf16(convert.from_hf(hf)).outputs(ids, mask, types)
    for ours, theirs, off, what, dtype in [
        (
            "mlm_logits",
            ref.prediction_logits,
            wrong_out["mlm_logits"],
            "bf16 prediction_logits",
            "bfloat16",
        ),
        (
            "classifier_logits",
            ref.seq_relationship_logits,
            wrong_out["classifier_logits"],
            "nsp",
            "float32",
        ),
    ]:
        assert_bf16_close(out[ours], theirs, what, wrong=off, dtype=dtype)


def test_relu_gelu_tanh_and_untied():
    hf = _hf("BertForMaskedLM", hidden_act="gelu_new", tie_word_embeddings=False)
    ids, mask, types = make_inputs(vocab_size=101)
    ours = convert.from_hf(hf)
    assert not ours.config.tie_embeddings
    ref = hf_forward(hf, input_ids=ids, attention_mask=mask, token_type_ids=types)
    assert_close(ours.logits(ids, mask, types), ref.logits, "logits")


def test_unsupported_options_are_named():
    with pytest.raises(ValueError, match="hidden_act='quick_gelu'"):
        convert.from_hf(_hf("BertForMaskedLM", hidden_act="quick_gelu"))


def test_bad_inputs_raise_with_values():
    ours = convert.from_hf(_hf("BertForMaskedLM"))
    ids, mask, types = make_inputs(vocab_size=101)
    with pytest.raises(ValueError, match="id 101, outside \\[0, 101\\)"):
        ours.logits(np.full_like(ids, 101), mask, types)
    with pytest.raises(ValueError, match="longer than the position table"):
        ours.logits(np.ones((1, 41), np.int64))
    with pytest.raises(ValueError, match="must be \\(batch, length\\)"):
        ours.logits(ids[0])
    with pytest.raises(ValueError, match="BERT is an encoder: decoder_input_ids must be None"):
        ours.logits(ids, mask, types, decoder_input_ids=ids)
