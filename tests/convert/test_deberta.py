"""DeBERTa parity: converted random HF v1 / v2 models give HF's logits on every position,
padded ones included; to_hf round-trips; unsupported options are refused by name."""

import jax
import numpy as np
import pytest
import torch
import transformers
from transformers.models.deberta_v2 import modeling_deberta_v2

import lmsuite.convert as convert
from lmsuite.convert import deberta
from lmsuite.layers.disentangled import log_bucket_position
from lmsuite.models import ModelConfig
from tests.convert.parity import assert_close, hf_forward, make_inputs, roundtrip

V1, V2 = "DebertaForMaskedLM", "DebertaV2ForMaskedLM"
CONFIGS = {V1: transformers.DebertaConfig, V2: transformers.DebertaV2Config}
SMALL = dict(
    vocab_size=101,
    hidden_size=36,
    num_hidden_layers=2,
    num_attention_heads=3,
    intermediate_size=53,
    max_position_embeddings=40,
)
V3_LIKE = dict(
    relative_attention=True,
    pos_att_type=["p2c", "c2p"],
    position_buckets=8,  # small, so that an 11-token input reaches the log buckets
    share_att_key=True,
    norm_rel_ebd="layer_norm",
    position_biased_input=False,
    type_vocab_size=2,
)


def _hf(hf_class, **overrides):
    """A random HF model whose zero-initialised biases and unit norms are perturbed too."""
    torch.manual_seed(0)
    model = getattr(transformers, hf_class)(CONFIGS[hf_class](**SMALL, **overrides)).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.1)
    return model


def _n_params(params) -> int:
    return sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(params))


CASES = {
    "v1_c2p_p2c_types": (
        V1,
        dict(
            relative_attention=True,
            pos_att_type="c2p|p2c",
            type_vocab_size=2,
            position_biased_input=False,
        ),
    ),
    "v1_p2c_k4_factorised": (
        V1,
        dict(
            relative_attention=True,
            pos_att_type=["p2c"],
            max_relative_positions=4,
            embedding_size=20,
        ),
    ),
    "v1_hf_default_no_relative": (V1, dict()),
    "v3_like_buckets_shared_key": (V2, V3_LIKE),
    "v2_c2p_k5_nonlegacy": (
        V2,
        dict(relative_attention=True, pos_att_type=["c2p"], max_relative_positions=5, legacy=False),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_hf_everywhere_and_roundtrip(case, tmp_path):
    hf_class, overrides = CASES[case]
    hf = _hf(hf_class, **overrides)
    types = 2 if hf.config.type_vocab_size else 0
    ids, mask, token_types = make_inputs(vocab_size=101, types=types)
    ours = convert.from_hf(hf)
    assert _n_params(ours.params) == hf.num_parameters()
    ref = hf_forward(hf, input_ids=ids, attention_mask=mask, token_type_ids=token_types).logits
    assert_close(ours.logits(ids, mask, token_types), ref, f"{case} logits")
    assert convert.infer_hf_class(ours.config) == hf_class
    back = roundtrip(ours, hf_class, tmp_path)
    ref2 = hf_forward(back, input_ids=ids, attention_mask=mask, token_type_ids=token_types)
    assert_close(ref2.logits, ref, "round-trip logits", tol=1e-6)


def test_untied_v2_head_with_factorised_embeddings():
    """Untied, HF keeps an unused `cls.predictions.bias` (V values) beside decoder.bias."""
    hf = _hf(
        V2,
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        embedding_size=20,
        tie_word_embeddings=False,
    )
    ids, mask, _ = make_inputs(vocab_size=101, types=0)
    ours = convert.from_hf(hf)
    assert not ours.config.tie_embeddings
    assert _n_params(ours.params) == hf.num_parameters() - hf.config.vocab_size
    ref = hf_forward(hf, input_ids=ids, attention_mask=mask).logits
    assert_close(ours.logits(ids, mask), ref, "untied logits")


def test_log_buckets_equal_hf_including_far_distances():
    rel = np.arange(-700, 701)
    for buckets, max_position in ((256, 512), (8, 40), (6, 11), (16, 17)):
        ref = modeling_deberta_v2.make_log_bucket_position(
            torch.from_numpy(rel), buckets, max_position
        ).to(torch.long)
        ours = log_bucket_position(rel, num_buckets=buckets, max_position=max_position)
        np.testing.assert_array_equal(ours, ref.numpy(), err_msg=f"{buckets=} {max_position=}")


@pytest.mark.parametrize(
    "hf_class, option, value",
    [
        (V1, "talking_head", True),
        (V1, "pos_att_type", ["c2p", "p2p"]),
        (V2, "conv_kernel_size", 3),
        (V2, "norm_rel_ebd", "batch_norm"),
        (V2, "attention_head_size", 7),
        (V2, "hidden_act", "quick_gelu"),
    ],
)
def test_unsupported_options_are_named(hf_class, option, value):
    cfg = CONFIGS[hf_class](**SMALL, relative_attention=True, **{option: value})
    with pytest.raises(ValueError, match=f"{option}="):
        deberta.config_from_hf(cfg, hf_class)


def test_nonlegacy_head_needs_untied_sizes_and_export_refuses_non_deberta_features():
    cfg = transformers.DebertaV2Config(**SMALL, legacy=False, embedding_size=20)
    with pytest.raises(ValueError, match="legacy=False"):
        deberta.config_from_hf(cfg, V2)
    v1 = deberta.config_from_hf(transformers.DebertaConfig(**SMALL), V1)
    with pytest.raises(ValueError, match="use_key_bias=True"):
        deberta.config_to_hf(v1.replace(use_key_bias=True), V1)
    with pytest.raises(ValueError, match="DebertaOptions.position_buckets=8"):
        deberta.config_to_hf(v1.replace(deberta=v1.deberta.replace(position_buckets=8)), V1)
    bert_like = ModelConfig(vocab_size=101, d_model=36, num_heads=3, d_ff=53, num_layers=1)
    with pytest.raises(ValueError, match="position_type='learned'"):
        deberta.config_to_hf(bert_like, V2)


def test_token_types_without_a_type_table():
    hf = transformers.DebertaConfig(**SMALL)  # type_vocab_size=0: HF ignores token_type_ids
    ids, mask, types = make_inputs(vocab_size=101, types=2)
    zeros = np.zeros_like(types)
    kwargs = deberta.model_inputs(
        hf, ids, attention_mask=mask, token_type_ids=zeros, decoder_input_ids=None
    )
    assert kwargs["token_type_ids"] is None
    with pytest.raises(ValueError, match="type_vocab_size=0"):
        deberta.model_inputs(
            hf, ids, attention_mask=mask, token_type_ids=types, decoder_input_ids=None
        )
