"""BART parity: learned positions with offset 2, per-stack layernorm_embedding, post-norm, tied
head; decoder inputs shifted from input_ids when not given, as HF does.

The encoder input is right-padded (padded keys masked in self- and cross-attention); the decoder
attends causally to all of its inputs, as HF does without a decoder_attention_mask, so every
decoder position is defined and compared.
"""

import jax
import numpy as np
import pytest
import torch
import transformers

import lmsuite.convert as convert
from lmsuite.convert.bart import shift_right
from tests.convert.parity import assert_close, hf_forward, make_inputs, roundtrip
from tests.convert.perturb import perturb

VOCAB = 101


def _hf(**overrides):
    torch.manual_seed(0)
    kw = dict(
        vocab_size=VOCAB,
        d_model=36,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=3,
        decoder_attention_heads=3,
        encoder_ffn_dim=53,
        decoder_ffn_dim=53,
        max_position_embeddings=40,
    )
    kw.update(overrides)
    return perturb(transformers.BartForConditionalGeneration(transformers.BartConfig(**kw)))


@pytest.mark.parametrize("scale_embedding", [False, True])
def test_logits_match_hf_and_roundtrip(scale_embedding, tmp_path):
    hf = _hf(scale_embedding=scale_embedding, activation_function="gelu_new")
    ids, mask, _ = make_inputs(vocab_size=VOCAB, types=1)
    ours = convert.from_hf(hf)
    assert ours.config.scale_embeddings == scale_embedding
    assert sum(p.size for p in jax.tree_util.tree_leaves(ours.params)) == hf.num_parameters()
    # No decoder_input_ids: both sides shift input_ids right with decoder_start_token_id.
    ref = hf_forward(hf, input_ids=ids, attention_mask=mask).logits
    assert_close(ours.logits(ids, mask), ref, "logits (shifted decoder inputs)")
    dec = np.random.default_rng(1).integers(3, VOCAB, size=(ids.shape[0], 6))
    ref_dec = hf_forward(hf, input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    assert_close(ours.logits(ids, mask, decoder_input_ids=dec), ref_dec, "logits (given decoder)")
    back = roundtrip(ours, "BartForConditionalGeneration", tmp_path)
    again = hf_forward(back, input_ids=ids, attention_mask=mask).logits
    assert_close(again, ref, "round trip", tol=1e-6)


def test_shift_right_matches_hf():
    ids = np.array([[5, 6, 7, -100], [8, -100, -100, -100]])
    ref = transformers.models.bart.modeling_bart.shift_tokens_right(torch.from_numpy(ids), 1, 2)
    np.testing.assert_array_equal(shift_right(ids, start_id=2, pad_id=1), ref.numpy())


def test_nonzero_final_logits_bias_is_refused():
    hf = _hf()
    hf.final_logits_bias.fill_(0.5)
    with pytest.raises(ValueError, match="final_logits_bias is non-zero"):
        convert.from_hf(hf)


@pytest.mark.parametrize(
    "option,value",
    [("add_bias_logits", True), ("normalize_before", True), ("encoder_layerdrop", 0.1)],
)
def test_unsupported_options_are_named(option, value):
    with pytest.raises(ValueError, match=f"{option}={value!r}"):
        convert.from_hf(_hf(**{option: value}))


def test_bad_inputs_raise_with_values():
    ours = convert.from_hf(_hf())
    ids, mask, _ = make_inputs(vocab_size=VOCAB, types=1)
    with pytest.raises(ValueError, match="id 101, outside \\[0, 101\\)"):
        ours.logits(np.full_like(ids, VOCAB), mask)
    with pytest.raises(ValueError, match="longer than the position table"):
        ours.logits(np.ones((1, 41), np.int64))
    with pytest.raises(ValueError, match="token_type_ids"):
        ours.logits(ids, mask, np.zeros_like(ids))
