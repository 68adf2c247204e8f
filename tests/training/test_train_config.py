"""The run config: bad values are named with what was expected, the run is checked once, a run
built in Python equals the one gin builds from the same settings, and `lmsuite.train` writes the
run.json that `lmsuite.load` reads."""

import json
import subprocess
import sys

import pytest

import lmsuite
from lmsuite import cli
from lmsuite.cli import gin_run
from lmsuite.models import ModelConfig
from lmsuite.training import preflight, recipes
from lmsuite.training.train_config import (
    CheckpointConfig,
    DataConfig,
    InvalidRunError,
    OptimizerConfig,
    ScheduleConfig,
    TrainConfig,
    TrainerConfig,
)

SMOKE_STEPS = 3


def _smoke(model_dir, **trainer) -> TrainConfig:
    """experiments/smoke.gin written in Python (models/bert_tiny.gin's BERT, cut smaller)."""
    model = ModelConfig(
        architecture="encoder",
        vocab_size=8100,
        max_length=128,
        type_vocab_size=2,
        position_type="learned",
        activation="gelu",
        norm_type="layernorm",
        norm_eps=1e-12,
        norm_position="post",
        heads=("mlm",),
        dropout_rate=0.1,
        attention_dropout_rate=0.1,
        d_model=32,
        num_heads=2,
        d_ff=64,
        num_layers=2,
    )
    return TrainConfig(
        data=DataConfig(
            task="wiki_sample_bert_mlm",
            sequence_length={"input_ids": 64, "masked_ids": 10},
            batch_size=8,
            input_threads=1,
        ),
        model=model,
        recipe="bert_mlm",
        optimizer=OptimizerConfig(
            name="adamw",
            learning_rate=ScheduleConfig(
                name="linear", peak_value=1e-3, warmup_steps=2, total_steps=SMOKE_STEPS
            ),
            weight_decay=0.01,
        ),
        trainer=TrainerConfig(
            train_steps=SMOKE_STEPS, log_every=1, progress_bar=False, seed=0, **trainer
        ),
        checkpointing=CheckpointConfig(model_dir=str(model_dir), every=10, keep=3),
    )


def _from_gin(model_dir) -> TrainConfig:
    return lmsuite.run_from_gin(
        "experiments/smoke.gin",
        model_dir=str(model_dir),
        bindings={"TRAIN_STEPS": SMOKE_STEPS, "WARMUP_STEPS": 2},
    )


def test_a_python_built_run_equals_the_gin_built_one(tmp_path):
    python = _smoke(tmp_path / "run")
    gin_built = _from_gin(tmp_path / "run")
    for group in ("data", "model", "recipe", "optimizer", "trainer", "checkpointing"):
        assert getattr(python, group) == getattr(gin_built, group), group
    assert python == gin_built
    assert (
        python.operative_config is None and "ModelConfig.d_model = 32" in gin_built.operative_config
    )
    # A different setting is a different run.
    assert python != python.replace(trainer=python.trainer.replace(seed=1))


def test_bad_values_are_each_named_with_what_was_expected(tmp_path):
    (tmp_path / "a_file").write_text("")
    good = _smoke(tmp_path / "run")
    bad = good.replace(
        data=good.data.replace(
            batch_size=0,
            input_sharding="sideways",
            sequence_length={"input_ids": 64},
            input_nice=-1,
        ),
        trainer=good.trainer.replace(mesh_shape=(2, 1), log_every=0, train_steps=0),
        checkpointing=good.checkpointing.replace(
            model_dir=str(tmp_path / "a_file"), keep=0, nice="19"
        ),
    )
    with pytest.raises(InvalidRunError) as error:
        bad.validate()
    problems = error.value.problems
    expected = [
        "data.batch_size must be an integer >= 1, got 0",
        "data.input_sharding must be one of ('source', 'replicated'), got 'sideways'",
        "data.input_nice must be an integer in [0, 19], got -1",
        "trainer.mesh_shape must be three integers (data, fsdp, tensor; one may be -1), got (2, 1)",
        "trainer.log_every must be an integer >= 1, got 0",
        "checkpointing.model_dir",  # names the file: a run is a directory
        "checkpointing.keep must be an integer >= 1, got 0",
        "checkpointing.nice must be an integer in [0, 19], got '19'",
        "needs sequence_length keys ['input_ids', 'masked_ids'], got ['input_ids']",
        "train_steps must be >= 1, got 0",
    ]
    for text in expected:
        assert sum(text in p for p in problems) == 1, (text, problems)
    assert len(problems) == len(expected), problems
    assert str(tmp_path / "a_file") in next(p for p in problems if "model_dir" in p)
    assert str(error.value).startswith("this run cannot start:")


def test_groups_refuse_bad_names_and_wrong_types_when_made(tmp_path):
    with pytest.raises(ValueError, match=r"optimizer name must be one of .*got 'adamx'"):
        OptimizerConfig(name="adamx", learning_rate=1e-3)
    with pytest.raises(ValueError, match=r"schedule name must be one of .*got 'exp'"):
        ScheduleConfig(name="exp", peak_value=1.0)
    with pytest.raises(ValueError, match=r"warmup_steps=20, total_steps=10"):
        ScheduleConfig(peak_value=1.0, warmup_steps=20, total_steps=10)
    with pytest.raises(ValueError, match=r"unknown recipe 'bert_mlmm'; did you mean 'bert_mlm'"):
        _smoke(tmp_path).replace(recipe="bert_mlmm")
    with pytest.raises(TypeError, match=r"TrainConfig.optimizer must be a OptimizerConfig, got"):
        _smoke(tmp_path).replace(optimizer={"name": "adamw"})


def test_a_schedule_that_spans_the_run_is_checked_against_its_steps(tmp_path):
    run = _smoke(tmp_path)
    spans_run = run.optimizer.learning_rate.replace(total_steps=None, warmup_steps=5)
    run = run.replace(optimizer=run.optimizer.replace(learning_rate=spans_run))
    with pytest.raises(InvalidRunError) as error:
        run.validate()
    assert error.value.problems == [
        "optimizer.learning_rate over trainer.train_steps: need 0 <= warmup_steps <= "
        f"total_steps and total_steps > 0, got warmup_steps=5, total_steps={SMOKE_STEPS}"
    ]
    longer = run.replace(trainer=run.trainer.replace(train_steps=10))
    assert longer.validate().problems == []
    _, schedule = longer.optimizer.build(train_steps=10)
    assert float(schedule(10)) == 0.0 < float(schedule(9))  # it decays to 0 at the last step


def test_the_run_is_checked_once(tmp_path, monkeypatch):
    calls = []
    check_run = preflight.check_run
    monkeypatch.setattr(preflight, "check_run", lambda **kw: calls.append(kw) or check_run(**kw))
    run = _smoke(tmp_path / "run")
    run.validate()
    run.validate()
    assert len(calls) == 1
    other = run.replace(trainer=run.trainer.replace(seed=1))  # a new config is checked anew
    other.validate()
    assert len(calls) == 2


def test_a_learning_rate_fn_other_than_the_optimizers_is_refused(tmp_path):
    run = _smoke(tmp_path)
    arguments = gin_run.train_arguments(run)
    flat = {k: v for k, v in arguments.items() if k not in ("optimizer", "learning_rate_fn")}
    flat["recipe"] = run.recipe
    flat["optimizer"] = run.optimizer
    assert gin_run.train_config(flat, model_dir=str(tmp_path)) == run
    other = run.optimizer.learning_rate.replace(peak_value=0.5)
    with pytest.raises(ValueError, match=r"train.learning_rate_fn .* is not the optimizer's"):
        gin_run.train_config({**flat, "learning_rate_fn": other}, model_dir=str(tmp_path))


def test_lmsuite_train_writes_the_run_json_that_lmsuite_load_reads(tmp_path):
    run = _smoke(tmp_path / "python")
    result = lmsuite.train(run)
    assert (result.step, result.checkpoints) == (SMOKE_STEPS, [SMOKE_STEPS])
    assert result.model_dir == str(tmp_path / "python")
    record = json.loads((tmp_path / "python" / "run.json").read_text())
    assert record == {
        "model_config": json.loads(json.dumps(run.model.to_json())),
        "task": "wiki_sample_bert_mlm",
        "sequence_length": {"input_ids": 64, "masked_ids": 10},
        "recipe": "bert_mlm",
        # what `lmsuite eval` builds the run's own loss from
        "recipe_options": {"pack": False, "loss_options": {}, "task_weights": {}},
        "batch_size": 8,  # the global batch: a resume compares it (resume_checks)
        "task_modules": [],
    }
    assert not (tmp_path / "python" / "config.gin").exists()  # no gin built it
    model = lmsuite.load(str(tmp_path / "python"))
    assert model.config == run.model
    # The same settings through the CLI: the same run.json, the same losses, bit for bit.
    argv = ["train", "--gin_file=experiments/smoke.gin", f"--model_dir={tmp_path / 'cli'}",
            f"--gin.TRAIN_STEPS={SMOKE_STEPS}", "--gin.WARMUP_STEPS=2"]  # fmt: skip
    assert cli.main(argv) == 0
    assert json.loads((tmp_path / "cli" / "run.json").read_text()) == record
    assert "ModelConfig.d_model = 32" in (tmp_path / "cli" / "config.gin").read_text()

    def losses(name):
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if "loss" in r]

    assert losses("python") == losses("cli") and len(losses("cli")) == SMOKE_STEPS


def test_the_recipe_may_be_named_or_chosen(tmp_path):
    named = _smoke(tmp_path)
    chosen = named.replace(recipe=recipes.make_recipe(name="bert_mlm"))
    assert named == chosen and isinstance(named.recipe, recipes.RecipeChoice)


def test_lmsuite_exports_the_training_api_without_importing_jax():
    code = (
        "import sys, lmsuite; print('jax' in sys.modules, "
        "{'train', 'TrainConfig', 'run_from_gin'} <= set(dir(lmsuite)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
    from lmsuite.training import loop

    assert lmsuite.train is loop.train and lmsuite.TrainConfig is TrainConfig
