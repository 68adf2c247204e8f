"""GPT-2 parity: converted random HF models give HF's logits on every position; to_hf round-trips.

With right padding HF's outputs at padded positions are still defined (the mask hides padded
keys only, positions are 0..L-1), so all positions are compared.
"""

import copy

import jax
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


def _hf(**overrides):
    torch.manual_seed(0)
    kw = dict(
        vocab_size=101,
        n_embd=36,
        n_layer=2,
        n_head=3,
        n_inner=53,
        n_positions=40,
        bos_token_id=0,
        eos_token_id=0,
    )
    kw.update(overrides)
    return perturb(transformers.GPT2LMHeadModel(transformers.GPT2Config(**kw)))


def test_logits_match_hf_and_roundtrip(tmp_path):
    hf = _hf()
    ids, mask, _ = make_inputs(vocab_size=101, types=1)
    ours = convert.from_hf(hf)
    n_params = sum(p.size for p in jax.tree_util.tree_leaves(ours.params))
    assert n_params == hf.num_parameters()
    ref = hf_forward(hf, input_ids=ids, attention_mask=mask).logits
    assert_close(ours.logits(ids, mask), ref, "logits")
    back = roundtrip(ours, "GPT2LMHeadModel", tmp_path)
    assert_close(hf_forward(back, input_ids=ids, attention_mask=mask).logits, ref, "round trip")


def test_bf16_logits_near_f32_hf():
    """Float32 weights computing in bfloat16 stay within rounding of HF's float32 logits."""
    hf = _hf()
    ids, mask, _ = make_inputs(vocab_size=101, types=1)
    ref = hf_forward(hf, input_ids=ids, attention_mask=mask).logits
    logits = lambda m: at_bf16(convert.from_hf(m)).logits(ids, mask)
    wrong = logits(perturb(copy.deepcopy(hf), seed=1, scale=0.01))
    assert_bf16_close(logits(hf), ref, "bf16 logits", wrong=wrong)


def test_padding_does_not_shift_positions():
    """A right-padded row gives the logits of the same tokens run unpadded."""
    hf = _hf()
    ids, mask, _ = make_inputs(vocab_size=101, types=1)
    ours = convert.from_hf(hf)
    batched = ours.logits(ids, mask)
    alone = ours.logits(ids[2:3, :4])
    assert_close(batched[2, :4], alone[0], "padded row vs alone", tol=1e-5)


def test_untied_head_relu_unscaled(tmp_path):
    hf = _hf(tie_word_embeddings=False, activation_function="relu", scale_attn_weights=False)
    ids, mask, _ = make_inputs(vocab_size=101, types=1)
    ours = convert.from_hf(hf)
    assert not ours.config.tie_embeddings and not ours.config.scale_attention
    assert sum(p.size for p in jax.tree_util.tree_leaves(ours.params)) == hf.num_parameters()
    ref = hf_forward(hf, input_ids=ids, attention_mask=mask).logits
    assert_close(ours.logits(ids, mask), ref, "logits")
    back = roundtrip(ours, "GPT2LMHeadModel", tmp_path)
    assert_close(hf_forward(back, input_ids=ids, attention_mask=mask).logits, ref, "round trip")


@pytest.mark.parametrize(
    "option", ["scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"]
)
def test_unsupported_options_are_named(option):
    with pytest.raises(ValueError, match=f"{option}=True"):
        convert.from_hf(_hf(**{option: True}))


def test_separate_embedding_dropout_is_named():
    with pytest.raises(ValueError, match="embd_pdrop=0.2"):
        convert.from_hf(_hf(embd_pdrop=0.2))


def test_bad_inputs_raise_with_values():
    ours = convert.from_hf(_hf())
    ids, mask, _ = make_inputs(vocab_size=101, types=1)
    with pytest.raises(ValueError, match="token_type_ids"):
        ours.logits(ids, mask, np.zeros_like(ids))
    with pytest.raises(ValueError, match="id 101, outside \\[0, 101\\)"):
        ours.logits(np.full_like(ids, 101), mask)
    with pytest.raises(ValueError, match="longer than the position table"):
        ours.logits(np.ones((1, 41), np.int64))
