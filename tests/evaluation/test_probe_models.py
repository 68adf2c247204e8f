"""Classification probes for every family: each tiny model learns a synthetic probe (is the
word "zebra" in the text?), the encoder-decoder's pooled state is the mean of its encoder's
states, XLNet reads its last position and ignores left padding, the causal LMs read the last
real token, `test=` is scored with the returned parameters, ELECTRA fine-tunes its
discriminator, and a family no probe reads is named."""

import flax.linen as nn
import jax
import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from lmsuite.evaluation import finetune, finetune_data, probe_models
from lmsuite.evaluation.handle import LoadedModel, NativeForward
from lmsuite.evaluation.tokenizer_export import TokenizersText
from lmsuite.models import ModelConfig, Transformer, families
from lmsuite.models.option_groups import ElectraOptions, XLNetOptions

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<s>", "</s>"]
WORDS = "zebra the a cat dog sat ran on in mat park big red old tree house".split()
ROLES = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
    "bos_token": "<s>",
    "eos_token": "</s>",
}
TINY = dict(
    vocab_size=len(SPECIALS) + len(WORDS),
    d_model=32,
    num_heads=2,
    d_ff=64,
    num_layers=2,
    max_length=32,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    init_stddev=0.2,
)
CONFIGS = {
    "encoder_decoder": dict(architecture="encoder_decoder", heads=("lm",), type_vocab_size=0,
                            position_type="t5_relative", num_decoder_layers=2),
    "xlnet": dict(architecture="xlnet", heads=("lm",), position_type="none",
                  xlnet=XLNetOptions(mem_len=4, bi_data=True)),
    "decoder": dict(architecture="decoder", heads=("lm",), type_vocab_size=0),
    "prefix_lm": dict(architecture="prefix_lm", heads=("lm",), type_vocab_size=0),
    "transformer_xl": dict(architecture="transformer_xl", heads=("lm",), position_type="none",
                           xlnet=XLNetOptions(attn_type="uni", mem_len=4)),
    "electra": dict(architecture="encoder", heads=("mlm", "rtd"), type_vocab_size=2,
                    electra=ElectraOptions(generator_hidden_fraction=0.5)),
}  # fmt: skip


def vocab() -> TokenizersText:
    table = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(table, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return TokenizersText(tok, roles=ROLES)


def tiny_model(name: str, seed: int = 1) -> LoadedModel:
    """A randomly initialised tiny model of the family, with the word-level vocabulary."""
    config = ModelConfig(**{**TINY, **CONFIGS[name]})
    inputs = families.example_inputs(config, batch=2, length=8)
    params = nn.unbox(Transformer(config).init(jax.random.PRNGKey(seed), **inputs)["params"])
    return LoadedModel(forward=NativeForward(config, params), vocab=vocab(), source=f"tiny {name}")


def zebra_examples(n: int, seed: int) -> list[finetune_data.TextExample]:
    """4-7 filler words; label 1 when "zebra" is among them (half the rows)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = list(rng.choice(WORDS[1:], size=int(rng.integers(4, 8))))
        if i % 2:
            words.insert(int(rng.integers(0, len(words) + 1)), "zebra")
        out.append(finetune_data.TextExample(" ".join(words), i % 2))
    return out


def batch_of(probe, examples, max_length):
    arrays = finetune_data.encode_examples(
        examples, vocab=vocab(), max_length=max_length, framing=probe.framing
    )
    return {k: v for k, v in arrays.items() if k != "labels"}


# ------------------------------------------------------------------------------ framing
def test_framings_of_a_text_and_a_pair():
    v = vocab()
    cls_, sep, eos = 2, 3, 6
    a, b, c, d = (v.encode(w, add_special_tokens=False)[0] for w in ("cat", "dog", "sat", "mat"))
    frame = lambda framing: finetune_data.frame_pair(
        v, "cat dog sat", "mat", max_length=6, framing=framing
    )
    assert frame("cls_sep") == ([cls_, a, b, sep, d, sep], [0, 0, 0, 0, 1, 1])
    assert frame("eos") == ([a, b, c, eos, d, eos], [0] * 6)
    assert frame("xlnet") == ([a, b, sep, d, sep, cls_], [0, 0, 0, 1, 1, 2])
    arrays = finetune_data.encode_examples(
        [finetune_data.TextExample("cat dog", 0)], vocab=v, max_length=6, framing="xlnet"
    )
    assert arrays["input_ids"].tolist() == [[0, 0, a, b, sep, cls_]]  # padded on the left
    assert arrays["attention_mask"].tolist() == [[0, 0, 1, 1, 1, 1]]
    assert arrays["token_type_ids"].tolist() == [[0, 0, 0, 0, 0, 2]]
    with pytest.raises(ValueError, match=r"framing 'eos' needs .*'eos_token'.* lacks"):
        no_eos = TokenizersText(v.tokenizer, roles={"cls_token": "[CLS]"})
        finetune_data.frame_pair(no_eos, "cat", None, max_length=6, framing="eos")


# ------------------------------------------------------------------------------ readings
def test_encoder_decoder_pools_the_mean_of_its_encoder_states():
    loaded = tiny_model("encoder_decoder")
    probe = probe_models.probe_for(loaded.config, num_labels=3)
    params = probe.init(jax.random.PRNGKey(0))
    assert "decoder" not in params and "lm_head" not in params  # the decoder is not used
    params = finetune.transplant(params, loaded.params, keep=probe.keep)
    batch = batch_of(probe, zebra_examples(4, 0), 12)
    # The encoder's states as the full model computes them (captured inside __call__).
    _, captured = Transformer(loaded.config).apply(
        {"params": loaded.params},
        batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=batch["input_ids"],
        capture_intermediates=lambda module, _: module.name == "encoder",
        mutable=["intermediates"],
    )
    states = np.asarray(captured["intermediates"]["encoder"]["__call__"][0])
    mask = batch["attention_mask"].astype(bool)
    pooled = np.stack([states[b][mask[b]].mean(axis=0) for b in range(len(mask))])
    head = jax.tree.map(np.asarray, params["classifier"])
    hidden = np.tanh(pooled @ head["pooler"]["kernel"] + head["pooler"]["bias"])
    want = hidden @ head["output"]["kernel"] + head["output"]["bias"]
    np.testing.assert_allclose(np.asarray(probe.logits(params, batch)), want, atol=1e-5)
    # Padding tokens are not read: other ids under mask 0 leave the logits as they were.
    noisy = {**batch, "input_ids": np.where(mask, batch["input_ids"], 9)}
    np.testing.assert_allclose(probe.logits(params, noisy), want, atol=1e-5)


def test_xlnet_reads_its_last_position_and_ignores_left_padding():
    loaded = tiny_model("xlnet")
    probe = probe_models.probe_for(loaded.config, num_labels=2)
    assert not probe.config.xlnet.bi_data  # one reading direction, as XLNet fine-tunes
    params = finetune.transplant(probe.init(jax.random.PRNGKey(0)), loaded.params, keep=probe.keep)
    examples = zebra_examples(3, 1)
    short, long = batch_of(probe, examples, 12), batch_of(probe, examples, 20)
    assert (long["attention_mask"][:, :8] == 0).all()  # 8 more pads, all on the left
    logits = np.asarray(probe.logits(params, short))
    np.testing.assert_allclose(np.asarray(probe.logits(params, long)), logits, atol=1e-5)
    # The content stream's last position (the [CLS]) through pooler and output.
    hidden = Transformer(probe.config).apply(
        {"params": params},
        short["input_ids"],
        attention_mask=short["attention_mask"],
        token_type_ids=short["token_type_ids"],
    )["hidden"]
    head = jax.tree.map(np.asarray, params["classifier"])
    pooled = np.tanh(np.asarray(hidden)[:, -1] @ head["pooler"]["kernel"] + head["pooler"]["bias"])
    want = pooled @ head["output"]["kernel"] + head["output"]["bias"]
    np.testing.assert_allclose(logits, want, atol=1e-5)


@pytest.mark.parametrize("name", ["decoder", "transformer_xl"])
def test_causal_lms_read_the_last_real_token(name):
    loaded = tiny_model(name)
    probe = probe_models.probe_for(loaded.config, num_labels=2)
    params = finetune.transplant(probe.init(jax.random.PRNGKey(0)), loaded.params, keep=probe.keep)
    examples = zebra_examples(3, 2)
    short, long = batch_of(probe, examples, 12), batch_of(probe, examples, 20)
    logits = np.asarray(probe.logits(params, short))
    np.testing.assert_allclose(np.asarray(probe.logits(params, long)), logits, atol=1e-5)
    # The read state has seen the whole text: changing its first token or its last word (the
    # one before </s>) changes every row's logits.
    last_word = short["attention_mask"].sum(axis=1) - 2
    for columns in (np.zeros(3, int), last_word):
        changed = short["input_ids"].copy()
        rows = np.arange(3)
        changed[rows, columns] = np.where(changed[rows, columns] == 9, 10, 9)
        moved = np.abs(np.asarray(probe.logits(params, {**short, "input_ids": changed})) - logits)
        assert (moved.max(axis=1) > 1e-4).all(), (columns, moved)


def test_a_family_no_probe_reads_is_named(monkeypatch):
    loaded = tiny_model("xlnet")
    monkeypatch.setattr(probe_models, "SUPPORTED", ("encoder", "decoder"))
    with pytest.raises(
        ValueError, match=r"cannot read architecture='xlnet' \(family 'xlnet'\); supported "
        r"families: \('encoder', 'decoder'\)"
    ):  # fmt: skip
        probe_models.probe_for(loaded.config, num_labels=2)
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"classifier_model is the encoders' head; "):
        finetune.classifier_model(loaded.config, num_labels=2)


# ------------------------------------------------------------------------------ training
SETTINGS = dict(learning_rate=3e-3, epochs=6, batch_size=16, max_length=12, progress=False)


@pytest.mark.parametrize("name", ["encoder_decoder", "xlnet", "decoder", "transformer_xl"])
def test_each_family_learns_the_zebra_probe_and_scores_test(name):
    loaded = tiny_model(name)
    test = zebra_examples(24, 5)
    result = finetune.finetune_classifier(
        loaded,
        train=zebra_examples(96, 3),
        validation=zebra_examples(24, 4),
        test=test,
        num_labels=2,
        **SETTINGS,
    )
    metrics = result.metrics
    assert metrics["family"] == name
    assert metrics["majority_class_share"] == 0.5 == metrics["test_majority_class_share"]
    assert metrics["validation_accuracy"] >= 0.8, result.history
    # test_accuracy is the returned parameters' accuracy, recomputed in one unbatched call.
    probe = probe_models.probe_for(loaded.config, num_labels=2)
    logits = probe.logits(result.params, batch_of(probe, test, SETTINGS["max_length"]))
    labels = np.asarray([e.label for e in test])
    assert metrics["test_accuracy"] == float(np.mean(np.argmax(logits, -1) == labels))


@pytest.mark.parametrize(
    "name",
    # (the fast suite keeps one family; each takes about 10 s)
    ["encoder_decoder"] + [pytest.param(n, marks=pytest.mark.slow)
                           for n in ("xlnet", "prefix_lm", "transformer_xl")],
)  # fmt: skip
def test_from_scratch_takes_nothing_from_the_model(name):
    loaded = tiny_model(name, seed=7)
    examples = zebra_examples(16, 6)
    settings = dict(SETTINGS, epochs=1, learning_rate=1e-4)
    result = finetune.finetune_classifier(
        loaded, train=examples, validation=examples, num_labels=2, from_scratch=True, **settings
    )
    probe = probe_models.probe_for(loaded.config, num_labels=2)
    fresh = probe.init(jax.random.PRNGKey(0))
    table = lambda p: np.asarray(p["token_embedder"]["embedding"])
    moved = np.abs(table(result.params) - table(fresh)).max()
    assert moved < 0.01 < np.abs(table(result.params) - table(loaded.params)).max()
    pretrained = finetune.finetune_classifier(
        loaded, train=examples, validation=examples, num_labels=2, **settings
    )
    assert np.abs(table(pretrained.params) - table(loaded.params)).max() < 0.01


def test_electra_fine_tunes_its_discriminator():
    loaded = tiny_model("electra")
    result = finetune.finetune_classifier(
        loaded,
        train=zebra_examples(96, 3),
        validation=zebra_examples(24, 4),
        num_labels=2,
        **SETTINGS,
    )
    assert result.config.electra is None and result.config.heads == ("classifier",)
    assert "generator" not in result.params and "discriminator" not in result.params
    assert result.metrics["validation_accuracy"] >= 0.8, result.history
    # The encoder started from the discriminator's (and moved), not the generator's.
    start = np.asarray(loaded.params["discriminator"]["encoder"]["layers_0"]["mlp"]["wi"]["kernel"])
    end = np.asarray(result.params["encoder"]["layers_0"]["mlp"]["wi"]["kernel"])
    assert end.shape == start.shape and 0 < np.abs(end - start).max() < 0.1


# ------------------------------------------------------------------------------ slow
@pytest.mark.slow
@pytest.mark.parametrize(
    "experiment, family",
    [
        ("t5_1_1_tiny", "encoder_decoder"),
        ("xlnet_tiny", "xlnet"),
        ("txl_tiny", "transformer_xl"),
        ("electra_tiny", "electra"),
    ],
)
def test_a_two_step_run_of_each_family_loads_and_fine_tunes(experiment, family, tmp_path):
    """A real run directory (its SentencePiece vocabulary, its checkpoint layout) through
    `lmsuite.load` and the probe on a slice of trec_questions; two pretraining steps teach
    nothing, so only the plumbing and the metrics' consistency are asserted."""
    import lmsuite

    bindings = {"TRAIN_STEPS": 2, "BATCH_SIZE": 2, "CHECKPOINT_EVERY": 2, "WARMUP_STEPS": 1}
    run = lmsuite.run_from_gin(
        f"experiments/{experiment}.gin", model_dir=str(tmp_path), bindings=bindings
    )
    lmsuite.train(run)
    train, validation, labels = finetune_data.probe_examples("trec_questions")
    result = finetune.finetune_classifier(
        str(tmp_path),
        train=train[:48],
        validation=validation[:16],
        test=validation[16:40],
        num_labels=len(labels),
        epochs=1,
        batch_size=16,
        max_length=32,
        learning_rate=1e-3,
        progress=False,
    )
    metrics = result.metrics
    assert metrics["family"] == family and metrics["test_examples"] == 24
    assert 0 <= metrics["test_accuracy"] <= 1 and np.isfinite(result.history[0]["train_loss"])
    assert set(result.params["classifier"]) == {"pooler", "output"}


def test_an_encoder_keeps_its_pretrained_pooler_and_gets_a_new_output_layer():
    """A BERT pretrained with NSP (a 2-way classifier) fine-tuned on 6 labels: the pooler is
    taken from the checkpoint, the output layer is new (even where its shape would fit)."""
    config = ModelConfig(**TINY, heads=("mlm", "classifier"), num_labels=2)
    pretrained = finetune.init_params(config, jax.random.PRNGKey(1))
    for labels in (6, 2):
        probe = probe_models.probe_for(config, num_labels=labels)
        fresh = probe.init(jax.random.PRNGKey(2))
        moved = finetune.transplant(fresh, pretrained, keep=probe.keep)
        np.testing.assert_array_equal(
            moved["classifier"]["pooler"]["kernel"], pretrained["classifier"]["pooler"]["kernel"]
        )
        np.testing.assert_array_equal(
            moved["classifier"]["output"]["kernel"], fresh["classifier"]["output"]["kernel"]
        )
        assert moved["classifier"]["output"]["bias"].shape == (labels,)


def test_deberta_fine_tunes_without_its_enhanced_mask_decoder():
    """The EMD feeds the MLM head only: the probe reads the encoder's last layer, and every
    encoder parameter comes from the checkpoint."""
    from flax import traverse_util

    from lmsuite.models.option_groups import DebertaOptions

    options = DebertaOptions(emd_layers=2)
    config = ModelConfig(**{**TINY, "heads": ("mlm",), "position_type": "deberta",
                            "type_vocab_size": 0, "deberta": options})  # fmt: skip
    pretrained = finetune.init_params(config, jax.random.PRNGKey(1))
    probe = probe_models.probe_for(config, num_labels=3)
    assert probe.config.emd_layers == 0 and probe.config.heads == ("classifier",)
    moved = finetune.transplant(probe.init(jax.random.PRNGKey(2)), pretrained, keep=probe.keep)
    old = traverse_util.flatten_dict(pretrained, sep="/")
    for key, value in traverse_util.flatten_dict(moved, sep="/").items():
        if not key.startswith("classifier/"):
            np.testing.assert_array_equal(value, old[key], err_msg=key)
    rows = finetune_data.encode_examples(zebra_examples(4, 0), vocab=vocab(), max_length=16)
    assert probe.logits(moved, rows).shape == (4, 3)  # no token-type table: none read
