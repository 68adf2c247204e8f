"""`lmsuite train` as a new user meets it: each problem the shipped gin files showed on a fresh
clone, through the CLI (the recipes issue, point 6), and the run's problems listed before any
compile (bad recipes, models, lengths, task modules)."""

import json
import statistics
import sys
import textwrap

import pytest
import seqio

from lmsuite import cli
from tests.training import cli_errors

SMOKE = "--gin_file=experiments/smoke.gin"
SPAN = "--gin.RECIPE='t5_span_corruption'"
SPAN_TASK = "--gin.TASK='wiki_sample_t5_span_corruption'"


def _fails(capsys, tmp_path, *argv) -> tuple[list[str], str]:
    """Runs `lmsuite train` that must stop with configuration errors; (the errors, stderr)."""
    code = cli.main(["train", *argv, f"--model_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == cli.CONFIG_ERROR_EXIT_CODE, err[-3000:]
    assert not (tmp_path / "run").exists()  # nothing ran
    return cli_errors.problem_lines(err), err


@pytest.fixture(scope="module", autouse=True)
def _warm_imports():
    cli.register_configurables()
    import lmsuite.data.tasks  # noqa: F401


def _t5(*extra):
    return [
        "--gin_file=models/t5_1_1_tiny.gin",
        "--gin_file=runs/pretrain.gin",
        "--gin.ModelConfig.vocab_size=8100",
        "--gin.TRAIN_STEPS=2",
        "--gin.BATCH_SIZE=8",
        *extra,
    ]


# ------------------------------------------------------------------ the fresh-clone findings
def test_a_model_vocabulary_smaller_than_the_tasks_is_refused_naming_both(capsys, tmp_path):
    # Every lmsuite/gin/models/*_tiny.gin has vocab_size 512; the wiki_sample tasks emit 8,100 ids.
    errors, _ = _fails(
        capsys,
        tmp_path,
        "--gin_file=models/bert_tiny.gin",
        "--gin_file=runs/pretrain.gin",
        "--gin.RECIPE='bert_mlm_nsp'",
        "--gin.TASK='wiki_sample_bert_mlm_nsp'",
        "--gin.SEQUENCE_LENGTH={'input_ids': 64, 'masked_ids': 10}",
        "--gin.TRAIN_STEPS=2",
        "--gin.BATCH_SIZE=8",
    )
    assert len(errors) == 1, errors
    assert "ModelConfig.vocab_size = 512" in errors[0] and "(8100 ids)" in errors[0]
    assert "--gin.ModelConfig.vocab_size=8100" in errors[0]


def test_nan_before_any_checkpoint_says_there_is_none(capsys, tmp_path):
    code = cli.main(
        [
            "train",
            SMOKE,
            f"--model_dir={tmp_path / 'run'}",
            "--gin.SCHEDULE='constant'",
            "--gin.LEARNING_RATE=1e30",
        ]
    )
    err = capsys.readouterr().err
    assert code == 3, err[-3000:]
    assert "No checkpoint had been written yet" in err
    assert "last good checkpoint is step 0" not in err


# slow: a 100-step timing check, meaningless on a loaded machine
@pytest.mark.slow
def test_logged_rates_are_steady_to_the_last_step(capsys, tmp_path):
    """A 100-step run logging every step once read 5,108 steps/s (and MFU 6.9) at its last step:
    each window ended when the host read a step, which lags the step by the host's own work."""
    code = cli.main(["train", SMOKE, f"--model_dir={tmp_path}", "--gin.TRAIN_STEPS=100"])
    assert code == 0, capsys.readouterr().err[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    rates = {r["step"]: r["steps_per_sec"] for r in records if "steps_per_sec" in r}
    assert sorted(rates) == list(range(1, 101))
    median = statistics.median(rates[s] for s in range(2, 101))
    outliers = {s: round(r) for s, r in rates.items() if s > 1 and not median / 3 < r < 3 * median}
    assert not outliers, (round(median), outliers)
    assert all(r["mfu"] < 1.0 for r in records if "mfu" in r)


def test_rate_window_spans_seconds_not_one_lagging_read():
    from lmsuite.training.loop import RateWindow

    window, now, rates = RateWindow(0.0), 5.0, []  # 5 s of compilation, then 0.1 s steps
    for step in range(1, 80):
        window.add(now + (0.09 if step == 30 else 0.0), 10.0)  # step 30 read 0.09 s late
        rates.append(window.rates())
        now += 0.1
    assert rates[0][0] == pytest.approx(1 / 5.0)  # the first log includes compilation
    steps_per_sec = [r[0] for r in rates[1:]]
    assert min(steps_per_sec) > 9.5 and max(steps_per_sec) < 10.5, steps_per_sec
    assert rates[-1][1] == pytest.approx(100.0)  # 10 tokens per step
    assert len(window._points) <= 22  # points older than the span are dropped


def test_train_ends_with_a_summary_on_stdout(capsys, tmp_path):
    code = cli.main(["train", SMOKE, f"--model_dir={tmp_path}", "--gin.TRAIN_STEPS=6"])
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "lmsuite train: step 6 of 6 on 'wiki_sample_bert_mlm' with recipe 'bert_mlm'"
    final = next(line for line in lines if "final train:" in line)
    held_out = next(line for line in lines if "held-out (validation):" in line)
    assert "mlm_accuracy" in final and "mlm_accuracy" in held_out
    eval_record = [json.loads(x) for x in (tmp_path / "metrics.jsonl").open()][-1]
    assert f"loss {eval_record['eval/loss']:.4f}" in held_out
    assert f"{tmp_path}/checkpoints (steps 6)" in out
    for artefact in ("metrics.jsonl", "config.gin"):
        assert f"{tmp_path}/{artefact}" in out and (tmp_path / artefact).is_file()


def test_a_task_typo_is_listed_with_binding_typos(capsys, tmp_path):
    errors, _ = _fails(
        capsys, tmp_path, SMOKE, "--gin.TASK='wiki_sample_bert_mlmm'", "--gin.train.batch_sz=3"
    )
    assert len(errors) == 2, errors
    assert "did you mean 'batch_size'" in errors[0]
    assert "unknown task 'wiki_sample_bert_mlmm'; did you mean 'wiki_sample_bert_mlm'" in errors[1]


def test_zero_train_steps_does_not_hide_a_batch_the_mesh_does_not_divide(capsys, tmp_path):
    errors, _ = _fails(
        capsys,
        tmp_path,
        SMOKE,
        "--gin.TRAIN_STEPS=0",
        "--gin.BATCH_SIZE=7",
        "--gin.MESH_SHAPE=(2, 1, 1)",
    )
    # TRAIN_STEPS is also the schedule's total_steps: one value, named once
    assert sum("got 0" in e or "total_steps=0" in e for e in errors) == 1, errors
    assert any("train_steps must be >= 1, got 0" in e for e in errors), errors
    assert any(
        "batch_size 7 is not divisible by the batch axes data*fsdp = 2*1" in e for e in errors
    )


def test_a_production_task_without_tfds_data_says_how_to_prepare_it(capsys, tmp_path):
    errors, err = _fails(
        capsys,
        tmp_path,
        *_t5(SPAN, "--gin.TASK='c4_t5_span_corruption'", "--gin.ModelConfig.vocab_size=32128"),
        "--gin.SEQUENCE_LENGTH={'inputs': 64, 'targets': 16}",
        f"--tfds_data_dir={tmp_path / 'tfds'}",
    )
    assert len(errors) == 1, errors
    assert "'c4/en:3.1.0', which is not prepared" in errors[0]
    assert str(tmp_path / "tfds") in errors[0] and "tfds build c4/en:3.1.0" in errors[0]
    assert "default production vocabulary (wiki_sample, 8100 ids)" in err
    assert "ModelConfig.vocab_size = 32128" in err


def test_help_names_the_gin_flags(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    out = capsys.readouterr().out
    assert "--gin.KEY=VALUE" in out and "--task_module" in out and "--tfds_data_dir" in out


# ------------------------------------------------------------- a user's own task module
TASK_MODULE = """
    import functools

    import seqio
    import tensorflow as tf

    from lmsuite.data import corpora, tasks, tokenization, vocab
    from lmsuite.data.preprocessors import span_corruption

    VOCAB = tasks.default_vocabulary("wiki_sample")

    def shout(dataset):
        # The user's own preprocessor: upper-case every document before tokenizing.
        return dataset.map(lambda ex: {**ex, "text": tf.strings.upper(ex["text"])})

    def corrupt(dataset, sequence_length):
        sentinels = vocab.special_ids(VOCAB).sentinels
        return span_corruption.span_corruption(
            dataset, sequence_length=sequence_length, sentinel_ids=sentinels
        )

    seqio.TaskRegistry.remove("my_loud_span_corruption")
    seqio.TaskRegistry.add(
        "my_loud_span_corruption",
        source=corpora.get_corpus("wiki_sample").source(),
        preprocessors=[
            shout,
            functools.partial(tokenization.tokenize_documents, vocab=VOCAB),
            corrupt,
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=tasks.output_features(tasks.SEQ2SEQ, VOCAB),
    )
    seqio.TaskRegistry.remove("my_lm_only")
    seqio.TaskRegistry.add(
        "my_lm_only",
        source=corpora.get_corpus("wiki_sample").source(),
        preprocessors=[functools.partial(tokenization.tokenize_documents, vocab=VOCAB)],
        output_features=tasks.output_features(tasks.DECODER, VOCAB),
    )
"""


@pytest.fixture
def task_module(tmp_path, monkeypatch):
    package = tmp_path / "my_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text(textwrap.dedent(TASK_MODULE))
    (package / "broken.py").write_text("import not_a_module_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # Each test starts with the module not imported and its tasks not registered, so that a
    # test passes only if its own flag or gin line imported them.
    for name in [m for m in sys.modules if m == "my_pkg" or m.startswith("my_pkg.")]:
        monkeypatch.delitem(sys.modules, name)
    for task in ("my_loud_span_corruption", "my_lm_only"):
        seqio.TaskRegistry.remove(task)
    return "my_pkg.tasks"


def test_a_users_task_module_trains_with_an_existing_recipe(capsys, tmp_path, task_module):
    argv = _t5(SPAN, "--gin.TASK='my_loud_span_corruption'", "--gin.train.progress_bar=False")
    argv += ["--gin.SEQUENCE_LENGTH={'inputs': 64, 'targets': 16}", "--gin.train.eval_batches=1"]
    code = cli.main(["train", *argv, f"--task_module={task_module}", f"--model_dir={tmp_path}/a"])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    assert "on 'my_loud_span_corruption' with recipe 't5_span_corruption'" in captured.out
    records = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").open()]
    assert [r["step"] for r in records if "seq2seq_accuracy" in r] == [2]


def test_tasks_list_sees_a_task_module(capsys, task_module):
    assert cli.main(["tasks", "list"]) == 0
    assert "my_loud_span_corruption" not in capsys.readouterr().out.splitlines()
    assert cli.main(["tasks", "list", "--task_module", task_module]) == 0
    assert "my_loud_span_corruption" in capsys.readouterr().out.splitlines()


# slow: the fast suite keeps a user's --task_module training with an existing recipe
@pytest.mark.slow
def test_a_gin_import_line_registers_the_task_too(capsys, tmp_path, task_module):
    gin_file = tmp_path / "mine.gin"
    gin_file.write_text(f"import {task_module}\n")
    argv = _t5(SPAN, "--gin.TASK='my_loud_span_corruption'", "--gin.train.progress_bar=False")
    argv += ["--gin.SEQUENCE_LENGTH={'inputs': 64, 'targets': 16}", "--gin.TRAIN_STEPS=1"]
    argv += [f"--gin_file={gin_file}", "--gin.train.eval_batches=1"]
    code = cli.main(["train", *argv, f"--model_dir={tmp_path}/b"])
    assert code == 0, capsys.readouterr().err[-3000:]


# ------------------------------------------------------------------------ bad input
def test_a_task_module_that_does_not_import_is_named(capsys, tmp_path, task_module):
    errors, _ = _fails(
        capsys, tmp_path, SMOKE, "--task_module=my_pkg.broken", "--task_module=my_pkg.missing"
    )
    assert len(errors) == 2, errors
    assert "--task_module=my_pkg.broken: does not import: ModuleNotFoundError" in errors[0]
    assert "not_a_module_anywhere" in errors[0] and "broken.py:1" in errors[0]
    assert "--task_module=my_pkg.missing: does not import" in errors[1]


def test_a_task_without_the_recipes_features_is_refused(capsys, tmp_path, task_module):
    errors, _ = _fails(
        capsys,
        tmp_path,
        *_t5(
            SPAN, "--gin.TASK='my_lm_only'", "--gin.SEQUENCE_LENGTH={'inputs': 64, 'targets': 16}"
        ),
        f"--task_module={task_module}",
    )
    assert len(errors) == 1, errors
    assert "recipe 't5_span_corruption' needs task features ['inputs']" in errors[0]
    assert "'my_lm_only'" in errors[0]


def test_a_known_task_of_another_objective_points_at_its_recipe(capsys, tmp_path):
    # gin/objectives/bert_mlm_nsp.gin once claimed to serve *_albert_sop tasks.
    errors, _ = _fails(
        capsys,
        tmp_path,
        SMOKE,
        "--gin.RECIPE='bert_mlm_nsp'",
        "--gin.TASK='wiki_sample_albert_sop'",
        "--gin.ModelConfig.heads=('mlm', 'classifier')",
    )
    assert len(errors) == 1, errors
    assert (
        "'wiki_sample_albert_sop' is a 'albert_sop' task; recipe(s) ['albert_sop', "
        "'mlm_multitask'] train it" in errors[0]
    )


def test_an_encoder_with_a_seq2seq_recipe_is_refused(capsys, tmp_path):
    errors, _ = _fails(
        capsys,
        tmp_path,
        SMOKE,
        SPAN,
        SPAN_TASK,
        "--gin.SEQUENCE_LENGTH={'inputs': 64, 'targets': 16}",
    )
    assert any(
        "needs ModelConfig.architecture in ['encoder_decoder'], got 'encoder'" in e for e in errors
    ), errors
    assert any("needs model heads ['lm']" in e for e in errors), errors


def test_sequence_lengths_with_the_wrong_keys_are_refused(capsys, tmp_path):
    errors, _ = _fails(
        capsys, tmp_path, *_t5(SPAN, SPAN_TASK, "--gin.SEQUENCE_LENGTH={'input_ids': 64}")
    )
    assert len(errors) == 1, errors
    assert "needs sequence_length keys ['inputs', 'targets'], got ['input_ids']" in errors[0]
    assert "missing ['inputs', 'targets'], unexpected ['input_ids']" in errors[0]


def test_span_corruption_lengths_that_do_not_fit_name_t5s_helper(capsys, tmp_path):
    errors, _ = _fails(
        capsys,
        tmp_path,
        *_t5(SPAN, SPAN_TASK, "--gin.SEQUENCE_LENGTH={'inputs': 512, 'targets': 100}"),
        "--gin.ModelConfig.max_length=512",
    )
    assert len(errors) == 1, errors
    assert "targets length 100 < 114" in errors[0] and "random_spans_helper" in errors[0]
    assert "{'inputs': 512, 'targets': 114}" in errors[0]
