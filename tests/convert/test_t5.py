"""T5 parity, 1.0 (relu, tied, rescaled head) and 1.1 (gated-gelu, untied head), with
d_kv * num_heads != d_model and more decoder than encoder layers.

The encoder input is right-padded (padded keys masked in self- and cross-attention); the decoder
attends causally to all of its inputs, as HF does without a decoder_attention_mask, so every
decoder position is defined and compared.
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

VOCAB = 101


def _hf(version: str, **overrides):
    torch.manual_seed(0)
    kw = dict(
        vocab_size=VOCAB,
        d_model=36,
        d_kv=8,
        d_ff=53,
        num_layers=2,
        num_decoder_layers=3,
        num_heads=3,
        relative_attention_num_buckets=16,
        relative_attention_max_distance=20,
        decoder_start_token_id=0,
    )
    if version == "1.1":
        kw.update(feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    kw.update(overrides)
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(**kw)).eval()
    if version == "1.1":
        # HF 5.24 builds the head tied; a real 1.1 checkpoint has its own lm_head.
        hf.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, kw["d_model"]))
    return perturb(hf)


def _inputs():
    ids, mask, _ = make_inputs(vocab_size=VOCAB, types=1)
    dec = np.random.default_rng(1).integers(1, VOCAB, size=(ids.shape[0], 7))
    dec[:, 0] = 0  # decoder start
    dec[1, 5:] = 0  # padded targets
    return ids, mask, dec


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_logits_match_hf_and_roundtrip(version, tmp_path):
    hf = _hf(version)
    ids, mask, dec = _inputs()
    ours = convert.from_hf(hf)
    cfg = ours.config
    assert (cfg.tie_embeddings, cfg.scale_tied_output) == (
        (True, True) if version == "1.0" else (False, False)
    )
    assert cfg.head_width == 8 and cfg.decoder_layers == 3
    assert sum(p.size for p in jax.tree_util.tree_leaves(ours.params)) == hf.num_parameters()
    ref = hf_forward(hf, input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    assert_close(ours.logits(ids, mask, decoder_input_ids=dec), ref, f"T5 {version} logits")
    back = roundtrip(ours, "T5ForConditionalGeneration", tmp_path)
    assert (back.lm_head.weight is back.shared.weight) == (version == "1.0")
    again = hf_forward(back, input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    assert_close(again, ref, "round trip", tol=1e-6)


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_bf16_logits_near_f32_hf(version):
    """Float32 weights computing in bfloat16 (relative bias, RMS norms, rescaled or untied head)
    stay within rounding of HF's float32 logits."""
    hf = _hf(version)
    ids, mask, dec = _inputs()
    ref = hf_forward(hf, input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    logits = lambda m: at_bf16(convert.from_hf(m)).logits(ids, mask, decoder_input_ids=dec)
    wrong = logits(perturb(copy.deepcopy(hf), seed=1, scale=0.01))
    assert_bf16_close(logits(hf), ref, f"T5 {version} bf16 logits", wrong=wrong)


def test_relative_bias_shared_and_padding_ignored():
    """The padded encoder row gives the logits of its real tokens run alone."""
    ours = convert.from_hf(_hf("1.0"))
    ids, mask, dec = _inputs()
    batched = ours.logits(ids, mask, decoder_input_ids=dec)
    alone = ours.logits(ids[2:3, :4], decoder_input_ids=dec[2:3])
    assert_close(batched[2], alone[0], "padded encoder row vs alone", tol=1e-4)


@pytest.mark.parametrize("proj", ["gated-relu", "gated-quick_gelu"])
def test_unsupported_feed_forward_is_named(proj):
    with pytest.raises(ValueError, match=f"feed_forward_proj='{proj}'"):
        convert.from_hf(_hf("1.0", feed_forward_proj=proj))


def test_bad_inputs_raise_with_values():
    ours = convert.from_hf(_hf("1.0"))
    ids, mask, dec = _inputs()
    with pytest.raises(ValueError, match="needs decoder_input_ids"):
        ours.logits(ids, mask)
    with pytest.raises(ValueError, match="decoder_input_ids holds id 101"):
        ours.logits(ids, mask, decoder_input_ids=np.full_like(dec, VOCAB))
