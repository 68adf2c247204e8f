"""`generate` against HF's `generate`, the cache against full recomputation, sampling by its draws.

HF's side gets its generation options neutralised both in the model's generation_config and
in the call (BART's config carries forced_eos_token_id=2; nothing may forbid EOS, repeat
n-grams or penalise repetition), so that both sides run plain greedy / beam search. The EOS id
of each model is one its free-running greedy decode produces early, so that rows really stop
at different lengths and the padding, beam-finishing and early-stopping rules are exercised.
"""

import functools

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
import transformers
from scipy import stats

import lmsuite.convert as convert
from lmsuite.evaluation.decoding import Plan, generate, warp
from lmsuite.models import ModelConfig, Transformer
from lmsuite.models.families import init_cache
from lmsuite.models.option_groups import XLNetOptions
from tests.convert.perturb import perturb

MAX_NEW = 12
PAD = 1
NEUTRAL = dict(
    do_sample=False,
    min_length=0,
    min_new_tokens=None,
    no_repeat_ngram_size=0,
    repetition_penalty=1.0,
    forced_bos_token_id=None,
    forced_eos_token_id=None,
    bad_words_ids=None,
    suppress_tokens=None,
    begin_suppress_tokens=None,
)


def _hf_model(kind: str):
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=101, n_embd=36, n_layer=2, n_head=3, n_inner=53, n_positions=40
        )
        model = transformers.GPT2LMHeadModel(config)
    elif kind == "t5":
        # HF 5.24's T5 sizes its decoding cache by num_layers: the stacks have equal depth.
        config = transformers.T5Config(
            vocab_size=97,
            d_model=28,
            d_kv=8,
            d_ff=44,
            num_layers=2,
            num_heads=3,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=20,
        )
        model = transformers.T5ForConditionalGeneration(config)
    else:
        config = transformers.BartConfig(
            vocab_size=103,
            d_model=32,
            encoder_layers=2,
            decoder_layers=3,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=40,
            decoder_ffn_dim=40,
            max_position_embeddings=40,
        )
        model = transformers.BartForConditionalGeneration(config)
    # Large weights make the next-token distributions peaked: no near-ties between float32
    # beam scores that rounding differences between torch and XLA could order differently.
    model = perturb(model, scale=0.3)
    for name, value in NEUTRAL.items():
        setattr(model.generation_config, name, value)
    return model


@functools.cache
def _pair(kind: str):
    hf = _hf_model(kind)
    ours = convert.from_hf(hf)
    rng = np.random.default_rng(1)
    ids = rng.integers(3, 90, (3, 7))
    mask = np.ones_like(ids)
    if kind == "gpt2":  # left padding, as HF wants for decoder-only batches
        mask[1, :3] = 0
        ids[1, :3] = PAD
    start = {} if kind == "gpt2" else dict(decoder_start_token_id=2)
    prompt = ids.shape[1] if kind == "gpt2" else 1
    free = _ours(ours, ids, mask, start, num_beams=1)
    eos = int(free[0, prompt + 3])
    return dict(hf=hf, ours=ours, ids=ids, mask=mask, start=start, eos=eos, prompt=prompt)


def _ours(ours, ids, mask, start, **kw):
    return generate(
        ours.config,
        ours.params,
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=MAX_NEW,
        pad_token_id=PAD,
        **start,
        **kw,
    )


def _theirs(p, **kw):
    with torch.no_grad():
        return (
            p["hf"]
            .generate(
                torch.tensor(p["ids"]),
                attention_mask=torch.tensor(p["mask"]),
                max_new_tokens=MAX_NEW,
                pad_token_id=PAD,
                eos_token_id=p["eos"],
                **p["start"],
                **NEUTRAL,
                **kw,
            )
            .numpy()
        )


SEARCHES = {
    "greedy": dict(num_beams=1),
    "beam_lp0.7_early": dict(num_beams=3, length_penalty=0.7, early_stopping=True),
    "beam_lp1.6_late": dict(num_beams=3, length_penalty=1.6, early_stopping=False),
}
# Every model and search; the default run keeps each search on two models (60 s budget).
DEFAULT_CASES = {
    ("gpt2", "greedy"),
    ("gpt2", "beam_lp0.7_early"),
    ("gpt2", "beam_lp1.6_late"),
    ("t5", "greedy"),
    ("t5", "beam_lp0.7_early"),
    ("bart", "beam_lp1.6_late"),
}
CASES = [
    pytest.param(kind, search, marks=() if (kind, search) in DEFAULT_CASES else pytest.mark.slow)
    for kind in ("gpt2", "t5", "bart")
    for search in SEARCHES
]


@pytest.mark.parametrize("kind, search", CASES)
def test_equals_hf_generate(kind, search):
    pair = _pair(kind)
    kw = SEARCHES[search]
    expected = _theirs(pair, **kw)
    got = _ours(
        pair["ours"], pair["ids"], pair["mask"], pair["start"], eos_token_id=pair["eos"], **kw
    )
    np.testing.assert_array_equal(got, expected)
    if search == "greedy":
        # Row 0 stops at an EOS (the one it was chosen from, or an earlier one) and is padded.
        new = got[0, pair["prompt"] :]
        first = int(np.argmax(new == pair["eos"]))
        assert new[first] == pair["eos"] and (new[first + 1 :] == PAD).all()
        assert first + 1 < MAX_NEW and got.shape[1] > pair["prompt"] + first + 1


@pytest.mark.parametrize(
    "kind",
    [
        "t5",
        pytest.param("gpt2", marks=pytest.mark.slow),
        pytest.param("bart", marks=pytest.mark.slow),
    ],
)
def test_cache_equals_recomputation(kind):
    """T5 by default: its relative bias and cross-attention cache are the most to get wrong."""
    pair = _pair(kind)
    kw = dict(num_beams=3, length_penalty=1.6, eos_token_id=pair["eos"])
    args = (pair["ours"], pair["ids"], pair["mask"], pair["start"])
    np.testing.assert_array_equal(_ours(*args, **kw), _ours(*args, use_cache=False, **kw))


@pytest.mark.parametrize("kind", ["t5", pytest.param("gpt2", marks=pytest.mark.slow)])
def test_cached_steps_give_the_full_forward_logits(kind):
    """Prompt, then one token at a time through the cache == one forward over everything."""
    ours = _pair(kind)["ours"]
    model = Transformer(ours.config)
    # An encoder-decoder's cached steps go through its `decode` method; a decoder's through the
    # same call with a cache.
    method = lambda kw: "decode" if kind == "t5" and "cache" in kw else None  # noqa: E731
    jitted = jax.jit(
        lambda params, ids, kw: model.apply({"params": params}, ids, method=method(kw), **kw)
    )
    apply = lambda ids, **kw: jitted(ours.params, ids, kw)  # noqa: E731
    ids = np.random.default_rng(6).integers(3, 90, (2, 9)).astype(np.int32)
    cache = init_cache(ours.config, batch_size=2, length=11)
    if kind == "gpt2":
        full = apply(ids)["lm_logits"]
        out = apply(ids[:, :4], cache=cache, cache_index=np.int32(0))
    else:
        full = apply(ids[:, :6], decoder_input_ids=ids)["lm_logits"]
        out = apply(ids[:, :6], decoder_input_ids=ids[:, :4], cache=cache, cache_index=np.int32(0))
    pieces = [out["lm_logits"]]
    for t in range(4, 9):
        step = ids[:, t : t + 1]
        if kind == "gpt2":
            out = apply(step, cache=out["cache"], cache_index=np.int32(t))
        else:  # the encoder's keys/values are cached: no encoder input any more
            out = apply(None, decoder_input_ids=step, cache=out["cache"], cache_index=np.int32(t))
        pieces.append(out["lm_logits"])
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=2e-5, rtol=1e-5)


@pytest.mark.slow
def test_early_stopping_never_equals_hf():
    hf = _hf_model("bart")
    ours = convert.from_hf(hf)
    ids = np.random.default_rng(2).integers(3, 90, (2, 5))
    p = dict(hf=hf, ids=ids, mask=np.ones_like(ids), start=dict(decoder_start_token_id=2))
    p["eos"] = int(_ours(ours, ids, p["mask"], p["start"])[1, 2])
    kw = dict(num_beams=3, length_penalty=-0.5, early_stopping="never")
    expected = _theirs(p, **kw)
    np.testing.assert_array_equal(
        _ours(ours, ids, p["mask"], p["start"], eos_token_id=p["eos"], **kw), expected
    )


# --------------------------------------------------------------------------- lmsuite-only
def _random_lm(architecture: str, **overrides):
    fields = dict(
        architecture=architecture,
        vocab_size=53,
        d_model=24,
        num_heads=3,
        d_ff=40,
        num_layers=2,
        max_length=32,
        type_vocab_size=0,
        position_type="learned",
        norm_position="pre",
        final_norm=True,
        heads=("lm",),
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        init_stddev=0.5,
    )
    config = ModelConfig(**dict(fields, **overrides))
    ids = np.zeros((1, 4), np.int32)
    prefix = dict(prefix_mask=np.ones_like(ids)) if architecture == "prefix_lm" else {}
    params = Transformer(config).init(jax.random.PRNGKey(0), ids, **prefix)["params"]
    return config, nn.meta.unbox(params)


def test_prefix_lm_and_shared_layers_cache_equals_recomputation():
    ids = np.random.default_rng(3).integers(2, 53, (2, 6))
    mask = np.ones_like(ids)
    mask[0, :2] = 0
    cases = (
        (_random_lm("prefix_lm"), dict(num_beams=3, eos_token_id=int(ids[0, 3]))),
        (_random_lm("decoder", share_layers="all"), dict(num_beams=1)),
    )
    for (config, params), kw in cases:
        common = dict(input_ids=ids, attention_mask=mask, max_new_tokens=8, pad_token_id=0, **kw)
        np.testing.assert_array_equal(
            generate(config, params, **common),
            generate(config, params, use_cache=False, **common),
        )


def test_sampling_is_seeded():
    config, params = _random_lm("decoder")
    ids = np.random.default_rng(4).integers(2, 53, (4, 3))
    draw = lambda seed, **kw: generate(  # noqa: E731
        config,
        params,
        input_ids=ids,
        max_new_tokens=10,
        do_sample=True,
        temperature=3.0,
        seed=seed,
        **kw,
    )
    first = draw(0)
    np.testing.assert_array_equal(first, draw(0))
    assert (first != draw(1)).any()
    np.testing.assert_array_equal(first[:, :3], ids)
    beam_draws = [draw(s, num_beams=2) for s in (0, 0, 1, 2)]
    np.testing.assert_array_equal(beam_draws[0], beam_draws[1])
    assert any((b != beam_draws[0]).any() for b in beam_draws[2:])


def _constant_lm(logits_V):
    """A decoder whose next-token logits are `logits_V` whatever the input: head weights 0."""
    config, params = _random_lm(
        "decoder", vocab_size=len(logits_V), num_layers=1, tie_embeddings=False, output_bias=True
    )
    head = dict(params["lm_head"])
    head["output_projection"] = jax.tree.map(np.zeros_like, head["output_projection"])
    head["output_bias"] = np.asarray(logits_V, np.float32)
    return config, dict(params, lm_head=head)


LOGITS = np.log(np.array([0.3, 0.02, 0.15, 0.1, 0.005, 0.2, 0.08, 0.045, 0.07, 0.03]))


@pytest.mark.parametrize(
    "options, allowed",
    [
        (dict(top_k=4, temperature=0.7), [0, 5, 2, 3]),
        # Sorted probabilities .3 .2 .15 .1 .08 ...: the nucleus of 0.7 is the first four.
        (dict(top_p=0.7), [0, 5, 2, 3]),
        # At temperature 1.3 the top six renormalise to .291 .213 .171 .125 .105 .095: the
        # nucleus of 0.9 drops the last.
        (dict(top_k=6, top_p=0.9, temperature=1.3), [0, 5, 2, 3, 6]),
    ],
)
def test_sampling_draws_follow_the_warped_distribution(options, allowed):
    config, params = _constant_lm(LOGITS)
    rows, new = 500, 8
    drawn = generate(
        config,
        params,
        input_ids=np.zeros((rows, 1), np.int32),
        max_new_tokens=new,
        do_sample=True,
        seed=11,
        **options,
    )[:, 1:].ravel()
    assert drawn.size == rows * new
    assert set(np.unique(drawn)) <= set(allowed)
    # Renormalised over the kept tokens, after the temperature.
    scaled = LOGITS[allowed] / options.get("temperature", 1.0)
    p = np.exp(scaled - scaled.max())
    p /= p.sum()
    counts = np.array([(drawn == t).sum() for t in allowed])
    assert stats.chisquare(counts, p * drawn.size).pvalue > 1e-4
    assert (np.abs(counts - p * drawn.size) < 5 * np.sqrt(drawn.size * p * (1 - p))).all()


@pytest.mark.parametrize("top_k, top_p, min_keep", [(5, 1.0, 1), (0, 0.6, 1), (3, 0.4, 2)])
def test_warpers_equal_hf_logits_warpers(top_k, top_p, min_keep):
    scores = np.random.default_rng(5).normal(size=(4, 37)).astype(np.float32) * 3
    plan = Plan(
        config=None,
        prompt_length=1,
        total_length=2,
        num_beams=1,
        length_penalty=1.0,
        early_stopping=False,
        do_sample=True,
        temperature=0.8,
        top_k=top_k,
        top_p=top_p,
        eos=None,
        pad=None,
        use_cache=True,
    )
    processors = [transformers.TemperatureLogitsWarper(0.8)]
    if top_k:
        processors.append(transformers.TopKLogitsWarper(top_k, min_tokens_to_keep=min_keep))
    if top_p < 1:
        processors.append(transformers.TopPLogitsWarper(top_p, min_tokens_to_keep=min_keep))
    expected = torch.tensor(scores)
    for processor in processors:
        expected = processor(None, expected)
    got = np.asarray(warp(plan, jax.numpy.asarray(scores), min_keep=min_keep))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected.numpy()))
    np.testing.assert_allclose(got[~np.isinf(got)], expected.numpy()[~np.isinf(got)], rtol=1e-6)


# ---------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(num_beams=0), "num_beams must be an int >= 1, got 0"),
        (dict(temperature=0.0), "temperature must be a float > 0, got 0.0"),
        (dict(top_p=0.0), r"top_p must be a float in \(0, 1\], got 0.0"),
        (dict(top_p=1.5), r"top_p must be a float in \(0, 1\], got 1.5"),
        (dict(top_k=-1), "top_k must be an int >= 0"),
        (dict(max_new_tokens=0), "max_new_tokens must be an int >= 1, got 0"),
        (dict(early_stopping="sometimes"), "early_stopping must be"),
        (dict(max_new_tokens=30), "prompt length 4 \\+ max_new_tokens 30 = 34 .* 32"),
        (dict(eos_token_id=53), "eos_token_id"),
        (dict(decoder_start_token_id=0), "decoder_start_token_id=0 is for encoder-decoder"),
        (dict(pad_token_id=-1), r"pad_token_id must be None or an id in \[0, vocab_size=53\)"),
        (dict(early_stopping=1), "early_stopping must be"),
    ],
)
def test_bad_options_are_named(kw, match):
    config, params = _random_lm("decoder")
    kw = dict(dict(max_new_tokens=3), **kw)
    with pytest.raises(ValueError, match=match):
        generate(config, params, input_ids=np.ones((1, 4), np.int32), **kw)


@pytest.mark.parametrize(
    "config",
    [
        ModelConfig(architecture="encoder", heads=("mlm",)),
        ModelConfig(
            architecture="xlnet",
            heads=("lm",),
            xlnet=XLNetOptions(),
            position_type="none",
            type_vocab_size=0,
        ),
    ],
)
def test_architectures_that_cannot_decode_are_refused(config):
    with pytest.raises(ValueError, match=f"cannot decode architecture='{config.architecture}'"):
        generate(config, {}, input_ids=np.ones((1, 4), np.int32), max_new_tokens=2)
