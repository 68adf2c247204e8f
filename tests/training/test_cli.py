"""`lmsuite train` configuration errors: every problem listed at once, quickly, exit code 2."""

import json
import re
import time

import numpy as np
import pytest
import tensorflow as tf

from lmsuite import cli
from lmsuite.cli import pretrain_report
from tests.training import cli_errors

SMOKE = "--gin_file=experiments/smoke.gin"


def _errors(capsys, tmp_path, *argv):
    start = time.perf_counter()
    code = cli.main(["train", *argv, f"--model_dir={tmp_path / 'run'}"])
    elapsed = time.perf_counter() - start
    err = capsys.readouterr().err
    assert code == cli.CONFIG_ERROR_EXIT_CODE, err
    assert elapsed < 5.0, f"config check took {elapsed:.1f} s"
    assert not (tmp_path / "run").exists()  # nothing ran
    return cli_errors.problem_lines(err)


@pytest.fixture(scope="module", autouse=True)
def _warm_imports():
    # The first check imports TensorFlow and SeqIO; time the checks, not the imports.
    cli.register_configurables()
    import lmsuite.data.tasks  # noqa: F401


def test_typos_in_bindings_and_macros_are_listed_with_nearest_names(capsys, tmp_path):
    errors = _errors(
        capsys,
        tmp_path,
        SMOKE,
        "--gin.train.batch_sz=3",
        "--gin.ModelConfg.d_model=16",
        "--gin.LEARNING_RATEE=0.1",
    )
    assert len(errors) == 3, errors
    assert "did you mean 'batch_size'" in errors[0]
    assert "unknown configurable 'ModelConfg'; did you mean 'ModelConfig'" in errors[1]
    assert "LEARNING_RATEE is set but never used; did you mean 'LEARNING_RATE'" in errors[2]


def test_two_missing_required_macros_are_both_listed(capsys, tmp_path):
    gin_file = tmp_path / "partial.gin"
    gin_file.write_text(
        "include 'models/bert_tiny.gin'\n"
        "include 'runs/pretrain.gin'\nTRAIN_STEPS = 5\nRECIPE = 'bert_mlm'\n"
        "SEQUENCE_LENGTH = {'input_ids': 32, 'masked_ids': 5}\n"
    )
    errors = _errors(capsys, tmp_path, f"--gin_file={gin_file}")
    assert len(errors) == 2, errors
    assert "macro TASK is %gin.REQUIRED" in errors[0] and "--gin.TASK=VALUE" in errors[0]
    assert "macro BATCH_SIZE is %gin.REQUIRED" in errors[1]


def test_a_deberta_option_of_an_older_lmsuite_says_where_it_moved(capsys, tmp_path):
    errors = _errors(
        capsys,
        tmp_path,
        "--gin_file=experiments/deberta_tiny.gin",
        "--gin.ModelConfig.deberta_emd_layers=2",
    )
    assert len(errors) == 1, errors
    assert "'deberta_emd_layers'; DeBERTa's options moved to DebertaOptions: write " in errors[0]
    assert "DebertaOptions.emd_layers" in errors[0]


def test_task_batch_and_length_problems_are_listed_together(capsys, tmp_path):
    errors = _errors(
        capsys,
        tmp_path,
        SMOKE,
        "--gin.TASK='wiki_sample_bert_mlmm'",
        "--gin.BATCH_SIZE=7",
        "--gin.MESH_SHAPE=(2, 1, 1)",
        "--gin.SEQUENCE_LENGTH={'input_ids': 512, 'masked_ids': 10}",
    )
    assert len(errors) == 4, errors
    assert "unknown task 'wiki_sample_bert_mlmm'; did you mean 'wiki_sample_bert_mlm'" in errors[0]
    assert "batch_size 7 is not divisible by the batch axes data*fsdp = 2*1 = 2" in errors[1]
    # (a fixed 2x1x1 mesh on the tests' 1 or 8 CPU devices cannot be made)
    assert "mesh_shape (2, 1, 1) needs 2 devices, but there are " in errors[2]
    assert "512 is longer than the position table: 128 positions" in errors[3]


COMMANDS = ["train", "pretrain", "info", "vocab", "tasks", "recipes", "compile", "finetune",
            "eval", "study"]  # fmt: skip


def test_the_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_args(["--help"])
    assert exit_info.value.code == 0
    assert "{" + ",".join(COMMANDS) + "}" in capsys.readouterr().out


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_help_opens_with_what_it_does(command, capsys):
    """`lmsuite eval --help` says what eval does before its flags (argparse's default shows the
    summary in `lmsuite --help` only)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_args([command, "--help"])
    assert exit_info.value.code == 0
    usage, description, *_ = capsys.readouterr().out.split("\n\n")
    assert usage.startswith(f"usage: lmsuite {command}")
    assert description[0].isupper() and description.endswith("."), description
    assert "options:" not in description


def test_gin_flags_parse_like_t5x():
    args = cli.parse_args(
        ["train", "--gin_file=a.gin", "--gin_file=b.gin", "--gin.X=1", "--model_dir=/m",
         "--gin_search_paths=p,q"]
    )  # fmt: skip
    assert args.gin_file == ["a.gin", "b.gin"]
    assert args.gin_bindings == ["X = 1"]
    assert args.gin_search_paths == ["p", "q"]
    assert cli.parse_args(["pretrain"]).gin_file == ["experiments/default.gin"]


@pytest.mark.parametrize(
    "run_file, lr_at_5",
    [
        # ALBERT's create_optimizer, as BERT's, decays from step 0: the end of warmup
        # (WARMUP_STEPS = 5 in smoke.gin) drops to the decayed rate.
        ("runs/lamb_albert.gin", 0.00176 * (1 - 5 / 30)),
        ("runs/adam_bert.gin", 1e-4 * (1 - 5 / 30)),  # TF BERT's drop at the end of warmup
        ("runs/adafactor_t5.gin", 0.01),  # 1 / sqrt(10000)
    ],
)
def test_optimizer_run_files_compose_with_smoke(run_file, lr_at_5):
    args = cli.parse_args(
        ["train", SMOKE, f"--gin_file={run_file}", "--model_dir=/tmp/unused"]
    )  # fmt: skip
    kwargs = cli.load_config(args)
    assert float(kwargs["learning_rate_fn"](5)) == pytest.approx(lr_at_5, rel=1e-6)


def test_pretrain_prints_artifacts_and_accuracy_against_the_majority_baseline(capsys, tmp_path):
    from lmsuite.training import input_pipeline, report

    model_dir = tmp_path / "run"
    code = cli.main(
        [
            "pretrain",
            SMOKE,
            f"--model_dir={model_dir}",
            "--gin.TRAIN_STEPS=6",
            "--gin.CHECKPOINT_EVERY=6",
            "--gin.train.eval_every=6",
            "--gin.train.eval_batches=3",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert (model_dir / "loss_curve.png").stat().st_size > 10_000
    assert (model_dir / "checkpoints" / "6").is_dir()
    line = next(x for x in out.splitlines() if x.startswith("held-out MLM accuracy"))
    accuracy, baseline = (float(x) for x in re.findall(r"\d\.\d{4}", line))
    eval_record = [
        r for r in map(json.loads, (model_dir / "metrics.jsonl").open()) if "eval/loss" in r
    ]
    assert round(eval_record[-1]["eval/mlm_accuracy"], 4) == accuracy
    logged = [r for r in map(json.loads, (model_dir / "metrics.jsonl").open()) if "loss" in r]
    assert all(0.0 < r["mfu"] < 1.0 for r in logged), logged
    # The baseline is recomputed independently from the same held-out batches.
    kwargs = cli.load_config(cli.parse_args(["train", SMOKE, "--model_dir=/unused"]))
    held_out = input_pipeline.process_dataset(
        task=kwargs["task"],
        sequence_length=kwargs["sequence_length"],
        feature_converter=kwargs["recipe"].feature_converter,
        global_batch_size=kwargs["batch_size"],
        split="validation",
        shuffle=False,
        repeat=False,
    ).take(3)
    targets = np.concatenate(
        [b["masked_ids"][b["masked_weights"] > 0] for b in held_out.as_numpy_iterator()]
    )
    expected = np.bincount(targets).max() / targets.size
    assert 0.0 < expected < 0.5
    assert baseline == round(expected, 4)
    assert report.majority_baseline([{"input_ids": targets}]) is None
    _assert_fill_mask_section(out)


def test_pretrain_reads_its_held_out_batches_once_for_its_baselines_and_label_lines(
    capsys, tmp_path, monkeypatch
):
    """The run's evaluation keeps its held-out batches, and so does the report after it: the
    baselines and the NSP line read them once (before: once each)."""
    from lmsuite.training import input_pipeline

    reads = []
    build = input_pipeline.eval_dataset

    def counted(**kwargs):
        def count(batch):
            ids = tf.numpy_function(
                lambda x: (reads.append(1), x)[1], [batch["input_ids"]], tf.int32
            )
            ids.set_shape(batch["input_ids"].shape)
            return {**batch, "input_ids": ids}

        return build(**kwargs).map(count)

    monkeypatch.setattr(input_pipeline, "eval_dataset", counted)
    argv = ["pretrain", "--gin_file=experiments/bert_tiny.gin", f"--model_dir={tmp_path}"]
    flags = ["TRAIN_STEPS=2", "WARMUP_STEPS=1", "CHECKPOINT_EVERY=2", "train.eval_every=2"]
    flags += ["train.eval_batches=2"]
    code = cli.main([*argv, *(f"--gin.{f}" for f in flags), "--gin.train.progress_bar=False"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "held-out sentence accuracy" in out, out
    assert len(reads) == 2 * 2  # the run's evaluation read its 2 batches, the report read them


def _assert_fill_mask_section(out: str) -> None:
    """Three held-out wiki_sample sentences, each with one [MASK], the true word and three
    predictions with probabilities."""
    from lmsuite.data import corpora

    lines = out.splitlines()
    start = lines.index("fill-mask on held-out wiki_sample sentences (validation split), top 3:")
    section = lines[start + 1 :]
    assert len(section) == 2 * pretrain_report.FILL_MASK_SENTENCES, section
    validation = " ".join(d.text for d in corpora.get_corpus("wiki_sample").documents("validation"))
    for text, answer in zip(section[::2], section[1::2], strict=True):
        assert text.startswith("  ") and text.count("[MASK]") == 1, text
        found = re.fullmatch(r"    true: ([a-z]+)   predicted: (.*)", answer)
        assert found, answer
        assert text.strip().replace("[MASK]", found[1]) in validation  # held-out, unchanged
        scores = [float(x) for x in re.findall(r" (\d\.\d{3})(?=  |$)", found[2])]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True), answer
        assert all(0.0 <= x <= 1.0 for x in scores), answer


def test_fill_mask_masks_the_longest_one_piece_content_word_of_sentences_of_usable_length():
    sentences = [
        "Too short to use here .",
        "Paris is where the government of France sits , with its ministries .",
        "It is about that which there would have been with them .",  # function words only
        "It is the capital of a small province in the north of Spain .",
        "One more sentence that is long enough but comes after the first two found .",
    ]
    examples = pretrain_report.masked_examples(
        sentences, is_one_piece=lambda word: word != "government", n=2, mask_token="[MASK]"
    )
    assert examples == [
        ("Paris is where the government of France sits , with its [MASK] .", "ministries"),
        ("It is the capital of a small [MASK] in the north of Spain .", "province"),
    ]


def test_no_fill_mask_lines_for_a_model_without_an_mlm_head():
    kwargs = cli.load_config(
        cli.parse_args(["train", "--gin_file=experiments/t5_1_1_tiny.gin", "--model_dir=/unused"])
    )
    assert "mlm" not in kwargs["model_config"].heads
    # nothing loaded: /unused is not a run
    assert pretrain_report.fill_mask_text(kwargs, "/unused") == []


def test_config_loads_again_beside_a_directory_named_like_an_include(tmp_path, monkeypatch):
    """`make pretrain` writes runs/default in the working directory; gin then took `runs` for
    a Python package while resolving `include 'runs/pretrain.gin'` and crashed on the next
    parse. Both parses must succeed and agree."""
    import importlib

    (tmp_path / "runs" / "default").mkdir(parents=True)
    (tmp_path / "experiments").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    args = cli.parse_args(["train", SMOKE, "--model_dir=runs/default"])
    first = cli.load_config(args)
    second = cli.load_config(args)
    assert first["train_steps"] == second["train_steps"] == 30


def test_the_rtd_line_counts_held_out_tokens_against_the_larger_class():
    from lmsuite.training import recipes, report

    class HeldOut:
        def as_numpy_iterator(self):
            yield {"input_mask": np.array([[1, 1, 1, 0], [1, 1, 0, 0]])}
            yield {"input_mask": np.array([[1, 1, 1, 1], [1, 0, 0, 0]])}

    held = {"eval/rtd_accuracy": 0.9, "eval/replaced_fraction": 0.2}
    (line,) = pretrain_report.label_lines(recipes.get("electra").objective, held, HeldOut())
    p = report.binomial_upper_tail(9, 10, 0.8)  # 10 real tokens, 9 right, always-real 0.8
    assert line == (
        f"held-out rtd accuracy: 0.9000 over 10 tokens (always the larger class: 0.8000; "
        f"binomial p = {p:.2g})"
    )
