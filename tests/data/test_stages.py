"""Continual schedules (`lmsuite.data.stages`): the checks a schedule passes, the batches of each
stage and a resume that starts inside any stage (the seed systems issue, ERNIE 2.0's stages)."""

import numpy as np
import pytest
import tensorflow as tf

from lmsuite.data import stages as stages_lib
from lmsuite.data.stages import Stage

TASKS = ("t_caps", "t_distance", "t_order")


def _problems(stages, train_steps=100):
    return stages_lib.problems(
        stages_lib.as_stages(stages), tasks=TASKS, mixture="m", train_steps=train_steps
    )


def test_a_schedule_that_adds_tasks_and_keeps_the_earlier_ones_passes():
    schedule = [(0, {"t_caps": 1.0}), (30, {"t_caps": 1, "t_order": 2.5})]
    assert _problems(schedule) == []
    assert stages_lib.as_stages(schedule)[1] == Stage(30, {"t_caps": 1, "t_order": 2.5})


@pytest.mark.parametrize(
    "schedule, message",
    [
        ([(5, {"t_caps": 1})], "the first stage starts at step 5; expected 0"),
        ([(0, {"t_caps": 1}), (0, {"t_caps": 1})], "start in increasing order"),
        ([(0, {"t_caps": 1}), (100, {"t_caps": 1})], "at or after the run's last step (100"),
        ([(0, {"t_cap": 1})], "'t_cap' is not a task of mixture 'm'; did you mean 't_caps'?"),
        ([(0, {"t_caps": 0})], "the rate of 't_caps' must be finite and > 0, got 0"),
        ([(0, {"t_caps": float("nan")})], "must be finite and > 0, got nan"),
        ([(0, {})], "has no task"),
        ([(-1, {"t_caps": 1})], "the start must be an int >= 0, got -1"),
        (
            [(0, {"t_caps": 1, "t_order": 1}), (10, {"t_order": 1})],
            "data.stages[1] (from step 10) drops ['t_caps']: every stage keeps the tasks",
        ),
    ],
)
def test_a_bad_schedule_is_named(schedule, message):
    found = _problems(schedule)
    assert any(message in p for p in found), found


def test_stages_need_a_mixture_and_items_of_the_right_shape():
    assert (
        "'m' is not a mixture"
        in stages_lib.problems((Stage(0, {"x": 1}),), tasks=(), mixture="m")[0]
    )
    with pytest.raises(ValueError, match=r"stage 1 is 7; expected \(first step, \{task: rate"):
        stages_lib.as_stages([(0, {"t_caps": 1}), 7])


def test_stage_index_by_hand():
    stages = stages_lib.as_stages([(0, {"a": 1}), (300, {"a": 1}), (700, {"a": 1})])
    got = [stages_lib.stage_index(stages, b) for b in (0, 299, 300, 699, 700, 5000)]
    assert got == [0, 0, 1, 1, 2, 2]


def _stage_batches(index, rates):
    """Stage `index`'s endless batches: 1000 * (index + 1) + its own count."""
    del rates
    return tf.data.Dataset.range(10**6).map(lambda n: n + 1000 * (index + 1))


def test_each_stage_gives_its_own_batches_for_its_length():
    stages = stages_lib.as_stages([(0, {"a": 1}), (3, {"a": 1}), (5, {"a": 1})])
    got = list(stages_lib.staged(stages, _stage_batches).take(8).as_numpy_iterator())
    assert got == [1000, 1001, 1002, 2000, 2001, 3000, 3001, 3002]


def test_a_resume_from_any_batch_sees_what_the_uninterrupted_run_sees():
    stages = stages_lib.as_stages([(0, {"a": 1}), (3, {"a": 1}), (5, {"a": 1})])
    whole = list(stages_lib.staged(stages, _stage_batches).take(9).as_numpy_iterator())
    for skip in range(9):
        resumed = stages_lib.staged(stages, _stage_batches, skip_batches=skip)
        assert list(resumed.take(9 - skip).as_numpy_iterator()) == whole[skip:], skip


def test_a_resume_builds_no_stage_before_its_own():
    built = []

    def batches(index, rates):
        built.append(index)
        return _stage_batches(index, rates)

    stages = stages_lib.as_stages([(0, {"a": 1}), (3, {"a": 1}), (5, {"a": 1})])
    stages_lib.staged(stages, batches, skip_batches=4)
    assert sorted(built) == [1, 2]


@pytest.fixture(scope="module")
def _tasks():
    import lmsuite.data.tasks  # noqa: F401


def test_a_staged_mixture_samples_only_its_stage_tasks_and_keeps_the_mixture_ids(
    _tasks, monkeypatch
):
    """wiki_sample_seq2seq_mixture's tasks (sorted: iid_denoising 1, prefix_lm 2, span 3): stage
    0 samples prefix LM alone, stage 1 adds span corruption at 3:1; ids stay the mixture's. Each
    task's pipeline is built for each stage that samples it, and a task no stage samples once,
    for its features."""
    import seqio

    from lmsuite.training import input_pipeline, recipes

    built_tasks = []
    get_dataset = seqio.Task.get_dataset

    def counted(task, *args, **kwargs):
        built_tasks.append(task.name)
        return get_dataset(task, *args, **kwargs)

    monkeypatch.setattr(seqio.Task, "get_dataset", counted)

    mixture = "wiki_sample_seq2seq_mixture"
    lengths = {"inputs": 32, "targets": 8}
    built = recipes.build(
        recipes.make_recipe(name="t5_span_corruption"),
        model_config=None,
        tasks=("x", "y", "z"),
    )
    stages = stages_lib.as_stages(
        [
            (0, {"wiki_sample_prefix_lm": 1.0}),
            (4, {"wiki_sample_prefix_lm": 1.0, "wiki_sample_t5_span_corruption": 3.0}),
        ]
    )

    def batches(skip):
        return input_pipeline.process_dataset(
            task=mixture,
            sequence_length=lengths,
            feature_converter=built.feature_converter,
            global_batch_size=16,
            seed=3,
            skip_batches=skip,
            task_ids_along=built.task_ids_along,
            stages=stages,
        )

    got = [b["task_ids"] for b in batches(0).take(10).as_numpy_iterator()]
    assert sorted(built_tasks) == [
        "wiki_sample_iid_denoising",
        "wiki_sample_prefix_lm",
        "wiki_sample_prefix_lm",
        "wiki_sample_t5_span_corruption",
    ]
    first = np.unique(np.concatenate([ids.ravel() for ids in got[:4]]))
    assert set(first) - {0} == {2}, first  # 0: padding
    later = np.concatenate([ids.ravel() for ids in got[4:]])
    counts = {t: int((later == t).sum()) for t in (1, 2, 3)}
    assert counts[1] == 0 and counts[3] > counts[2] > 0, counts
    resumed = [b["task_ids"] for b in batches(6).take(4).as_numpy_iterator()]
    for a, b in zip(resumed, got[6:], strict=True):
        np.testing.assert_array_equal(a, b)
