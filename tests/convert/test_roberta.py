"""RoBERTa parity: positions derived from the ids as HF does, logits everywhere, round-trip."""

import jax
import numpy as np
import pytest
import transformers

import lmsuite.convert as convert
from lmsuite.convert.roberta import position_ids
from tests.convert.parity import assert_close, hf_forward, make_inputs, roundtrip
from tests.convert.perturb import perturb

PAD = 1


def _hf(**overrides):
    kw = dict(
        vocab_size=101,
        hidden_size=36,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=53,
        max_position_embeddings=40,
        type_vocab_size=1,
        pad_token_id=PAD,
        hidden_act="relu",  # the LM head must still use gelu
    )
    kw.update(overrides)
    transformers.set_seed(0)
    return perturb(transformers.RobertaForMaskedLM(transformers.RobertaConfig(**kw)))


def _inputs():
    """Right padding with the pad id; row 0 also holds a pad id the mask keeps (HF skips it)."""
    ids, mask, _ = make_inputs(vocab_size=101, types=1)
    ids = np.where(mask == 1, ids, PAD)
    ids[0, 3] = PAD
    return ids, mask


def test_position_ids_skip_padding():
    ids = np.array([[0, 5, 7, 2, 1, 1], [0, 1, 9, 2, 1, 1]])
    np.testing.assert_array_equal(
        position_ids(ids, pad_id=1), [[0, 1, 2, 3, -1, -1], [0, -1, 1, 2, -1, -1]]
    )
    with pytest.raises(ValueError, match="must be \\(batch, length\\), got shape \\(6,\\)"):
        position_ids(ids[0], pad_id=1)


def test_logits_match_hf_and_roundtrip(tmp_path):
    hf = _hf()
    ids, mask = _inputs()
    ours = convert.from_hf(hf)
    assert ours.config.position_offset == PAD + 1
    assert ours.config.type_vocab_size == 1
    assert ours.config.head_activation == "gelu" and ours.config.activation == "relu"
    assert sum(p.size for p in jax.tree.leaves(ours.params)) == hf.num_parameters()
    ref = hf_forward(hf, input_ids=ids, attention_mask=mask).logits
    assert_close(ours.logits(ids, mask), ref, "logits")  # all positions, padding included

    assert convert.infer_hf_class(ours.config) == "RobertaForMaskedLM"
    back = roundtrip(ours, "RobertaForMaskedLM", tmp_path)
    assert_close(
        hf_forward(back, input_ids=ids, attention_mask=mask).logits, ref, "round-trip", 1e-6
    )


def test_unsupported_options_and_inputs_are_named(tmp_path):
    with pytest.raises(ValueError, match="is_decoder=True"):
        convert.from_hf(_hf(is_decoder=True))
    with pytest.raises(ValueError, match="pad_token_id=None"):
        convert.from_hf(_hf(pad_token_id=None))
    ours = convert.from_hf(_hf())
    # 40 table rows minus the 2 reserved ones leave 38 positions.
    with pytest.raises(ValueError, match="length 39, longer than the position table"):
        ours.logits(np.full((1, 39), 7))
    with pytest.raises(ValueError, match="head activation 'relu'"):
        convert.to_hf(ours.config.replace(head_activation="relu"), ours.params, str(tmp_path))


def test_untied_head_reads_the_bias_hf_adds():
    """Untied, HF's forward adds `lm_head.decoder.bias`; `lm_head.bias` is then a parameter it
    never reads (counted by num_parameters, dropped by the converter)."""
    hf = _hf(tie_word_embeddings=False)
    ids, mask = _inputs()
    ours = convert.from_hf(hf)
    assert not ours.config.tie_embeddings
    ref = hf_forward(hf, input_ids=ids, attention_mask=mask).logits
    assert_close(ours.logits(ids, mask), ref, "untied logits")
    n_ours = sum(p.size for p in jax.tree.leaves(ours.params))
    assert n_ours == hf.num_parameters() - hf.config.vocab_size
