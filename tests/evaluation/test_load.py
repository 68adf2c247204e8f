"""`lmsuite.load` and its handle, against HF's own pipeline and losses on the same weights.

HF models are randomly initialised at small odd sizes with tokenizers built here (a WordPiece
vocabulary for BERT, a byte-level BPE for RoBERTa and GPT-2); the lmsuite model is a tiny BERT
trained for four steps through the CLI. Nothing is downloaded.
"""

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch
import transformers
from flax import traverse_util
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

import lmsuite
from lmsuite import cli
from lmsuite.evaluation import LoadedModel, run_config
from lmsuite.evaluation.load import committed_steps
from lmsuite.models import ModelConfig
from lmsuite.training import recipes
from tests.training.test_recipes import train_argv

SENTENCES = [
    "the cat sat on the mat .",
    "a dog ran in the park !",
    "she reads a book every day .",
    "we like to eat apples and pears .",
    "the sun is bright today , is it not ?",
    "my brother plays the piano at night .",
    "birds sing in the tall green trees .",
    "he walked to the old station alone .",
]


# ------------------------------------------------------------------------------ HF fixtures
def _wordpiece():
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(
        SENTENCES * 4, trainers.WordPieceTrainer(vocab_size=97, special_tokens=specials)
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]",
    )  # fmt: skip


def _byte_level_bpe():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    trainer = trainers.BpeTrainer(
        vocab_size=150,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(SENTENCES * 4, trainer)
    tok.post_processor = processors.RobertaProcessing(
        ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>"))
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", cls_token="<s>",
        sep_token="</s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>",
    )  # fmt: skip


def _save(model, tokenizer, directory) -> str:
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


SIZES = dict(
    hidden_size=30,
    num_attention_heads=3,
    intermediate_size=37,
    num_hidden_layers=2,
    initializer_range=0.2,  # sharper predictions than 0.02: a top-k order that means something
)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    tokenizer = _wordpiece()
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(tokenizer), max_position_embeddings=40, **SIZES)
    model = transformers.BertForMaskedLM(config).eval()
    return _save(model, tokenizer, tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory):
    tokenizer = _byte_level_bpe()
    torch.manual_seed(1)
    config = transformers.RobertaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=42,
        type_vocab_size=1,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **SIZES,
    )
    model = transformers.RobertaForMaskedLM(config).eval()
    return _save(model, tokenizer, tmp_path_factory.mktemp("roberta"))


def _pipeline(directory):
    return transformers.pipeline("fill-mask", model=directory, tokenizer=directory, device="cpu")


def _assert_same_predictions(ours, theirs, *, strings=True):
    """The same nesting, tokens (and their strings), and scores within 1e-4."""
    assert type(ours) is type(theirs)
    if isinstance(theirs, list):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            _assert_same_predictions(a, b, strings=strings)
        return
    assert ours["token"] == theirs["token"], (ours, theirs)
    assert ours["score"] == pytest.approx(theirs["score"], abs=1e-4)
    if strings:
        assert (ours["token_str"], ours["sequence"]) == (theirs["token_str"], theirs["sequence"])


# ---------------------------------------------------------------------- fill-mask parity
@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_fill_mask_matches_the_hf_pipeline(family, bert_dir, roberta_dir):
    directory = {"bert": bert_dir, "roberta": roberta_dir}[family]
    mask = {"bert": "[MASK]", "roberta": "<mask>"}[family]
    model = lmsuite.load(directory)
    hf = _pipeline(directory)
    one = f"the cat {mask} on the mat ."
    several = [one, f"she reads a {mask} every day .", f"birds {mask} in the tall trees ."]
    two_masks = f"a {mask} ran in the {mask} !"
    for inputs, top_k in [(one, 5), (several, 3), (two_masks, 4), ([one, two_masks], 2)]:
        ours, theirs = model.fill_mask(inputs, top_k=top_k), hf(inputs, top_k=top_k)
        _assert_same_predictions(ours, theirs)
    # The predictions depend on the text: not one distribution for every mask.
    assert model.fill_mask(several, top_k=1)[0][0] != model.fill_mask(several, top_k=1)[1][0]


def test_fill_mask_refuses_texts_without_the_mask_and_models_without_an_mlm_head(bert_dir):
    model = lmsuite.load(bert_dir)
    with pytest.raises(ValueError, match=r"no mask token '\[MASK\]'"):
        model.fill_mask(["the cat [MASK] .", "no mask here"])
    gpt2, tokenizer = _gpt2()
    with pytest.raises(ValueError, match="MLM head.*decoder"):
        lmsuite.load(gpt2, tokenizer=tokenizer).fill_mask("the <mask> .")


# ------------------------------------------------------------------ the lmsuite run side
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny BERT trained for 4 steps through the CLI, committed at steps 2 and 4."""
    model_dir = tmp_path_factory.mktemp("run") / "bert"
    argv = train_argv(
        recipes.RECIPES["bert_mlm"],
        "bert_tiny",
        model_dir,
        "--gin.TRAIN_STEPS=4",
        "--gin.LEARNING_RATE=3e-3",
        "--gin.train.final_eval=False",
    )
    assert cli.main(argv) == 0
    assert committed_steps(str(model_dir)) == [2, 4]
    return str(model_dir)


def _saved_params(model_dir: str, step: int) -> dict:
    state = ocp.StandardCheckpointer().restore(f"{model_dir}/checkpoints/{step}/state")
    return traverse_util.flatten_dict(state["params"], sep="/")


def _flat(params) -> dict:
    return traverse_util.flatten_dict(params, sep="/")


def test_load_run_restores_the_params_training_saved(run_dir):
    newest, older = lmsuite.load(run_dir), lmsuite.load(run_dir, step=2)
    assert isinstance(newest, LoadedModel)
    assert newest.config.d_model == 64 and newest.config.vocab_size == 8100
    for model, step in ((newest, 4), (older, 2)):
        saved = _saved_params(run_dir, step)
        ours = _flat(model.params)
        assert sorted(ours) == sorted(saved)
        for key, value in saved.items():
            np.testing.assert_array_equal(ours[key], np.asarray(value), err_msg=key)
    moved = [k for k in _flat(newest.params) if
             not np.array_equal(_flat(newest.params)[k], _flat(older.params)[k])]  # fmt: skip
    assert moved, "steps 2 and 4 hold the same parameters: step= picked nothing"
    assert newest.vocab.encode("the [MASK] .")[0] == 2  # [CLS] from the run's SentencePiece


def test_load_run_errors_name_the_directory_and_the_steps(run_dir, tmp_path):
    with pytest.raises(ValueError, match=r"no committed checkpoint step 3; committed: \[2, 4\]"):
        lmsuite.load(run_dir, step=3)
    empty = tmp_path / "empty_run"
    empty.mkdir()
    shutil.copy(os.path.join(run_dir, "run.json"), empty / "run.json")
    (empty / "checkpoints" / "6").mkdir(parents=True)  # started, never committed
    with pytest.raises(ValueError, match=r"empty_run has no committed checkpoint.*'run.json'"):
        lmsuite.load(empty)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"neither an lmsuite run.*nor a HF.*'notes.txt'"):
        lmsuite.load(tmp_path / "other")


def test_relative_and_home_paths_load_and_a_file_is_refused(run_dir, monkeypatch, tmp_path):
    """Orbax reads absolute paths only: relative and `~` run dirs are resolved first (they
    used to fail inside Orbax with a TypeError); a file given as the run says so."""
    parent, name = os.path.split(run_dir)
    monkeypatch.chdir(parent)
    relative = lmsuite.load(name)
    absolute = _flat(lmsuite.load(run_dir).params)
    assert sorted(_flat(relative.params)) == sorted(absolute)
    for key, value in _flat(relative.params).items():
        np.testing.assert_array_equal(value, absolute[key], err_msg=key)
    assert lmsuite.load(f"./{name}", step=2).source.endswith(f"{name} step 2")
    monkeypatch.setenv("HOME", parent)
    assert lmsuite.load(f"~/{name}").source == f"{run_dir} step 4"
    with pytest.raises(ValueError, match=r"run.json is a file .*lmsuite.load takes a directory"):
        lmsuite.load(os.path.join(name, "run.json"))


def test_every_command_resolves_relative_model_dirs(run_dir, monkeypatch, capsys):
    parent, name = os.path.split(run_dir)
    monkeypatch.chdir(parent)
    assert cli.main(["eval", f"--model_dir={name}", "--max_batches=1"]) == 0
    assert os.path.join(run_dir, "eval") in capsys.readouterr().out
    code = cli.main(["eval", f"--model_dir={name}/run.json"])
    assert code == cli.CONFIG_ERROR_EXIT_CODE
    assert "--model_dir 'bert/run.json' is a file" in capsys.readouterr().err
    args = cli.parse_args(["train", "--gin_file=~/x.gin", "--model_dir=~/runs/r"])
    monkeypatch.setenv("HOME", "/home/someone")
    cli.resolve_paths(args)
    assert args.model_dir == "/home/someone/runs/r" and args.gin_file == ["/home/someone/x.gin"]
    args = cli.parse_args(["train", "--model_dir=gs://bucket/run"])
    cli.resolve_paths(args)
    assert args.model_dir == "gs://bucket/run"


@pytest.mark.parametrize("damage", ["truncated", "flipped_byte"])
def test_a_damaged_step_is_named_not_loaded(run_dir, tmp_path, capsys, damage):
    copy = shutil.copytree(run_dir, tmp_path / "copy")
    step_dir = copy / "checkpoints" / "4"
    victim = max(step_dir.rglob("ocdbt.process_0/d/*"), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    else:  # same size: only the checksum tells
        data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    name = str(victim.relative_to(step_dir))
    with pytest.raises(ValueError, match=rf"checkpoints/4 is damaged: {name} has"):
        lmsuite.load(copy, step=4)
    # Without a step, the newest step that verifies, the damaged one named.
    model = lmsuite.load(copy)
    assert f"not loading checkpoint step 4: checkpoint {step_dir} is damaged: {name}" in (
        capsys.readouterr().err
    )
    step_2 = lmsuite.load(copy, step=2).params
    for a, b in zip(_leaves(model.params), _leaves(step_2), strict=True):
        np.testing.assert_array_equal(a, b)
        assert np.isfinite(a).all()


def _leaves(params):
    return [v for _, v in sorted(traverse_util.flatten_dict(params, sep="/").items())]


def test_save_hf_gives_hf_the_same_tokens_and_predictions(run_dir, tmp_path):
    model = lmsuite.load(run_dir)
    written = model.save_hf(str(tmp_path / "hf"))
    names = {os.path.basename(p) for p in written}
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= names
    texts = [
        "The city was founded in 1850 by [MASK] settlers.",
        "He [MASK] the  election, and later the war.",
        "Its population is [MASK] [MASK] people.",
    ]
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in [*texts, "[CLS] a sentinel <extra_id_3>, and Ünïcödé ½ text </s>"]:
        assert hf_tokenizer(text)["input_ids"] == model.vocab.encode(text)
    hf = _pipeline(str(tmp_path / "hf"))
    _assert_same_predictions(model.fill_mask(texts, top_k=5), hf(texts, top_k=5))


# ------------------------------------------------------------------------------- scoring
def test_pseudo_log_likelihood_masks_each_token_in_turn(bert_dir):
    model = lmsuite.load(bert_dir)
    hf = transformers.BertForMaskedLM.from_pretrained(bert_dir).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(bert_dir)
    texts = ["the cat sat on the mat .", "birds sing at night !"]
    scores = model.score(texts)
    for text, score in zip(texts, scores, strict=True):
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        expected, count = 0.0, 0
        for position in range(1, ids.shape[1] - 1):  # [CLS] and [SEP] are never scored
            masked = ids.clone()
            masked[0, position] = tokenizer.mask_token_id
            with torch.no_grad():
                logits = hf(input_ids=masked).logits[0, position]
            expected += torch.log_softmax(logits.double(), -1)[ids[0, position]].item()
            count += 1
        assert score.pseudo and score.num_tokens == count
        assert score.log_likelihood == pytest.approx(expected, abs=1e-3)
        assert score.perplexity == pytest.approx(math.exp(-expected / count), rel=1e-3)
    with pytest.raises(ValueError, match="at least one text"):
        model.score([])


def _gpt2():
    tokenizer = _byte_level_bpe()
    torch.manual_seed(2)
    config = transformers.GPT2Config(
        vocab_size=len(tokenizer), n_positions=40, n_embd=30, n_head=3, n_layer=2,
        initializer_range=0.2,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval(), tokenizer


def test_causal_log_likelihood_is_gpt2_loss_times_tokens():
    hf, tokenizer = _gpt2()
    model = lmsuite.load(hf, tokenizer=tokenizer)
    texts = ["the cat sat on the mat .", "we like to eat apples and pears ."]
    for text, score in zip(texts, model.score(texts), strict=True):
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        with torch.no_grad():
            loss = hf(input_ids=ids, labels=ids).loss.item()
        assert score.num_tokens == ids.shape[1] - 1 and not score.pseudo
        assert score.log_likelihood == pytest.approx(-loss * (ids.shape[1] - 1), abs=1e-3)
        assert score.perplexity == pytest.approx(math.exp(loss), rel=1e-3)


def test_seq2seq_log_likelihood_is_t5_loss_times_target_tokens(bert_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(bert_dir)  # [PAD] is id 0, as T5's
    torch.manual_seed(3)
    config = transformers.T5Config(
        vocab_size=len(tokenizer), d_model=30, d_kv=10, d_ff=37, num_layers=2, num_heads=3,
        relative_attention_num_buckets=8, pad_token_id=0, decoder_start_token_id=0,
        eos_token_id=tokenizer.sep_token_id, initializer_factor=2.0,
    )  # fmt: skip
    hf = transformers.T5ForConditionalGeneration(config).eval()
    model = lmsuite.load(hf, tokenizer=tokenizer)
    inputs = ["the cat sat on the mat .", "a dog ran"]
    targets = ["she reads a book .", "birds sing in the tall green trees ."]
    for source, target, score in zip(inputs, targets, model.score(inputs, targets), strict=True):
        encoded = tokenizer(source, return_tensors="pt")
        labels = tokenizer(target, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            loss = hf(**encoded, labels=labels).loss.item()
        assert score.num_tokens == labels.shape[1]
        assert score.log_likelihood == pytest.approx(-loss * labels.shape[1], abs=1e-3)
    with pytest.raises(ValueError, match="2 inputs and 1 targets"):
        model.score(inputs, targets[:1])


def test_encode_gives_the_last_hidden_states_and_their_mean(roberta_dir):
    model = lmsuite.load(roberta_dir)
    hf = transformers.RobertaForMaskedLM.from_pretrained(roberta_dir).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(roberta_dir)
    texts = ["the sun is bright today", "a dog ran"]  # different lengths: padding in the batch
    encoded = model.encode(texts)
    for text, hidden, pooled in zip(texts, encoded.hidden, encoded.pooled, strict=True):
        with torch.no_grad():
            states = hf(**tokenizer(text, return_tensors="pt"), output_hidden_states=True)
        expected = states.hidden_states[-1][0].numpy()
        np.testing.assert_allclose(hidden, expected, atol=1e-4)
        np.testing.assert_allclose(pooled, expected.mean(axis=0), atol=1e-4)


# ------------------------------------------------------------------ run.json, exports
def test_run_config_round_trips_the_model_config_and_refuses_unknown_fields(tmp_path):
    from lmsuite.models import XLNetOptions

    config = ModelConfig(
        architecture="xlnet", heads=("lm",), d_model=48, xlnet=XLNetOptions(mem_len=8)
    )
    record = {
        "model_config": config.to_json(),
        "task": "wiki_sample_xlnet_plm",
        "sequence_length": {"input_k": 64, "target": 10},
        "recipe": "xlnet_plm",
    }
    (tmp_path / "run.json").write_text(json.dumps(record))
    run = run_config.read_run_config(tmp_path)
    assert run.model_config == config and run.model_config.heads == ("lm",)
    assert (run.task, run.recipe) == ("wiki_sample_xlnet_plm", "xlnet_plm")
    assert run.sequence_length == {"input_k": 64, "target": 10}
    with pytest.raises(ValueError, match=r"no fields \['d_modl'\]"):
        run_config.parse_run_config(json.dumps({"model_config": {"d_modl": 3}}))
    (tmp_path / "run.json").unlink()
    (tmp_path / "config.gin").write_text("ModelConfig.d_model = 48\n")
    with pytest.raises(ValueError, match="has no run.json .*predates run.json"):
        run_config.read_run_config(tmp_path)


def test_generate_delegates_left_padded_prompts(monkeypatch):
    import types

    import lmsuite.evaluation

    seen = {}

    def fake_generate(config, params, *, input_ids, max_new_tokens, **options):
        seen.update(options, input_ids=input_ids, max_new_tokens=max_new_tokens)
        return input_ids

    # A stand-in for lmsuite.evaluation.decoding: only the delegation is under test here.
    fake = types.SimpleNamespace(generate=fake_generate)
    monkeypatch.setitem(sys.modules, "lmsuite.evaluation.decoding", fake)
    monkeypatch.setattr(lmsuite.evaluation, "decoding", fake, raising=False)
    hf, tokenizer = _gpt2()
    model = lmsuite.load(hf, tokenizer=tokenizer)
    texts = ["the cat", "she reads a book"]
    assert model.generate(texts, max_new_tokens=3, num_beams=2) == texts
    short = tokenizer("the cat", add_special_tokens=False)["input_ids"]
    width = seen["input_ids"].shape[1]
    assert width > len(short)
    assert seen["attention_mask"][0].tolist() == [0] * (width - len(short)) + [1] * len(short)
    assert seen["input_ids"][0, width - len(short) :].tolist() == short
    assert seen["num_beams"] == 2 and seen["max_new_tokens"] == 3
    assert seen["eos_token_id"] == tokenizer.eos_token_id
    ids = np.array([[5, 6, 7]])
    assert model.generate(ids, max_new_tokens=1) is ids


def test_import_lmsuite_stays_cheap_and_exports_load():
    code = "import sys, lmsuite; print('jax' in sys.modules, callable(lmsuite.load))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
    from lmsuite.evaluation.load import load

    assert lmsuite.load is load


def test_a_scanned_run_loads_unscanned_and_decodes(tmp_path):
    """A GPT-2 trained with ModelConfig.scan_layers saves stacked layers; `load` gives the
    unscanned layout (what cached decoding needs) holding exactly those arrays, and generates."""
    model_dir = tmp_path / "gpt2_scanned"
    argv = train_argv(
        recipes.RECIPES["causal_lm"],
        "gpt2_tiny",
        model_dir,
        "--gin.ModelConfig.scan_layers=True",
        "--gin.ModelConfig.remat='full'",
        "--gin.train.final_eval=False",
    )
    assert cli.main(argv) == 0
    saved = _saved_params(str(model_dir), 2)
    assert "decoder/layers/mlp/wi/kernel" in saved
    model = lmsuite.load(str(model_dir))
    assert not model.config.scan_layers and model.config.remat == "full"
    ours = _flat(model.params)
    for i in range(model.config.num_layers):
        np.testing.assert_array_equal(
            ours[f"decoder/layers_{i}/mlp/wi/kernel"],
            np.asarray(saved["decoder/layers/mlp/wi/kernel"])[i],
        )
    (text,) = model.generate("the", max_new_tokens=3)
    assert text.startswith("the") and len(text) > len("the")
