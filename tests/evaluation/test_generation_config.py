"""A HF directory's generation config decides what `lmsuite.load(dir).generate(ids)` returns,
as it decides what HF's `model.generate(ids)` returns.

Tiny random BART and T5 models get a generation config where every option lmsuite implements
is set away from its default, and each one changes HF's output for these inputs (checked, so
that a processor lmsuite dropped or misordered would show). The EOS id is one the models
produce early. Then the resolution rules (`generation_config.resolve`) and the processors
(`logits_processing.process`) are checked alone, against HF's own classes where HF has one.
"""

import functools
import json
import types

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import lmsuite
from lmsuite.evaluation import generation_config as gc
from lmsuite.evaluation.decoding import Plan
from lmsuite.evaluation.logits_processing import process
from lmsuite.models import ModelConfig
from tests.convert.perturb import perturb

# Options away from HF's defaults, with the value that turns each off. Chosen (with each
# model's EOS id) so that every one of them changes HF's output for the inputs below.
SETTINGS = dict(
    num_beams=4,
    no_repeat_ngram_size=3,
    min_length=4,
    max_length=14,
    length_penalty=2.0,
    early_stopping=True,
)
NEUTRAL = dict(
    num_beams=1,
    no_repeat_ngram_size=0,
    min_length=0,
    max_length=20,
    length_penalty=1.0,
    early_stopping=False,
    forced_bos_token_id=None,
    forced_eos_token_id=None,
)
EOS = {"bart": 53, "t5": 93}


def _hf_model(kind: str):
    torch.manual_seed(0)
    if kind == "bart":
        config = transformers.BartConfig(
            vocab_size=103,
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=40,
            decoder_ffn_dim=40,
            max_position_embeddings=40,
        )
        model = transformers.BartForConditionalGeneration(config)
    else:
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
            decoder_start_token_id=0,
        )
        model = transformers.T5ForConditionalGeneration(config)
    # Peaked distributions: no float32 near-ties between beams that torch and XLA could order
    # differently (as in test_decoding.py).
    return perturb(model, scale=0.3)


def _inputs(pad: int):
    """Three encoder rows of 9, 6 and 4 real tokens, right-padded."""
    ids = np.random.default_rng(1).integers(3, 90, (3, 9))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 4:] = 0
    return np.where(mask == 1, ids, pad), mask


@functools.cache
def _checkpoint(kind: str, tmp_root: str):
    """(HF model, its directory, ids, mask): the generation config holds SETTINGS."""
    hf = _hf_model(kind)
    generation = hf.generation_config
    for name, value in SETTINGS.items():
        setattr(generation, name, value)
    generation.eos_token_id = generation.forced_eos_token_id = EOS[kind]
    if kind == "bart":
        generation.forced_bos_token_id = 0
    directory = f"{tmp_root}/{kind}"
    hf.save_pretrained(directory)
    ids, mask = _inputs(generation.pad_token_id)
    return hf, directory, ids, mask


def _hf_generate(hf, ids, mask, **options):
    with torch.no_grad():
        return hf.generate(torch.tensor(ids), attention_mask=torch.tensor(mask), **options).numpy()


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("generation"))


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_generate_with_no_options_equals_hf_generate(kind, tmp_root):
    hf, directory, ids, mask = _checkpoint(kind, tmp_root)
    expected = _hf_generate(hf, ids, mask)
    # Every option matters here: HF's output changes when any one is turned off.
    stored = json.loads(open(f"{directory}/{gc.GENERATION_FILE}").read())
    for name in sorted(set(NEUTRAL) & set(stored)):
        off = _hf_generate(hf, ids, mask, **{name: NEUTRAL[name]})
        same = off.shape == expected.shape and (off == expected).all()
        assert not same, f"{name} does not change HF's output: the comparison cannot see it"
    model = lmsuite.load(directory)
    assert model.generation_config["no_repeat_ngram_size"] == 3
    np.testing.assert_array_equal(model.generate(ids, attention_mask=mask), expected)


def test_options_given_to_generate_override_the_stored_config(tmp_root):
    hf, directory, ids, mask = _checkpoint("bart", tmp_root)
    options = dict(num_beams=1, no_repeat_ngram_size=0, max_new_tokens=6)
    expected = _hf_generate(hf, ids, mask, **options)
    assert expected.shape[1] == 7  # max_new_tokens wins over the stored max_length
    got = lmsuite.load(directory).generate(ids, attention_mask=mask, **options)
    np.testing.assert_array_equal(got, expected)


def test_unsupported_options_are_refused_by_name(tmp_root):
    hf, directory, ids, mask = _checkpoint("t5", tmp_root)
    path = f"{directory}/{gc.GENERATION_FILE}"
    stored = json.loads(open(path).read())
    other = f"{tmp_root}/t5_penalised"
    hf.save_pretrained(other)
    with open(f"{other}/{gc.GENERATION_FILE}", "w") as f:
        json.dump(dict(stored, repetition_penalty=1.3), f)
    model = lmsuite.load(other)
    with pytest.raises(ValueError, match=r"repetition_penalty=1\.3 \(set in .*generation_config"):
        model.generate(ids, attention_mask=mask)
    with pytest.raises(ValueError, match=r"typical_p=0\.5 \(passed to generate\)"):
        lmsuite.load(directory).generate(ids, typical_p=0.5)
    with pytest.raises(ValueError, match=r"num_return_sequences=2"):
        lmsuite.load(directory).generate(ids, num_return_sequences=2)


def test_save_hf_writes_the_ids_and_options_it_decodes_with(tmp_root):
    _, directory, _, _ = _checkpoint("bart", tmp_root)
    model = lmsuite.load(directory)
    # A stand-in vocabulary: save_hf reads its pad id and has it write the tokenizer files.
    model.vocab = types.SimpleNamespace(token_id={"pad_token": 1}.get, save_hf=lambda out: [])
    written = model.save_hf(f"{tmp_root}/bart_again")
    assert any(path.endswith(gc.GENERATION_FILE) for path in written)
    decoding_options = lambda stored: {k: v for k, v in stored.items() if k in gc.SUPPORTED}  # noqa: E731
    again = gc.read(f"{tmp_root}/bart_again")
    assert decoding_options(again) == decoding_options(model.generation_config)
    assert again["eos_token_id"] == again["forced_eos_token_id"] == EOS["bart"]
    with open(f"{tmp_root}/bart_again/config.json") as f:
        assert json.load(f)["forced_eos_token_id"] == EOS["bart"]


# ----------------------------------------------------------------------------- resolve
DECODER = ModelConfig(
    architecture="decoder", heads=("lm",), max_length=32, type_vocab_size=0, vocab_size=50
)
SEQ2SEQ = ModelConfig(
    architecture="encoder_decoder",
    heads=("lm",),
    position_type="t5_relative",
    type_vocab_size=0,
    vocab_size=50,
)


def _resolve(stored, given=None, config=DECODER, prompt=5, **kw):
    return gc.resolve(stored, given or {}, config=config, prompt_length=prompt, **kw)


@pytest.mark.parametrize(
    "stored, given, config, expected",
    [
        # HF's default: 20 new tokens (the position table bound is tested below).
        ({}, {}, DECODER, (20, 0)),
        ({}, {}, SEQ2SEQ, (20, 0)),
        ({"max_length": 12}, {}, DECODER, (7, 0)),  # the total length, the prompt included
        ({"max_length": 12}, {"max_new_tokens": 3}, DECODER, (3, 0)),
        ({"max_new_tokens": 4}, {"max_length": 30}, DECODER, (4, 0)),  # max_new_tokens wins
        ({"min_length": 8}, {}, DECODER, (20, 3)),
        ({"min_length": 8}, {"min_new_tokens": 6}, DECODER, (20, 6)),
        ({"min_length": 3}, {}, DECODER, (20, 0)),  # already reached by the prompt
    ],
)
def test_lengths_follow_hf(stored, given, config, expected):
    options = _resolve(stored, given, config=config, prompt=5 if config is DECODER else 1)
    assert (options["max_new_tokens"], options["min_new_tokens"]) == expected


def test_default_length_stops_at_the_position_table():
    assert _resolve({}, prompt=25)["max_new_tokens"] == 32 - 25
    with pytest.raises(ValueError, match="max_length=5 leaves no room .* 5 input tokens"):
        _resolve({"max_length": 5})


def test_ids_warpers_and_start_token():
    stored = {"eos_token_id": [3, 4], "bos_token_id": 7, "temperature": 0.0, "top_k": 5}
    greedy = _resolve(stored, config=SEQ2SEQ, prompt=1, fallback_start_id=0)
    assert greedy["eos_token_id"] == [3, 4] and greedy["decoder_start_token_id"] == 7
    assert (greedy["temperature"], greedy["top_k"]) == (1.0, 0)  # unread without sampling
    sampled = _resolve(dict(stored, temperature=0.7), {"do_sample": True}, config=SEQ2SEQ)
    assert (sampled["temperature"], sampled["top_k"], sampled["top_p"]) == (0.7, 5, 1.0)
    assert _resolve({}, {"do_sample": True})["top_k"] == 50  # HF's default top-k
    start = _resolve({}, config=SEQ2SEQ, prompt=1, fallback_start_id=2)
    assert start["decoder_start_token_id"] == 2 and "decoder_start_token_id" not in _resolve({})


@pytest.mark.parametrize(
    "stored, given",
    [
        ({"renormalize_logits": False, "suppress_tokens": [], "num_return_sequences": 1}, {}),
        ({"repetition_penalty": 1.3}, {"repetition_penalty": 1.0}),  # the call turns it off
        ({"some_new_option": 2}, {"some_new_option": None}),
        ({"output_scores": True, "cache_implementation": "static"}, {}),
    ],
)
def test_neutral_and_ignored_options_pass(stored, given):
    assert _resolve(stored, given)["max_new_tokens"] == 20


@pytest.mark.parametrize(
    "stored, given, match",
    [
        ({"renormalize_logits": True}, {}, r"renormalize_logits=True \(set in the ckpt\)"),
        ({"num_return_sequences": True}, {}, r"num_return_sequences=True"),  # not the int 1
        ({"bad_words_ids": [[3]]}, {}, r"bad_words_ids=\[\[3\]\]"),
        ({}, {"diversity_penalty": 0.5}, r"diversity_penalty=0\.5 \(passed to generate\)"),
        ({"some_new_option": 2}, {}, r"the ckpt sets some_new_option=2, .* some_new_option=None"),
        ({}, {"beams": 2}, r"options \['beams'\] that are not HF generation options"),
    ],
)
def test_unsupported_and_unknown_options_are_named(stored, given, match):
    with pytest.raises(ValueError, match=match):
        _resolve(stored, given, source="the ckpt")


def test_read_falls_back_to_config_json(tmp_path):
    fields = {"model_type": "bart", "d_model": 8, "num_beams": 4, "eos_token_id": 2}
    fields |= {"force_bos_token_to_be_generated": True, "bos_token_id": 0, "max_length": None}
    (tmp_path / "config.json").write_text(json.dumps(fields))
    expected = {"num_beams": 4, "eos_token_id": 2, "bos_token_id": 0, "forced_bos_token_id": 0}
    assert gc.read(str(tmp_path)) == expected
    assert gc.source_of(str(tmp_path)).endswith("config.json")
    (tmp_path / gc.GENERATION_FILE).write_text(json.dumps({"num_beams": 2, "top_p": None}))
    assert gc.read(str(tmp_path)) == {"num_beams": 2}


def test_option_tables_cover_hf_generation_config():
    """Every HF option has a place; lmsuite's defaults and neutral values are HF's defaults."""
    assert gc.KNOWN == set(transformers.GenerationConfig().to_dict())
    for name, default in transformers.GenerationConfig._get_default_generation_params().items():
        if name in gc.SUPPORTED:
            assert gc.SUPPORTED[name] == default, name
        elif name in gc.UNSUPPORTED:
            assert default in gc.UNSUPPORTED[name], name


# --------------------------------------------------------------------------- processors
def _plan(**fields):
    base = dict(config=None, prompt_length=2, total_length=9, num_beams=1, length_penalty=1.0)
    base |= dict(early_stopping=False, do_sample=False, temperature=1.0, top_k=0, top_p=1.0)
    base |= dict(eos=(2, 5), pad=0, use_cache=True)
    return Plan(**(base | fields))


@pytest.mark.parametrize("cur_len", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("n", [2, 3])
def test_processors_equal_hf_logits_processors(cur_len, n):
    rng = np.random.default_rng(cur_len * 10 + n)
    # Few distinct ids, so that n-grams repeat; -1 fills the unwritten positions.
    tokens = rng.integers(0, 4, (5, 9))
    tokens[:, cur_len:] = -1
    scores = rng.normal(size=(5, 11)).astype(np.float32)
    plan = _plan(no_repeat_ngram_size=n, min_new_tokens=4, forced_bos=7, forced_eos=(2, 9))
    got = np.asarray(process(plan, jnp.asarray(tokens), jnp.int32(cur_len), jnp.asarray(scores)))
    hf_processors = [
        transformers.NoRepeatNGramLogitsProcessor(n),
        transformers.MinLengthLogitsProcessor(plan.prompt_length + 4, [2, 5]),
        transformers.ForcedBOSTokenLogitsProcessor(7),
        transformers.ForcedEOSTokenLogitsProcessor(plan.total_length, [2, 9]),
    ]
    expected = torch.tensor(scores)
    for processor in hf_processors:
        expected = processor(torch.tensor(tokens[:, :cur_len]), expected)
    np.testing.assert_array_equal(got, expected.numpy())
    if 1 < cur_len < plan.total_length - 1:
        assert np.isinf(got).any() and not np.isinf(got).all(axis=1).any()


def test_no_repeat_ngram_bans_the_token_that_repeats():
    tokens = jnp.asarray([[5, 7, 5, -1, -1]])
    scores = jnp.zeros((1, 9))
    banned = np.isinf(process(_plan(no_repeat_ngram_size=2), tokens, jnp.int32(3), scores))
    assert np.flatnonzero(banned[0]).tolist() == [7]
