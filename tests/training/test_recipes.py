"""The recipe table: consistent with the tasks, converters, losses and models it names, and every
row trains for two steps through the real CLI path (gin, task, converter, loss, step)."""

import json
import math
import pathlib

import pytest

from lmsuite import cli
from lmsuite.data import mixtures, tasks
from lmsuite.training import (
    decoder_recipes,
    encoder_recipes,
    preflight,
    recipe_table,
    recipes,
    seq2seq_recipes,
)

VOCAB = 8100  # the wiki_sample vocabulary: 8000 pieces + 100 sentinels
TINY_MODELS = [
    "bert_tiny",
    "roberta_tiny",
    "albert_tiny",
    "electra_tiny_generator",
    "deberta_tiny",
    "deberta_v3_tiny",
    "gpt2_tiny",
    "t5_tiny",
    "t5_1_1_tiny",
    "bart_tiny",
]


def model_config(name: str, bindings=()):
    return cli.model_config_from_gin([f"models/{name}.gin"], list(bindings))


def train_task(recipe: recipes.Recipe) -> str:
    """The row's own mixture on wiki_sample where one is registered (`wiki_sample_ul2`: its
    denoisers with per-task metrics), else the task of its first objective."""
    mixture = f"wiki_sample_{recipe.name}"
    return mixture if mixtures.is_mixture(mixture) else f"wiki_sample_{recipe.task_objectives[0]}"


def train_argv(recipe: recipes.Recipe, model: str, model_dir, *extra: str) -> list[str]:
    """`lmsuite train` for two steps of `recipe` on wiki_sample with the tiny `model`."""
    bindings = [b.replace(" = ", "=") for b in recipe.example_bindings]
    return [
        "train",
        f"--gin_file=models/{model}.gin",
        "--gin_file=runs/pretrain.gin",
        f"--model_dir={model_dir}",
        f"--gin.RECIPE='{recipe.name}'",
        f"--gin.TASK='{train_task(recipe)}'",
        f"--gin.SEQUENCE_LENGTH={recipe.lengths_for(64)}",
        "--gin.TRAIN_STEPS=2",
        "--gin.BATCH_SIZE=8",
        "--gin.CHECKPOINT_EVERY=2",
        f"--gin.ModelConfig.vocab_size={VOCAB}",
        "--gin.train.log_every=1",
        "--gin.train.eval_batches=1",
        "--gin.train.progress_bar=False",
        *[f"--gin.{b}" for b in bindings],
        *extra,
    ]


def compatible(recipe: recipes.Recipe, model: str) -> bool:
    config = model_config(model, recipe.example_bindings if model == recipe.example_model else ())
    return not preflight.recipe_run_problems(recipe, sequence_length=None, model_config=config)


# ------------------------------------------------------------------------------ the table
def test_every_task_objective_has_a_recipe_or_says_why_not():
    trained = [o for r in recipes.RECIPES.values() for o in r.task_objectives]
    # An objective with two rows trains on two architectures (prefix LM: decoder-only and
    # encoder-decoder), never twice on one; a multi-task row (label heads) trains the objectives
    # of its mixture beside their own rows.
    seen = {}
    for recipe in recipes.RECIPES.values():
        if recipe.objective.label_heads:
            assert set(recipe.task_objectives) <= set(tasks.OBJECTIVES)
            continue
        for objective in recipe.task_objectives:
            for architecture in recipe.architectures:
                assert (objective, architecture) not in seen, (recipe.name, seen)
                seen[(objective, architecture)] = recipe.name
    assert set(trained) | set(recipes.DATA_ONLY) == set(tasks.OBJECTIVES)
    assert not set(trained) & set(recipes.DATA_ONLY)
    assert all(d.reason for d in recipes.DATA_ONLY.values())


def test_the_table_holds_every_row_of_the_family_modules_once():
    """A row written in its family's module but not listed in `RECIPES` would train nowhere."""
    rows = [
        row
        for module in (encoder_recipes, seq2seq_recipes, decoder_recipes)
        for row in vars(module).values()
        if isinstance(row, recipes.Recipe)
    ]
    assert len(rows) == len(recipes.RECIPES)
    assert all(recipes.RECIPES[row.name] is row for row in rows)


@pytest.mark.parametrize("name", list(recipes.RECIPES))
def test_row_is_consistent_with_its_converter_loss_and_model(name):
    """The row's own facts; what its loss declares is held to the row in
    `test_objective_contracts.py`."""
    recipe = recipes.RECIPES[name]
    converter = recipe.converter(pack=recipe.pack)
    assert set(converter.TASK_FEATURES) <= set(recipe.task_features)
    assert sorted(recipe.lengths_for(64)) == sorted(recipe.length_keys)
    assert set(recipes.make_recipe(name=name).loss_options) <= set(recipes.loss_parameters(recipe))
    config = model_config(recipe.example_model, recipe.example_bindings)
    assert (
        preflight.recipe_run_problems(
            recipe, sequence_length=recipe.lengths_for(64), model_config=config
        )
        == []
    )
    for objective in recipe.task_objectives:
        assert tasks.OBJECTIVES[objective]  # a real task objective


def test_table_prints_every_row_and_every_data_only_objective(capsys):
    assert cli.main(["recipes", "list"]) == 0
    out = capsys.readouterr().out
    for name in (*recipes.RECIPES, *recipes.DATA_ONLY):
        assert f"\n{name} " in f"\n{out}" or f"  {name} " in out, name
    assert cli.main(["recipes", "show", "t5_span_corruption"]) == 0
    shown = capsys.readouterr().out
    assert "EncDecFeatureConverter(pack=True)" in shown
    assert "lmsuite.objectives.seq2seq.seq2seq(" in shown
    assert "RECIPE = 't5_span_corruption'" in shown
    assert cli.main(["recipes", "show", "t5_span_coruption"]) == cli.CONFIG_ERROR_EXIT_CODE
    assert "did you mean 't5_span_corruption'" in capsys.readouterr().err
    assert recipe_table.format_recipe(recipes.RECIPES["mass"]).count("cross_attention_ignores") == 2


def test_unknown_rows_and_loss_options_are_named(monkeypatch):
    with pytest.raises(ValueError, match="unknown recipe 'electr'.*did you mean 'electra'"):
        recipes.make_recipe(name="electr")
    pending = recipes.DataOnly("pending", "needs a loss", None, None)
    monkeypatch.setitem(recipes.DATA_ONLY, "pending", pending)
    with pytest.raises(ValueError, match="unknown recipe 'pending'.*data-only: needs a loss"):
        recipes.make_recipe(name="pending")
    with pytest.raises(ValueError, match=r"\['z_los'\].*expected some of .*'z_loss'"):
        recipes.make_recipe(name="t5_span_corruption", loss_options={"z_los": 0.0})
    with pytest.raises(ValueError, match="cannot pack"):
        recipes.make_recipe(name="bert_mlm_nsp", pack=True)


@pytest.mark.parametrize("name", sorted(recipes.RECIPES))
def test_a_choice_comes_back_from_its_run_json_record(name):
    """run.json's record of the row's options (through JSON text, as `lmsuite eval` reads it)
    rebuilds the same choice: SpanBERT's boundary ids come back a tuple, MASS's options, a
    changed packing and task weights survive; None is the row with its defaults."""
    recipe = recipes.RECIPES[name]
    changed = {"pack": not recipe.pack} if (recipe.pack or recipe.can_pack()) else {}
    if recipe.task_ids_along:
        changed["task_weights"] = {"wiki_sample_a": 0.5}
    for choice in (recipes.make_recipe(name=name), recipes.make_recipe(name=name, **changed)):
        record = json.loads(json.dumps(choice.to_json()))
        assert "unrecorded" not in record
        assert recipes.choice_from_json(name, record) == choice
    assert recipes.choice_from_json(name, None) == recipes.make_recipe(name=name)


def test_a_loss_option_json_cannot_hold_is_kept_by_name():
    choice = recipes.make_recipe(name="bert_mlm", loss_options={"sentence_label": len})
    record = choice.to_json()
    assert record["loss_options"] == {} and record["unrecorded"] == {"sentence_label": repr(len)}
    assert recipes.choice_from_json("bert_mlm", record).loss_options == {}


# ----------------------------------------------------------------------------- the matrix
def _check_trained(model_dir, recipe):
    records = [json.loads(line) for line in (model_dir / "metrics.jsonl").open()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for record in steps:
        for metric in ("loss", *recipe.objective.metrics):
            assert metric in record, f"{recipe.name}: step {record['step']} lacks {metric}"
            assert math.isfinite(record[metric]), (recipe.name, metric, record[metric])
    assert steps[0]["loss"] > 0
    held_out = [r for r in records if "eval/loss" in r]
    assert held_out and all(f"eval/{m}" in held_out[-1] for m in recipe.objective.metrics)
    for task in mixtures.task_names(train_task(recipe)):  # a mixture's per-task metrics
        assert math.isfinite(held_out[-1][f"eval/seq2seq_share/{task}"]), (recipe.name, task)
    assert (model_dir / "checkpoints" / "2").is_dir()


# Rows the fast suite leaves to `make test-all`, each trained end to end elsewhere in it: by another
# fast test through `lmsuite train` (or the `lmsuite.train` it calls), or as a fast row of this
# matrix of the same row type on the same model. The check below keeps these claims true.
TRAINED_BY_TEST = {
    "bert_mlm": ("tests/training/test_train_cli.py", "test_train_ends_with_a_summary_on_stdout"),
    "bert_mlm_nsp": (
        "tests/training/test_study_cli.py",
        "test_a_killed_study_resumes_without_redoing_finished_runs",
    ),
    "ernie2": ("tests/evaluation/test_evaluate.py", "ernie2_run"),  # on its four-task mixture
    "causal_lm": (
        "tests/evaluation/test_load.py",
        "test_a_scanned_run_loads_unscanned_and_decodes",
    ),
    "t5_span_corruption": (
        "tests/training/test_text_files_cli.py",
        "test_a_t5_run_on_text_files_reopens_from_its_run_json",
    ),
    "xlnet_plm": ("tests/integration/test_faults.py", "test_xlnet_losses_depend_on_the_memory"),
}
# i.i.d. denoising differs from the prefix LM only in its data (tests/data/test_span_corruption.py)
TRAINED_BY_ROW = {"iid_denoising": "prefix_lm"}
SLOW_ROWS = {*TRAINED_BY_TEST, *TRAINED_BY_ROW}


def test_rows_left_to_the_slow_suite_are_trained_by_a_fast_test():
    root = pathlib.Path(__file__).parents[2]
    for name, (path, test) in TRAINED_BY_TEST.items():
        assert name in recipes.RECIPES, name
        source = (root / path).read_text()
        assert f"\ndef {test}(" in source, (name, path, test)
        decorators = source.split(f"\ndef {test}(")[0].rsplit("\n\n", 1)[-1]
        assert "mark.slow" not in decorators, f"{path}::{test} runs in the slow suite only"
    for name, row in TRAINED_BY_ROW.items():
        slow, fast = recipes.RECIPES[name], recipes.RECIPES[row]
        assert row not in SLOW_ROWS
        assert (slow.example_model, slow.loss, slow.architectures) == (
            fast.example_model,
            fast.loss,
            fast.architectures,
        )


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.slow) if name in SLOW_ROWS else name
        for name in recipes.RECIPES
    ],
)
def test_every_recipe_trains_two_steps_through_the_cli(name, tmp_path, capsys):
    recipe = recipes.RECIPES[name]
    code = cli.main(train_argv(recipe, recipe.example_model, tmp_path / "run"))
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    _check_trained(tmp_path / "run", recipe)
    assert f"with recipe {name!r}" in captured.out


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, model",
    [
        (name, model)
        for name, recipe in recipes.RECIPES.items()
        for model in TINY_MODELS
        if model != recipe.example_model
    ],
)
def test_every_recipe_trains_on_every_compatible_tiny_model(name, model, tmp_path, capsys):
    recipe = recipes.RECIPES[name]
    if not compatible(recipe, model):
        pytest.skip(f"{model} lacks the architecture or heads of {name}")
    argv = [a for a in train_argv(recipe, model, tmp_path / "run") if "architecture" not in a]
    code = cli.main(argv)
    assert code == 0, capsys.readouterr().err[-3000:]
    _check_trained(tmp_path / "run", recipe)
