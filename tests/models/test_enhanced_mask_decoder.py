"""DeBERTa's enhanced mask decoder: absolute positions reach the MLM head and nothing else, its
passes are the last layer's weights (checked against HF's DebertaV2Layer run with query_states,
as the reference EMD does), off is HF's DebertaForMaskedLM, and bad settings are named."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import traverse_util

import lmsuite.convert as convert
from lmsuite.convert import deberta
from lmsuite.models import DebertaOptions, ModelConfig, Transformer
from tests.convert.parity import assert_close, make_inputs

TABLE = "encoder/enhanced_mask_decoder/position_embedder/embedding"
# The tiny DeBERTa of lmsuite/gin/models/deberta_tiny.gin, smaller still, with the decoder on.
EMD = ModelConfig(
    vocab_size=61,
    d_model=16,
    num_heads=2,
    d_ff=24,
    num_layers=3,
    max_length=24,
    type_vocab_size=0,
    position_type="deberta",
    use_key_bias=False,
    mask_padded_queries=True,
    mask_padded_embeddings=True,
    norm_eps=1e-7,
    deberta=DebertaOptions(emd_layers=2),
)


def _emd(passes: int) -> ModelConfig:
    return EMD.replace(deberta=EMD.deberta.replace(emd_layers=passes))


IDS = jnp.asarray(np.random.default_rng(0).integers(1, 61, size=(2, 10)), jnp.int32)
POSITIONS = jnp.broadcast_to(jnp.arange(10), (2, 10))


def _init(config):
    params = Transformer(config).init(jax.random.PRNGKey(0), IDS)["params"]
    return traverse_util.flatten_dict(nn.unbox(params), sep="/")


def _apply(config, flat, ids=IDS, **kwargs):
    params = traverse_util.unflatten_dict(flat, sep="/")
    return Transformer(config).apply({"params": params}, ids, **kwargs)


def _count(flat) -> int:
    return sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(flat))


def test_the_decoder_sees_absolute_positions_and_the_encoder_does_not():
    flat = _init(EMD)
    base = _apply(EMD, flat)
    # The same weights with the position table's rows permuted (nothing else changes).
    rows = np.random.default_rng(1).permutation(EMD.max_length)
    permuted = dict(flat, **{TABLE: flat[TABLE][rows]})
    moved = _apply(EMD, permuted)
    np.testing.assert_array_equal(moved["hidden"], base["hidden"])
    assert np.max(np.abs(moved["mlm_logits"] - base["mlm_logits"])) > 1e-3
    # Shifting the positions: relative distances are unchanged, absolute ones are not.
    shifted = _apply(EMD, flat, position_ids=POSITIONS + 5)
    np.testing.assert_allclose(shifted["hidden"], base["hidden"], atol=1e-6)
    assert np.max(np.abs(shifted["mlm_logits"] - base["mlm_logits"])) > 1e-3


def test_without_the_decoder_only_relative_terms_carry_position():
    """Relative attention off: without EMD the model is permutation-equivariant (blind to
    order); with it, permuting the tokens no longer just permutes the logits."""
    order = np.random.default_rng(2).permutation(10)
    for emd_layers, blind in ((0, True), (2, False)):
        cfg = EMD.replace(deberta=DebertaOptions(relative_attention=False, emd_layers=emd_layers))
        flat = _init(cfg)
        logits = _apply(cfg, flat)["mlm_logits"]
        permuted = _apply(cfg, flat, ids=IDS[:, order])["mlm_logits"]
        gap = float(np.max(np.abs(permuted - logits[:, order])))
        assert (gap < 1e-5) == blind, (emd_layers, gap)
    # Relative attention on and EMD off: shifting absolute positions changes nothing at all.
    off = _emd(0)
    flat = _init(off)
    shifted = _apply(off, flat, position_ids=POSITIONS + 5)["mlm_logits"]
    np.testing.assert_allclose(shifted, _apply(off, flat)["mlm_logits"], atol=1e-6)


def test_the_decoder_adds_only_its_position_table():
    on, off = _init(EMD), _init(_emd(0))
    assert set(on) - set(off) == {TABLE}
    assert set(off) <= set(on)
    assert _count(on) - _count(off) == EMD.max_length * EMD.d_model
    assert on[TABLE].shape == (EMD.max_length, EMD.d_model)
    boxed = Transformer(EMD).init(jax.random.PRNGKey(0), IDS)["params"]
    axes = boxed["encoder"]["enhanced_mask_decoder"]["position_embedder"]["embedding"].names
    rel = boxed["encoder"]["relative_embeddings"]["embedding"].names
    assert axes == rel  # (table, embed), as the other position tables
    # One pass and two passes of the same weights differ: the passes are really run.
    one = _apply(_emd(1), on)["mlm_logits"]
    assert np.max(np.abs(one - _apply(EMD, on)["mlm_logits"])) > 1e-3


def test_off_is_the_encoder_alone_and_masked_positions_gather_the_decoder():
    on = _init(EMD)
    off = {k: v for k, v in on.items() if k != TABLE}
    cfg_off = _emd(0)
    a, b = _apply(EMD, on), _apply(cfg_off, off)
    np.testing.assert_array_equal(a["hidden"], b["hidden"])
    assert np.max(np.abs(a["mlm_logits"] - b["mlm_logits"])) > 1e-3
    positions = jnp.asarray([[1, 4, 7], [0, 2, 9]], jnp.int32)
    gathered = _apply(EMD, on, masked_positions=positions)["mlm_logits"]
    expected = np.take_along_axis(np.asarray(a["mlm_logits"]), positions[:, :, None], axis=1)
    np.testing.assert_allclose(gathered, expected, atol=1e-5)


def test_jit_and_no_jit_agree_with_dropout_on():
    flat = _init(EMD)
    mask = jnp.asarray(np.arange(10)[None, :] < np.array([[10], [6]]), jnp.int32)
    params = traverse_util.unflatten_dict(flat, sep="/")
    model = Transformer(EMD)

    def run(p, det):
        rngs = {"dropout": jax.random.PRNGKey(3)}
        kw = dict(attention_mask=mask, deterministic=det, rngs=rngs)
        return model.apply({"params": p}, IDS, **kw)["mlm_logits"]

    # Dropout on (the training path): the same rng gives the same masks under jit.
    eager = run(params, False)
    jitted = jax.jit(run, static_argnums=1)(params, False)
    np.testing.assert_allclose(eager, jitted, atol=1e-5)
    assert np.max(np.abs(eager - run(params, True))) > 1e-3  # dropout is really on


# ------------------------------------------------------------------------------ HF reference
# DebertaV2 layers take query_states (HF's v1 DebertaLayer fails on them: `.t()` of a 3-D
# tensor), as the reference's own layers do; one v2 layout with c2p|p2c, one v3-like.
HF_CASES = {
    "v2_c2p_p2c": dict(pos_att_type="c2p|p2c"),
    "v3_like": dict(
        pos_att_type=["p2c", "c2p"],
        position_buckets=8,
        share_att_key=True,
        norm_rel_ebd="layer_norm",
    ),
}


def _hf(**overrides):
    torch.manual_seed(0)
    hf_config = transformers.DebertaV2Config(
        vocab_size=101,
        hidden_size=36,
        num_hidden_layers=3,
        num_attention_heads=3,
        intermediate_size=53,
        max_position_embeddings=40,
        relative_attention=True,
        position_biased_input=False,
        type_vocab_size=0,
        **overrides,
    )
    model = transformers.DebertaV2ForMaskedLM(hf_config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p)) if p.ndim == 1 else p.normal_(0.0, 0.1)
    return model


def _hf_emd_logits(hf, table, ids, mask, passes):
    """The reference EMD on HF's modules: Z + H as queries through the last layer `passes`
    times, keys/values H (the second-to-last layer's output), then HF's MLM head."""
    with torch.no_grad():
        ids_t, mask_t = torch.from_numpy(ids), torch.from_numpy(mask)
        out = hf.deberta(ids_t, attention_mask=mask_t, output_hidden_states=True)
        hidden = out.hidden_states[-2]
        encoder = hf.deberta.encoder
        query = torch.from_numpy(np.array(table))[: ids.shape[1]][None] + hidden
        att_mask = encoder.get_attention_mask(mask_t)
        relative_pos = encoder.get_rel_pos(hidden, query)
        rel = encoder.get_rel_embedding()
        for _ in range(passes):
            query = encoder.layer[-1](
                hidden, att_mask, query_states=query, relative_pos=relative_pos, rel_embeddings=rel
            )[0]
        return hf.cls(query).numpy()


@pytest.mark.parametrize("case", list(HF_CASES))
def test_the_decoder_equals_hf_layers_run_as_the_reference_emd(case):
    hf = _hf(**HF_CASES[case])
    ids, mask, _ = make_inputs(vocab_size=101, types=0)
    plain = convert.from_hf(hf)
    assert plain.config.deberta.emd_layers == 0
    ref = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.detach()
    assert_close(plain.logits(ids, mask), ref.numpy(), "EMD off = DebertaV2ForMaskedLM")

    state = {k: v.detach().numpy().copy() for k, v in hf.state_dict().items()}
    cfg = plain.config.replace(deberta=plain.config.deberta.replace(emd_layers=2))
    flat = deberta.params_from_hf(dict(state), cfg, deberta.V2)
    table = flat[TABLE]
    assert table.shape == (40, 36) and 0.01 < float(np.std(table)) < 0.03  # a fresh draw
    ours = _apply(cfg, flat, ids=jnp.asarray(ids), attention_mask=jnp.asarray(mask))
    expected = _hf_emd_logits(hf, table, ids, mask, passes=2)
    assert_close(ours["mlm_logits"], expected, f"{case} EMD logits vs HF layers")
    assert np.max(np.abs(expected - ref.numpy())) > 1e-2  # the comparison can tell them apart

    # A checkpoint that kept the reference's absolute table: it becomes the decoder's.
    kept = np.random.default_rng(4).normal(0, 0.1, (40, 36)).astype(np.float32)
    with_table = dict(state, **{"deberta.embeddings.position_embeddings.weight": kept})
    np.testing.assert_array_equal(deberta.params_from_hf(with_table, cfg, deberta.V2)[TABLE], kept)
    with pytest.raises(ValueError, match="DebertaOptions.emd_layers=2"):
        deberta.config_to_hf(cfg, deberta.V2)


# ------------------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    "changes, options, named",
    [
        ({}, dict(emd_layers=-1), "emd_layers must be an int >= 0, got -1"),
        ({}, dict(emd_layers=1.5), "got 1.5"),
        ({}, dict(emd_layers=True), "got True"),
        ({}, dict(position_biased_input=True), "position_biased_input=False"),
        (dict(norm_position="pre"), {}, "norm_position='post'"),
        (dict(final_norm=True), {}, "final_norm=False"),
        (dict(num_layers=1), {}, "num_layers >= 2, got 1"),
        (dict(heads=("rtd",)), {}, "heads=('rtd',)"),
    ],
)
def test_bad_settings_are_named(changes, options, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        EMD.replace(**changes, deberta=EMD.deberta.replace(**options))


def test_non_deberta_positions_are_refused_and_json_round_trips():
    with pytest.raises(ValueError, match="position_type='deberta'"):
        ModelConfig(position_type="learned", deberta=DebertaOptions(emd_layers=2))
    assert ModelConfig.from_json(EMD.to_json()) == EMD
    assert ModelConfig.from_json(EMD.to_json()).deberta.emd_layers == 2


def test_a_run_written_before_the_options_were_nested_still_loads():
    """run.json files written with the flat deberta_* fields keep loading (values kept for a
    DeBERTa, the unread defaults dropped for the rest)."""
    flat = {k: v for k, v in EMD.to_json().items() if k != "deberta"}
    flat |= {
        f"deberta_{k}": v
        for k, v in dataclasses.asdict(EMD.deberta.replace(position_buckets=8)).items()
    }
    assert ModelConfig.from_json(flat) == EMD.replace(
        deberta=EMD.deberta.replace(position_buckets=8)
    )
    bert = ModelConfig(vocab_size=61, d_model=16, num_heads=2, d_ff=24, num_layers=1)
    old_bert = bert.to_json() | {"deberta_emd_layers": 0, "deberta_pos_att_type": ["c2p", "p2c"]}
    old_bert.pop("deberta")
    assert ModelConfig.from_json(old_bert) == bert
