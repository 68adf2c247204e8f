"""A scanned model (ModelConfig.scan_layers) converts both ways: `from_hf(..., scan_layers=True)`
stacks the imported layers, `to_hf` unstacks them, and HF reads the same network back."""

import numpy as np
import torch
import transformers

import lmsuite.convert as convert
from tests.convert.parity import assert_close, hf_forward, make_inputs, roundtrip

VOCAB = 101


def _bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=36,
        num_hidden_layers=3,
        num_attention_heads=3,
        intermediate_size=53,
        max_position_embeddings=40,
    )
    return transformers.BertForMaskedLM(config).eval()


def _t5():
    torch.manual_seed(0)
    config = transformers.T5Config(
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
    return transformers.T5ForConditionalGeneration(config).eval()


def test_scanned_bert_matches_hf_and_round_trips(tmp_path):
    hf = _bert()
    ids, mask, types = make_inputs(vocab_size=VOCAB)
    ours = convert.from_hf(hf, scan_layers=True)
    assert ours.config.scan_layers
    encoder = ours.params["encoder"]
    assert "layers_0" not in encoder
    assert encoder["layers"]["mlp"]["wi"]["kernel"].shape == (3, 36, 53)
    ref = hf_forward(hf, input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    assert_close(ours.logits(ids, mask, types), ref, "scanned BERT logits")
    back = roundtrip(ours, "BertForMaskedLM", tmp_path)
    for name, weight in hf.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[name].numpy(), weight.numpy(), name)


def test_scanned_t5_matches_hf_and_round_trips(tmp_path):
    hf = _t5()
    ids, mask, _ = make_inputs(vocab_size=VOCAB, types=1)
    dec = np.random.default_rng(1).integers(1, VOCAB, size=(ids.shape[0], 6))
    ours = convert.from_hf(hf, scan_layers=True)
    assert {x.shape[0] for x in _leaves(ours.params["encoder"]["layers"])} == {2}
    assert {x.shape[0] for x in _leaves(ours.params["decoder"]["layers"])} == {3}
    ref = hf_forward(hf, input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    assert_close(ours.logits(ids, mask, decoder_input_ids=dec), ref, "scanned T5 logits")
    back = roundtrip(ours, "T5ForConditionalGeneration", tmp_path)
    for name, weight in hf.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[name].numpy(), weight.numpy(), name)


def _leaves(tree):
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in _leaves(v)]
    return [tree]
