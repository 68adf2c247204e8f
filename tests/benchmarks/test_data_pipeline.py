"""`benchmarks/data_pipeline.py`'s table of every objective's full pipeline: each row builds."""

import pytest

from tests.benchmarks import scripts


@pytest.fixture(scope="module")
def pipelines():
    module = scripts.load("data_pipeline")
    return module, module._full_pipelines()


def test_every_recipe_objective_has_a_row(pipelines):
    from lmsuite.training import recipes

    _, rows = pipelines
    tasks = {spec[0] for spec in rows.values()}
    for recipe in recipes.RECIPES.values():
        for objective in recipe.task_objectives:
            assert any(task.endswith(f"_{objective}") for task in tasks), (recipe.name, objective)


@pytest.mark.parametrize(
    "label",
    [
        "wiki_sample_ernie2_sentence_distance",  # a multi-task row: four heads' labels
        "wiki_sample_bert_mlm_nsp (mlm_multitask)",
        "wiki_sample_txl_lm",  # token feature "targets"
        "wiki_sample_xlnet_plm",  # examples built a group at a time
        "wiki_sample_bert_mlm",
    ],
)
def test_rows_time_through_their_recipes_converter(pipelines, label):
    module, rows = pipelines
    rows_per_sec, examples_per_sec, tokens_per_sec, cpu_per_row = module._time_full(
        *rows[label], rows=32, warmup=0
    )
    assert rows_per_sec > 0 and examples_per_sec >= rows_per_sec > 0
    assert tokens_per_sec > 10 * rows_per_sec  # real tokens were counted, not zero rows
    assert cpu_per_row > 0


def test_tasks_filter_picks_rows_and_names_a_miss(pipelines):
    module, _ = pipelines
    rates = module.worker("objectives_full", num_examples=32, warmup=0, tasks="txl_lm,nope")
    assert list(rates) == ["wiki_sample_txl_lm"]
    with pytest.raises(ValueError, match="--tasks='nope' matches none of"):
        module.worker("objectives_full", num_examples=32, warmup=0, tasks="nope")
