"""`to_hf` writes the vocabulary's special ids and the head's true tying.

An exported lmsuite T5 1.1 (untied head) must name lmsuite's </s> as its EOS, so that HF's
`generate` stops there, and must say tie_word_embeddings=false, which T5Config on its own
never writes. The model is made to emit </s> as its third new token by swapping two columns of
its untied head, so a wrong EOS id shows as a run to HF's default length.
"""

import json
import subprocess
import sys
import types

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
import transformers

import lmsuite
from lmsuite import convert
from lmsuite.evaluation import decoding
from lmsuite.models import ModelConfig, Transformer
from tests.convert.perturb import perturb

VOCAB = 40
EOS, BOS = convert.LMSUITE_TOKEN_IDS.eos, convert.LMSUITE_TOKEN_IDS.bos  # </s>, <s>


def _t5(version: str) -> tuple[ModelConfig, dict]:
    tied = version == "1.0"
    config = ModelConfig(
        architecture="encoder_decoder",
        vocab_size=VOCAB,
        d_model=16,
        num_heads=2,
        head_dim=8,
        d_ff=24,
        num_layers=2,
        type_vocab_size=0,
        position_type="t5_relative",
        relative_buckets=8,
        relative_max_distance=20,
        activation="relu" if tied else "geglu_tanh",
        norm_type="rmsnorm",
        norm_eps=1e-6,
        norm_position="pre",
        use_bias=False,
        scale_attention=False,
        embedding_norm=False,
        final_norm=True,
        heads=("lm",),
        tie_embeddings=tied,
        scale_tied_output=tied,
        output_bias=False,
        mlp_inner_dropout=True,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        init_stddev=0.5,
    )
    ids = np.zeros((1, 4), np.int32)
    variables = Transformer(config).init(jax.random.PRNGKey(0), ids, decoder_input_ids=ids)
    return config, jax.tree.map(np.asarray, nn.meta.unbox(variables["params"]))


def _saved_json(directory, name="config.json") -> dict:
    with open(f"{directory}/{name}") as f:
        return json.load(f)


def _inputs():
    ids = np.random.default_rng(3).integers(7, VOCAB, (2, 6))
    mask = np.ones_like(ids)
    mask[1, 4:] = 0
    return np.where(mask == 1, ids, 0), mask


def _eos_third(config, params, ids, mask):
    """params whose greedy decode of row 0 is [start, a, b, </s>]: the head columns of </s>
    and of row 0's third free-running token swapped."""
    free = decoding.generate(
        config, params, input_ids=ids[:1], attention_mask=mask[:1], max_new_tokens=3
    )[0]
    third, first_two = int(free[3]), [int(t) for t in free[1:3]]
    # The swap leaves the first two steps alone only if neither token is one of the pair.
    assert third != EOS and not {third, EOS} & set(first_two), free
    kernel = params["lm_head"]["output_projection"]["kernel"].copy()
    kernel[:, [third, EOS]] = kernel[:, [EOS, third]]
    head = {"output_projection": {"kernel": kernel}}
    return dict(params, lm_head=head), [0, *first_two, EOS]


# HF's default length is what the test reads back through lmsuite.load, so it gives none.
@pytest.mark.filterwarnings("ignore:Using the model-agnostic default `max_length`:UserWarning")
def test_exported_t5_1_1_names_lmsuite_eos_and_hf_generate_stops_there(tmp_path):
    config, params = _t5("1.1")
    ids, mask = _inputs()
    params, expected_row = _eos_third(config, params, ids, mask)
    convert.to_hf(config, params, str(tmp_path))

    saved = _saved_json(tmp_path)
    assert saved["tie_word_embeddings"] is False and saved["scale_decoder_outputs"] is False
    ids_written = {k: saved[k] for k in ("eos_token_id", "bos_token_id", "pad_token_id")}
    assert ids_written == {"eos_token_id": EOS, "bos_token_id": BOS, "pad_token_id": 0}
    assert saved["decoder_start_token_id"] == config.decoder_start_id == 0
    generation = _saved_json(tmp_path, "generation_config.json")
    assert {k: generation[k] for k in ids_written} == ids_written

    hf = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert hf.lm_head.weight is not hf.shared.weight
    with torch.no_grad():
        alone = hf.generate(torch.tensor(ids[:1]), attention_mask=torch.tensor(mask[:1]))
        both = hf.generate(torch.tensor(ids), attention_mask=torch.tensor(mask)).numpy()
    # Stopped at </s>: HF's default length would be 1 + 20 tokens.
    assert alone.numpy().tolist() == [expected_row]
    # lmsuite.load reads the same ids and HF's default length from the exported directory.
    np.testing.assert_array_equal(
        lmsuite.load(str(tmp_path)).generate(ids, attention_mask=mask), both
    )


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_t5_tying_is_written_as_it_is(version, tmp_path):
    config, params = _t5(version)
    convert.to_hf(config, params, str(tmp_path))
    assert _saved_json(tmp_path)["tie_word_embeddings"] is (version == "1.0")
    hf = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path)
    assert hf.config.scale_decoder_outputs is (version == "1.0")


def test_bart_export_forces_no_foreign_eos(tmp_path):
    torch.manual_seed(0)
    hf_config = transformers.BartConfig(
        vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=20,
        decoder_ffn_dim=20, max_position_embeddings=32, pad_token_id=0, decoder_start_token_id=0,
    )  # fmt: skip
    ours = convert.from_hf(perturb(transformers.BartForConditionalGeneration(hf_config)))
    convert.to_hf(ours.config, ours.params, str(tmp_path))
    saved = _saved_json(tmp_path)
    # BartConfig's own forced_eos_token_id=2 is [CLS] in lmsuite's vocabulary.
    assert saved.get("forced_eos_token_id") is None and saved["tie_word_embeddings"] is True
    assert (saved["eos_token_id"], saved["decoder_start_token_id"]) == (EOS, 0)
    assert "forced_eos_token_id" not in _saved_json(tmp_path, "generation_config.json")


def test_special_ids_come_from_the_vocabulary_given(tmp_path):
    config, params = _t5("1.0")
    # What lmsuite.data.vocab.special_ids(vocab) returns has these attributes (pinned below).
    vocab_ids = types.SimpleNamespace(pad=0, unk=1, cls=2, sep=3, mask=4, bos=5, eos=6)
    convert.to_hf(config, params, str(tmp_path / "a"), special_ids=vocab_ids)
    assert _saved_json(tmp_path / "a")["eos_token_id"] == 6
    other = convert.TokenIds(eos=[3, 9], bos=None)
    options = {"num_beams": 3}
    convert.to_hf(config, params, str(tmp_path / "b"), special_ids=other, generation=options)
    generation = _saved_json(tmp_path / "b", "generation_config.json")
    assert generation["eos_token_id"] == [3, 9] and generation["num_beams"] == 3
    assert "bos_token_id" not in generation


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(special_ids=convert.TokenIds(eos=6, bos=5, pad=1)), r"pad=1 differs .*pad_id=0"),
        (dict(special_ids=convert.TokenIds(eos=VOCAB, bos=5)), rf"eos_token_id={VOCAB} is not"),
        (dict(special_ids=object()), r"needs attributes eos, bos and pad"),
        (dict(generation={"eos_token_id": 3}), r"may not set \['eos_token_id'\]"),
    ],
)
def test_bad_special_ids_are_named(kw, match, tmp_path):
    config, params = _t5("1.0")
    with pytest.raises(ValueError, match=match):
        convert.to_hf(config, params, str(tmp_path), **kw)


def test_default_ids_are_the_lmsuite_vocabulary_layout():
    # lmsuite.convert may not import lmsuite.data, so the layout is written down twice. Read in
    # a subprocess: TensorFlow imported before torch's triton crashes the process.
    code = (
        "import dataclasses; from lmsuite.data import vocab; "
        "print(vocab.EOS_ID, vocab.BOS_ID, vocab.PAD_ID, "
        "{'eos', 'bos', 'pad'} <= {f.name for f in dataclasses.fields(vocab.SpecialIds)})"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(EOS), str(BOS), "0", "True"]
