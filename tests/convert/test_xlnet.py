"""XLNet parity: `XLNetLMHeadModel` with d_model 40, 5 heads of 8, d_inner 72 and vocab 97.

Each case is checked on three calls: the content stream (no perm_mask / target_mapping), the
query stream at three targets of a random factorisation order, and a second segment fed the
`mems` HF returned for the first; the memories themselves are compared too. Inputs hold padding
(attention_mask) and XLNet's three segment ids: 0, 1, and 2 for the <cls> token.

HF's attn_type="uni" adds the padding/permutation mask to its causal mask in place, which
broadcasts only for a batch of one; those cases run the masked calls on the padded example alone.
"""

import jax
import numpy as np
import pytest
import torch
import transformers

import lmsuite.convert as convert
from tests.convert.parity import assert_close, hf_forward, make_inputs, roundtrip
from tests.convert.perturb import perturb

VOCAB, BATCH, PREDICT = 97, 4, 3
CASES = {
    "bi_untied_3_layers": dict(n_layer=3),
    "uni_tied_clamped": dict(attn_type="uni", untie_r=False, clamp_len=3),
    "bi_data_clamped_reuse": dict(bi_data=True, clamp_len=4, reuse_len=5),
    "uni_same_length_relu": dict(attn_type="uni", same_length=True, ff_activation="relu"),
    "bi_untied_head_tied_r": dict(tie_word_embeddings=False, untie_r=False),
}


def _hf(**overrides):
    torch.manual_seed(0)
    kw = dict(vocab_size=VOCAB, d_model=40, n_head=5, d_inner=72, n_layer=2, mem_len=6)
    kw.update(overrides)
    hf = transformers.XLNetLMHeadModel(transformers.XLNetConfig(**kw))
    if not kw.get("tie_word_embeddings", True):
        hf.lm_loss.weight = torch.nn.Parameter(torch.randn(VOCAB, kw["d_model"]))
    hf = perturb(hf)
    if kw.get("untie_r") is False:
        # A tied checkpoint carried into HF: every layer holds the same biases.
        first = hf.transformer.layer[0].rel_attn
        with torch.no_grad():
            for layer in hf.transformer.layer[1:]:
                for name in ("r_w_bias", "r_r_bias", "r_s_bias"):
                    getattr(layer.rel_attn, name).copy_(getattr(first, name))
    return hf


def _inputs(seed: int = 0):
    """ids, attention_mask, token types, perm_mask and target_mapping over BATCH examples."""
    ids, mask, types = make_inputs(vocab_size=VOCAB, batch=BATCH, seed=seed)
    lengths = mask.sum(1)
    types[np.arange(BATCH), lengths - 1] = 2  # the <cls> token ends every example
    rng = np.random.default_rng(seed)
    length = ids.shape[1]
    perm = np.zeros((BATCH, length, length), np.float32)
    targets = np.zeros((BATCH, PREDICT, length), np.float32)
    for b in range(BATCH):
        order = np.concatenate([rng.permutation(lengths[b]), np.arange(lengths[b], length)])
        rank = np.argsort(order)
        perm[b] = rank[None, :] >= rank[:, None]  # i sees j iff j comes earlier in the order
        targets[b, np.arange(PREDICT), order[lengths[b] - PREDICT : lengths[b]]] = 1
    return dict(
        input_ids=ids,
        attention_mask=mask,
        token_type_ids=types,
        perm_mask=perm,
        target_mapping=targets,
    )


def _rows(inputs: dict, rows) -> dict:
    return {k: v[rows] for k, v in inputs.items()}


def _check_segment(ours, hf, inputs, what, mems=None):
    """Logits and new memory of one call against HF's; returns HF's memory."""
    torch_mems = None if mems is None else [torch.from_numpy(np.asarray(m)) for m in mems]
    ref = hf_forward(hf, **inputs) if mems is None else _hf_with_mems(hf, inputs, torch_mems)
    logits, new_mems = ours.logits_and_mems(**inputs, mems=mems)
    assert_close(logits, ref.logits, f"{what} logits")
    assert len(new_mems) == len(ref.mems)
    for i, (a, b) in enumerate(zip(new_mems, ref.mems, strict=True)):
        assert_close(a, b, f"{what} mems[{i}]")
    return [m.numpy() for m in ref.mems]


def _hf_with_mems(hf, inputs, mems):
    with torch.no_grad():
        return hf(**{k: torch.from_numpy(v) for k, v in inputs.items()}, mems=mems, use_mems=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_and_mems_match_hf_and_roundtrip(case, tmp_path):
    hf = _hf(**CASES[case])
    hf.config.use_mems_eval = True
    ours = convert.from_hf(hf)
    untied = CASES[case].get("untie_r", True)
    assert ours.config.xlnet.untie_r == untied
    # HF holds a copy of tied biases in every layer; lmsuite holds one.
    copies = 0 if untied else (hf.config.n_layer - 1) * 3 * hf.config.d_model
    count = sum(p.size for p in jax.tree_util.tree_leaves(ours.params))
    assert count == hf.num_parameters() - copies
    inputs = _inputs()
    content = {k: inputs[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    rows = slice(None)
    if CASES[case].get("attn_type") == "uni":
        del content["attention_mask"]
        rows = slice(1, 2)  # the padded example
    masked = _rows(inputs, rows)
    mems = _check_segment(ours, hf, content, f"{case} content stream")
    _check_segment(ours, hf, masked, f"{case} query stream")
    second = _rows(_inputs(seed=1), rows)
    _check_segment(ours, hf, second, f"{case} second segment", [m[:, rows] for m in mems])

    back = roundtrip(ours, "XLNetLMHeadModel", tmp_path)
    assert convert.from_hf(back).config == ours.config
    ref = hf_forward(hf, **masked).logits
    assert_close(hf_forward(back, **masked).logits, ref, f"{case} round trip", tol=1e-6)


def test_a_padded_prediction_matches_hf_too():
    """A zero row of target_mapping (fewer predictions than P) names no position: HF scores the
    query at every position and gathers nothing back, lmsuite scores it nowhere; both give its
    query stream a zero attention output."""
    hf = _hf()
    ours = convert.from_hf(hf)
    inputs = _inputs()
    inputs["target_mapping"][0, -1] = 0.0
    inputs["target_mapping"][2, :2] = 0.0
    _check_segment(ours, hf, inputs, "padded predictions")


def test_input_mask_is_the_negated_attention_mask():
    ours = convert.from_hf(_hf())
    inputs = _inputs()
    via_input_mask = dict(inputs, input_mask=1 - inputs["attention_mask"])
    del via_input_mask["attention_mask"]
    assert_close(ours.logits(**via_input_mask), ours.logits(**inputs), "input_mask", tol=0.0)
    with pytest.raises(ValueError, match="one of input_mask .* and attention_mask"):
        ours.logits(**inputs, input_mask=1 - inputs["attention_mask"])


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(ff_activation="gelu_fast"), "ff_activation='gelu_fast'"),
        (dict(attn_type="tri"), "attn_type='tri'"),
    ],
)
def test_unsupported_options_are_named(overrides, match):
    with pytest.raises(ValueError, match=match):
        convert.from_hf(_hf(**overrides))


def test_tied_biases_that_differ_are_refused():
    hf = _hf(untie_r=False)
    with torch.no_grad():
        hf.transformer.layer[1].rel_attn.r_w_bias.add_(1.0)
    with pytest.raises(
        ValueError, match=r"untie_r=False, but transformer.layer.1.rel_attn.r_w_bias"
    ):
        convert.from_hf(hf)


def test_bad_inputs_raise_with_values():
    ours = convert.from_hf(_hf())
    inputs = _inputs()
    with pytest.raises(ValueError, match=r"perm_mask must be \(4, 11, 11\), got \(4, 11, 10\)"):
        ours.logits(**dict(inputs, perm_mask=inputs["perm_mask"][:, :, 1:]))
    with pytest.raises(ValueError, match=r"XLNetLMHeadModel takes no \['labels'\]"):
        ours.logits(**inputs, labels=inputs["input_ids"])
    with pytest.raises(ValueError, match="input_ids holds id 97"):
        ours.logits(np.full((1, 3), VOCAB))
