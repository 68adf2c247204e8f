"""Classification fine-tuning: GLUE-format TSV reading, the classifier loop on a tiny model,
every bad input named, the `lmsuite finetune` command, and (slow) pretrained vs scratch on the
embedded probes."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lmsuite
from lmsuite import cli
from lmsuite.evaluation import finetune, finetune_data
from tests.evaluation.test_qa import make_bert_dir

POSITIVE = "good great fun lovely".split()
NEGATIVE = "bad awful dull boring".split()
FILLER = "the movie was really quite a story and it felt so long today".split()


def sentiment_rows(n: int, seed: int) -> list[tuple[str, str]]:
    """(text, label): filler words around one positive or one negative word."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        words = list(rng.choice(FILLER, size=5))
        label = i % 2
        words.insert(int(rng.integers(0, 6)), str(rng.choice(POSITIVE if label else NEGATIVE)))
        rows.append((" ".join(words), "pos" if label else "neg"))
    return rows


def write_tsv(path, header, rows) -> str:
    path.write_text("\n".join("\t".join(r) for r in [header, *rows]) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    texts = [" ".join(POSITIVE + NEGATIVE + FILLER)] + [t for t, _ in sentiment_rows(40, 9)]
    # initializer_range 0.2: at BERT's 0.02 a random 2-layer model's [CLS] states barely
    # differ between texts, and a few dozen steps do not get the classifier off chance.
    return make_bert_dir(tmp_path_factory.mktemp("bert_cls"), texts, initializer_range=0.2)


@pytest.fixture
def tsv_files(tmp_path):
    train = write_tsv(tmp_path / "train.tsv", ["sentence", "label"], sentiment_rows(160, 0))
    dev = write_tsv(tmp_path / "dev.tsv", ["sentence", "label"], sentiment_rows(24, 1))
    return train, dev


# ------------------------------------------------------------------------------ data
def test_glue_tsv_labels_come_from_the_training_file(tsv_files):
    train, dev = tsv_files
    examples, labels = finetune_data.read_glue_tsv(train)
    assert labels == ("neg", "pos")
    assert [e.label for e in examples[:4]] == [0, 1, 0, 1]
    validation, _ = finetune_data.read_glue_tsv(dev, label_names=("pos", "neg"))
    assert validation[0].label == 1 and validation[1].label == 0  # the given order, not sorted


def test_glue_pair_columns_are_detected_and_encoded(tmp_path, bert_dir):
    path = write_tsv(
        tmp_path / "qnli.tsv",
        ["index", "question", "sentence", "label"],
        [["0", "was it good", "the movie was good", "entailment"]],
    )
    (example,), labels = finetune_data.read_glue_tsv(path)
    assert (example.text, example.pair, labels) == (
        "was it good",
        "the movie was good",
        ("entailment",),
    )
    vocab = lmsuite.load(bert_dir).vocab
    ids, types = finetune_data.encode_pair(vocab, example.text, example.pair, max_length=9)
    cls_id, sep_id = vocab.token_id("cls_token"), vocab.token_id("sep_token")
    first = vocab.encode(example.text, add_special_tokens=False)
    second = vocab.encode(example.pair, add_special_tokens=False)
    assert (len(first), len(second)) == (3, 4)
    # 3 + 4 pieces into the 6 that fit: the longer one loses its last piece.
    assert ids == [cls_id, *first, sep_id, *second[:3], sep_id]
    assert types == [0] * 5 + [1] * 4


def test_validation_label_outside_the_set_is_named(tsv_files, tmp_path):
    train, _ = tsv_files
    dev = write_tsv(
        tmp_path / "bad.tsv", ["sentence", "label"], [["so good", "pos"], ["meh", "neutral"]]
    )
    with pytest.raises(
        ValueError,
        match=r"bad\.tsv line 3: label 'neutral' is not in the label "
        r"set \['neg', 'pos'\]",
    ):
        finetune_data.classification_data("glue_tsv", train_file=train, validation_file=dev)


@pytest.mark.parametrize(
    "header, columns, message",
    [
        (["text", "label"], {}, r"no GLUE text column in the header \['text', 'label'\]"),
        (["sentence", "y"], {}, r"no label column in the header \['sentence', 'y'\]"),
        (
            ["sentence", "label"],
            {"pair_column": "hypothesis"},
            r"pair column 'hypothesis' is not in the header",
        ),
    ],
)
def test_missing_column_is_named(tmp_path, header, columns, message):
    path = write_tsv(tmp_path / "x.tsv", header, [["so good", "1"]])
    with pytest.raises(ValueError, match=message):
        finetune_data.read_glue_tsv(path, **columns)


def test_unknown_task_and_short_row_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"unknown task 'sst3'.*'trec_questions'"):
        finetune_data.classification_data("sst3")
    path = tmp_path / "short.tsv"
    path.write_text("sentence\tlabel\nonly one field\n")
    with pytest.raises(ValueError, match=r"short\.tsv line 2: 1 fields, the header has 2"):
        finetune_data.read_glue_tsv(str(path))


def test_batches_pad_the_last_batch_with_zero_weights():
    arrays = {"x": np.arange(5)}
    got = list(finetune.batches(arrays, batch_size=2, rng=None))
    assert [b["x"].tolist() for b in got] == [[0, 1], [2, 3], [4, 4]]
    assert [b["weights"].tolist() for b in got] == [[1, 1], [1, 1], [1, 0]]


# ------------------------------------------------------------------------------ training
def test_classifier_trains_on_a_tiny_glue_tsv_and_beats_chance(tsv_files, bert_dir):
    train, validation, labels = finetune_data.classification_data(
        "glue_tsv", train_file=tsv_files[0], validation_file=tsv_files[1]
    )
    loaded = lmsuite.load(bert_dir)
    result = finetune.finetune_classifier(
        loaded,
        train=train,
        validation=validation,
        num_labels=len(labels),
        learning_rate=5e-3,
        epochs=5,
        batch_size=8,
        max_length=16,
        seed=0,
        progress=False,
    )
    assert result.metrics["majority_class_share"] == 0.5
    assert result.metrics["validation_accuracy"] >= 0.8, result.history
    assert len(result.history) == 5
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    assert result.config.heads == ("classifier",) and result.config.num_labels == 2
    # The encoder came from the checkpoint (and moved); the classifier head is new.
    embedding = result.params["token_embedder"]["embedding"]
    pretrained = loaded.params["token_embedder"]["embedding"]
    assert embedding.shape == pretrained.shape and not np.allclose(embedding, pretrained)
    assert "mlm_head" not in result.params


def test_from_scratch_takes_nothing_from_the_checkpoint(bert_dir):
    loaded = lmsuite.load(bert_dir)
    config = finetune.classifier_model(loaded.config, num_labels=3)
    fresh = finetune.init_params(config, __import__("jax").random.PRNGKey(0))
    moved = finetune.transplant(
        fresh, loaded.params, keep=lambda k: not k.startswith("classifier/output/")
    )
    same = np.asarray(moved["encoder"]["layers_0"]["mlp"]["wi"]["kernel"])
    want = np.asarray(loaded.params["encoder"]["layers_0"]["mlp"]["wi"]["kernel"])
    np.testing.assert_array_equal(same, want)
    assert not np.allclose(fresh["encoder"]["layers_0"]["mlp"]["wi"]["kernel"], want)
    with pytest.raises(ValueError, match=r"labels \[3\] are outside \[0, num_labels=3\)"):
        finetune.finetune_classifier(
            loaded,
            train=[finetune_data.TextExample("a", 3)],
            validation=[finetune_data.TextExample("a", 0)],
            num_labels=3,
            epochs=1,
        )


# ------------------------------------------------------------------------------ CLI
def test_finetune_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["finetune", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--model_dir", "--hf_dir", "--task", "--output_dir", "--from_scratch"):
        assert flag in out


def test_finetune_command_end_to_end(tsv_files, bert_dir, tmp_path, capsys):
    out_dir = tmp_path / "out"
    argv = [
        "finetune",
        f"--hf_dir={bert_dir}",
        "--task=glue_tsv",
        f"--train_file={tsv_files[0]}",
        f"--validation_file={tsv_files[1]}",
        f"--output_dir={out_dir}",
        "--epochs=2",
        "--learning_rate=2e-3",
        "--batch_size=8",
        "--max_length=16",
        "--no_progress",
    ]
    assert cli.main(argv) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert last.startswith(f"held-out accuracy {metrics['final']['validation_accuracy']:.4f}")
    assert len(metrics["history"]) == 2 and metrics["final"]["labels"] == ["neg", "pos"]
    params = np.load(out_dir / "params.npz")
    assert params["classifier/output/kernel"].shape == (32, 2)
    assert cli.main([*argv[:2], "--task=sst3", *argv[3:]]) == 2
    assert "unknown --task 'sst3'" in capsys.readouterr().err


def test_finetune_command_scores_a_test_file(tsv_files, bert_dir, tmp_path, capsys):
    test_file = write_tsv(tmp_path / "test.tsv", ["sentence", "label"], sentiment_rows(10, 2))
    out_dir = tmp_path / "out"
    argv = [
        "finetune",
        f"--hf_dir={bert_dir}",
        "--task=glue_tsv",
        f"--train_file={tsv_files[0]}",
        f"--validation_file={tsv_files[1]}",
        f"--test_file={test_file}",
        f"--output_dir={out_dir}",
        "--epochs=1",
        "--batch_size=8",
        "--max_length=16",
        "--no_progress",
    ]
    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    final = json.loads((out_dir / "metrics.json").read_text())["final"]
    assert final["test_examples"] == 10 and final["test_majority_class_share"] == 0.5
    assert lines[-2].startswith(f"test accuracy {final['test_accuracy']:.4f} (majority class")
    assert cli.main([*argv[:2], "--task=trec_questions", *argv[5:]]) == 2
    assert "--test_file is for --task=glue_tsv, not 'trec_questions'" in capsys.readouterr().err


# ------------------------------------------------------------------------------ slow
PRETRAIN_RUN = os.environ.get("LMSUITE_PRETRAIN_RUN", "runs/default")


@pytest.mark.slow
@pytest.mark.skipif(
    not os.path.isdir(PRETRAIN_RUN),
    reason=f"no `make pretrain` run at {PRETRAIN_RUN} (set LMSUITE_PRETRAIN_RUN)",
)
def test_the_pretrain_run_fine_tunes_on_trec_questions():
    """The `make pretrain` model, its SentencePiece vocabulary and the embedded probe, through
    one epoch at the probe table's settings: well above the majority class (0.218).

    Not asserted: pretrained > scratch. For this small, briefly pretrained model the 3-seed
    probe table found the two within a standard deviation of each other at these settings."""
    train, validation, labels = finetune_data.probe_examples("trec_questions")
    result = finetune.finetune_classifier(
        PRETRAIN_RUN,
        train=train,
        validation=validation,
        num_labels=len(labels),
        learning_rate=1e-3,
        epochs=1,
        batch_size=32,
        max_length=64,
        seed=0,
        progress=False,
    )
    metrics = result.metrics
    assert metrics["validation_accuracy"] > metrics["majority_class_share"] + 0.3, metrics


def _squares_loss(params, batch, rng):
    del rng
    residual = batch["x"] @ params["w"] - batch["y"]
    return jnp.sum(residual**2 * batch["weights"]) / jnp.sum(batch["weights"])


def test_one_compiled_step_serves_every_learning_rate_of_a_sweep():
    """fit scales a unit-peak schedule's updates by the rate: the same parameters as AdamW
    under a schedule peaking at that rate, from one compilation for every rate."""
    import optax

    rng = np.random.default_rng(0)
    train = {"x": rng.normal(size=(40, 3)).astype(np.float32),
             "y": rng.normal(size=40).astype(np.float32)}  # fmt: skip
    start = {"w": jnp.asarray([0.5, -0.2, 0.1])}
    settings = dict(epochs=2, batch_size=8, warmup_fraction=0.25, seed=0, progress=False)
    before = finetune._compiled_step.cache_info()
    results = {}
    for rate in (0.1, 0.03):
        copy = {"w": jnp.array(start["w"])}  # (fit donates the parameters it is given)
        results[rate], _ = finetune.fit(
            params=copy, loss_fn=_squares_loss, train=train, evaluate=lambda p: {},
            learning_rate=rate, **settings,
        )  # fmt: skip
    after = finetune._compiled_step.cache_info()
    assert after.misses - before.misses <= 1 and after.hits - before.hits >= 1

    # the same steps with the rate inside the schedule (the AdamW fine-tuning recipe as such)
    optimizer = finetune.make_optimizer(learning_rate=0.03, total_steps=10, warmup_fraction=0.25)
    params, state = dict(start), optimizer.init(start)
    order = np.random.default_rng(0)
    for _ in range(2):
        for batch in finetune.batches(train, batch_size=8, rng=order):
            grads = jax.grad(_squares_loss)(params, batch, None)
            updates, state = optimizer.update(grads, state, params)
            params = optax.apply_updates(params, updates)
    np.testing.assert_allclose(results[0.03]["w"], params["w"], rtol=1e-5, atol=1e-7)
    assert not np.allclose(results[0.1]["w"], params["w"], atol=1e-3)


def test_random_parameters_of_an_encoder_decoder_include_its_decoder():
    """The study's from-scratch T5 baseline once crashed here: the decoder needs its own ids."""
    config = cli.model_config_from_gin(["models/t5_1_1_tiny.gin"])
    params = finetune.init_params(config, jax.random.key(0))
    assert {"encoder", "decoder"} <= set(params)
