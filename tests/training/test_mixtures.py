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
            "--gin.train.eval_batches=1",  # the identity below holds per batch
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
