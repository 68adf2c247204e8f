"""A SeqIO mixture trains under any recipe whose features its tasks carry, with per-task metrics
in training and evaluation (the seed systems issue, point 1)."""

import json

import pytest
import seqio

from lmsuite import cli
from lmsuite.data import mixtures
from lmsuite.training import preflight, recipes

SPAN_LENGTHS = {"inputs": 64, "targets": 16}
MIXTURE = "wiki_sample_seq2seq_mixture"


@pytest.fixture(scope="module", autouse=True)
def _registered():
    cli.register_configurables()
    import lmsuite.data.tasks  # noqa: F401


def test_the_seq2seq_mixture_passes_preflight_under_span_corruption():
    found = preflight.check_run(
        task=MIXTURE,
        recipe=recipes.get("t5_span_corruption"),
        sequence_length=SPAN_LENGTHS,
        model_config=None,
    )
    assert found.problems == [] and found.warnings == []


def test_a_task_whose_own_rows_read_more_is_trained_with_a_warning_naming_what_is_ignored():
    seqio.MixtureRegistry.remove("test_span_mass")
    seqio.MixtureRegistry.add(
        "test_span_mass", [("wiki_sample_t5_span_corruption", 1.0), ("wiki_sample_mass", 1.0)]
    )
    try:
        found = preflight.check_run(
            task="test_span_mass",
            recipe=recipes.get("t5_span_corruption"),
            sequence_length={"inputs": 64, "targets": 32},
            model_config=None,
        )
    finally:
        seqio.MixtureRegistry.remove("test_span_mass")
    assert found.problems == []
    assert len(found.warnings) == 1, found.warnings
    assert "'wiki_sample_mass' is a 'mass' task" in found.warnings[0]
    assert "ignores ['decoder_input_tokens', 'decoder_positions']" in found.warnings[0]


def test_a_task_without_the_rows_features_is_still_refused_by_name():
    found = preflight.check_run(
        task="wiki_sample_causal_lm",
        recipe=recipes.get("t5_span_corruption"),
        sequence_length=SPAN_LENGTHS,
        model_config=None,
    )
    assert len(found.problems) == 1, found.problems
    assert "is a 'causal_lm' task; recipe(s) ['causal_lm'] train it" in found.problems[0]
    assert "lack the row's task features ['inputs']" in found.problems[0]


def test_the_seq2seq_mixture_trains_under_span_corruption_with_per_task_metrics(tmp_path, capsys):
    code = cli.main(
        [
            "train",
            "--gin_file=models/t5_1_1_tiny.gin",
            "--gin_file=runs/pretrain.gin",
            f"--model_dir={tmp_path}",
            "--gin.RECIPE='t5_span_corruption'",
            f"--gin.TASK='{MIXTURE}'",
            f"--gin.SEQUENCE_LENGTH={SPAN_LENGTHS}",
            "--gin.TRAIN_STEPS=2",
            "--gin.BATCH_SIZE=8",
            "--gin.CHECKPOINT_EVERY=2",
            "--gin.ModelConfig.vocab_size=8100",
            "--gin.train.log_every=1",
            "--gin.train.eval_batches=2",  # the identity below holds over batches pooled
            "--gin.train.progress_bar=False",
        ]
    )
    assert code == 0, capsys.readouterr().err[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    tasks = mixtures.task_names(MIXTURE)
    assert len(tasks) == 3
    for prefix in ("", "eval/"):
        record = [r for r in records if f"{prefix}seq2seq_loss" in r][-1]
        shares = [record[f"{prefix}seq2seq_share/{t}"] for t in tasks]
        losses = [record[f"{prefix}seq2seq_loss/{t}"] for t in tasks]
        assert all(s > 0 for s in shares) and sum(shares) == pytest.approx(1.0, abs=1e-5)
        # The whole batch's loss is the share-weighted mean of the tasks' losses.
        mixed = sum(s * loss for s, loss in zip(shares, losses, strict=True))
        assert mixed == pytest.approx(record[f"{prefix}seq2seq_loss"], rel=1e-4)


def test_task_weights_need_a_row_that_carries_task_ids_and_a_mixture():
    with pytest.raises(ValueError, match="recipe 'mass' cannot weigh a mixture's tasks"):
        recipes.make_recipe(name="mass", task_weights={"wiki_sample_mass": 2.0})
    choice = recipes.make_recipe(name="bert_mlm", task_weights={"wiki_sample_wwm": 2.0})
    config = cli.model_config_from_gin(["models/bert_tiny.gin"])
    with pytest.raises(ValueError, match="the run's task is not a mixture"):
        recipes.build(choice, model_config=config)
    built = recipes.build(
        choice, model_config=config, tasks=mixtures.task_names("wiki_sample_encoder_mlm_mixture")
    )
    assert "mlm_loss/wiki_sample_wwm" in built.objective.metrics


def test_the_ul2_mixture_passes_preflight_under_its_row_and_short_targets_are_refused():
    recipe = recipes.get("ul2")
    assert set(recipe.task_objectives) == {t.removeprefix("wiki_sample_") for t in
                                           mixtures.task_names("wiki_sample_ul2")}  # fmt: skip
    found = preflight.check_run(
        task="wiki_sample_ul2",
        recipe=recipe,
        sequence_length=recipe.lengths_for(64),
        model_config=None,
    )
    assert found.problems == [] and found.warnings == []
    found = preflight.check_run(
        task="wiki_sample_ul2", recipe=recipe, sequence_length=SPAN_LENGTHS, model_config=None
    )
    assert any("ul2_x_mu3_r50" in p and "targets length 16" in p for p in found.problems)


STAGES = (
    "[(0, {'wiki_sample_prefix_lm': 1.0}), "
    "(2, {'wiki_sample_prefix_lm': 1.0, 'wiki_sample_t5_span_corruption': 1.0})]"
)


def _staged_argv(model_dir, steps, *extra):
    return [
        "train",
        "--gin_file=models/t5_1_1_tiny.gin",
        "--gin_file=runs/pretrain.gin",
        f"--model_dir={model_dir}",
        "--gin.RECIPE='t5_span_corruption'",
        f"--gin.TASK='{MIXTURE}'",
        f"--gin.SEQUENCE_LENGTH={SPAN_LENGTHS}",
        f"--gin.TRAIN_STEPS={steps}",
        "--gin.BATCH_SIZE=8",
        "--gin.CHECKPOINT_EVERY=3",
        "--gin.ModelConfig.vocab_size=8100",
        "--gin.train.log_every=1",
        "--gin.train.eval_batches=1",
        "--gin.train.progress_bar=False",
        f"--gin.train.stages={STAGES}",
        *extra,
    ]


def test_a_staged_mixture_trains_each_stage_on_its_tasks(tmp_path, capsys):
    """ERNIE 2.0's continual schedule on the seq2seq mixture: steps 1-2 train prefix LM alone,
    then span corruption joins; metrics.jsonl marks each stage and run.json records the
    schedule."""
    assert cli.main(_staged_argv(tmp_path, 5)) == 0, capsys.readouterr().err[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    stages = [(r["step"], r["data/stage"]) for r in records if "data/stage" in r]
    assert stages == [(0, 1), (2, 2)]
    steps = _train_records(tmp_path)
    prefix, span = (f"seq2seq_share/wiki_sample_{t}" for t in ("prefix_lm", "t5_span_corruption"))
    assert [steps[s][prefix] for s in (1, 2)] == [1.0, 1.0]
    assert sum(steps[s][span] for s in (3, 4, 5)) > 0
    assert all(steps[s].get("seq2seq_share/wiki_sample_iid_denoising", 0) == 0 for s in steps)
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["stages"][1] == [
        2, {"wiki_sample_prefix_lm": 1.0, "wiki_sample_t5_span_corruption": 1.0}
    ]  # fmt: skip

    # Resumed with stage 2 moved from step 2 to 4, past the 5 batches read: refused (exit 2,
    # one line) before anything is written or restored.
    records = {name: (tmp_path / name).read_bytes() for name in ("run.json", "config.gin")}
    capsys.readouterr()
    moved = STAGES.replace("(2, {", "(4, {")
    code = cli.main(_staged_argv(tmp_path, 7, f"--gin.train.stages={moved}"))
    err = capsys.readouterr().err
    assert code == cli.CONFIG_ERROR_EXIT_CODE, err[-3000:]
    (line,) = err.strip().splitlines()
    assert (
        "the stages differ before the data position (5 batches read): stage 2 from batch 2" in line
    )
    assert "-> from batch 4" in line, line
    for name, before in records.items():
        assert (tmp_path / name).read_bytes() == before, name

    # With the data restarted, the new stages are read from batch 0 at step 6: stage 1 marked at
    # step 5, stage 2 (from batch 3) after step 8.
    moved = STAGES.replace("(2, {", "(3, {")
    argv = _staged_argv(
        tmp_path, 8, f"--gin.train.stages={moved}", "--gin.train.data_change='restart'"
    )
    assert cli.main(argv) == 0, capsys.readouterr().err[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    stages = [(r["step"], r["data/stage"]) for r in records if "data/stage" in r]
    assert stages == [(0, 1), (2, 2), (5, 1), (8, 2)]


def _train_records(model_dir) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (model_dir / "metrics.jsonl").open())
            if "seq2seq_loss" in r and "eval/seq2seq_loss" not in r}  # fmt: skip


@pytest.mark.slow
def test_a_staged_run_resumed_inside_a_stage_reads_the_uninterrupted_runs_batches(tmp_path, capsys):
    """Stopped at step 3 (inside stage 2) and resumed, the run reads the batches of steps 4-5
    the uninterrupted run reads: the same task shares and token counts (the losses differ: a
    3-step run's learning-rate schedule is not a 5-step run's)."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    for model_dir, steps in ((whole, 5), (parts, 3), (parts, 5)):
        assert cli.main(_staged_argv(model_dir, steps)) == 0, capsys.readouterr().err[-3000:]
    ran, resumed = _train_records(whole), _train_records(parts)
    data_keys = [k for k in ran[4] if k.startswith("seq2seq_share/")] + ["num_tokens"]
    assert len(data_keys) == 4  # three task shares and the token count
    for s in (4, 5):
        assert {k: resumed[s][k] for k in data_keys} == {k: ran[s][k] for k in data_keys}, s


def test_a_schedule_that_drops_a_task_is_refused_before_training(tmp_path):
    bad = "[(0, {'wiki_sample_prefix_lm': 1.0}), (2, {'wiki_sample_iid_denoising': 1.0})]"
    with pytest.raises(cli.ConfigError) as error:
        cli.load_config(cli.parse_args(_staged_argv(tmp_path, 5, f"--gin.train.stages={bad}")))
    assert any(
        "data.stages[1] (from step 2) drops ['wiki_sample_prefix_lm']" in p
        for p in error.value.problems
    ), error.value.problems
