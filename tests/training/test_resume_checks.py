"""A resume compares the run it is asked for with the run.json it finds before it writes
anything: another model or recipe is refused, a changed batch, task, lengths or packing is
refused unless `train.data_change` says how the data position follows (issue 25, item 5); a
continual schedule may change only from the data position on."""

import json

import pytest

from lmsuite import cli
from lmsuite.cli import gin_run
from lmsuite.evaluation import run_config
from lmsuite.models import ModelConfig
from lmsuite.training import resume_checks
from lmsuite.training.resume_checks import DataPlan, compare, data_position
from lmsuite.training.train_config import InvalidRunError

MODEL = ModelConfig(vocab_size=100, d_model=64, num_heads=2, d_ff=128, num_layers=2)


def _record(model=MODEL, **changes) -> dict:
    """A run.json record as `TrainConfig.run_record` writes it, read back from JSON."""
    record = {
        "model_config": model.to_json(),
        "task": "wiki_sample_bert_mlm",
        "sequence_length": {"input_ids": 64, "masked_ids": 10},
        "recipe": "bert_mlm",
        "recipe_options": {"pack": False, "loss_options": {}, "task_weights": {}},
        "batch_size": 8,
        "task_modules": [],
    }
    record.update(changes)
    return json.loads(json.dumps(record))


def _refused(old, new, data_change=None) -> str:
    with pytest.raises(InvalidRunError) as caught:
        compare(old, new, data_change=data_change)
    assert len(caught.value.problems) == 1, caught.value.problems
    return caught.value.problems[0]


def test_the_same_run_resumes_where_it_was():
    plan = compare(_record(), _record(), data_change=None)
    assert plan == DataPlan() and data_position(plan, 17) == 17


def test_a_changed_model_is_refused_naming_each_field_with_both_values():
    new = _record(MODEL.replace(d_model=128, num_layers=3), recipe="bert_mlm_nsp")
    for data_change in (None, "restart"):  # no data option lets the model change
        problem = _refused(_record(), new, data_change)
        assert "d_model 64 -> 128" in problem, problem
        assert "num_layers 2 -> 3" in problem, problem
        assert "recipe 'bert_mlm' -> 'bert_mlm_nsp'" in problem, problem
        assert "d_ff" not in problem  # unchanged fields are not named


def test_remat_may_change_but_scanned_layers_may_not():
    """remat changes memory only; scan_layers changes the checkpoint's parameter layout."""
    assert compare(_record(), _record(MODEL.replace(remat="full")), data_change=None) == DataPlan()
    problem = _refused(_record(), _record(MODEL.replace(scan_layers=True)))
    assert "scan_layers False -> True" in problem, problem


def test_a_changed_batch_is_refused_without_the_option_and_rescaled_with_it():
    problem = _refused(_record(), _record(batch_size=16))
    assert "batch_size 8 -> 16" in problem and "train.data_change='rescale'" in problem

    plan = compare(_record(), _record(batch_size=16), data_change="rescale")
    assert data_position(plan, 10) == 5  # 80 examples consumed, 5 batches of 16
    plan = compare(_record(), _record(batch_size=3), data_change="rescale")
    # 80 examples / 3 rounds down to 26 batches (78 examples): two are read again
    assert data_position(plan, 10) == 26
    plan = compare(_record(batch_size=6), _record(batch_size=4), data_change="rescale")
    assert data_position(plan, 7) == 10  # 42 examples -> 10 batches of 4 (40)

    plan = compare(_record(), _record(batch_size=16), data_change="restart")
    assert data_position(plan, 10) == 0


def test_a_changed_task_or_lengths_needs_restart():
    changed_task = _record(task="wiki_sample_bert_mlm_nsp")
    problem = _refused(_record(), changed_task)
    assert "task 'wiki_sample_bert_mlm' -> 'wiki_sample_bert_mlm_nsp'" in problem, problem
    assert "'restart'" in _refused(_record(), changed_task, "rescale")

    longer = _record(sequence_length={"input_ids": 128, "masked_ids": 10})
    assert "sequence_length" in _refused(_record(), longer, "rescale")

    plan = compare(_record(), changed_task, data_change="restart")
    assert data_position(plan, 10) == 0
    assert data_position(compare(_record(), longer, data_change="restart"), 10) == 0


def test_an_option_left_set_changes_nothing_when_the_data_are_the_same():
    # an option left in the gin file or command line for the resumes after the one it served
    for data_change in resume_checks.DATA_CHANGES:
        assert data_position(compare(_record(), _record(), data_change=data_change), 9) == 9


def test_a_run_json_without_batch_size_is_not_refused_on_the_batch():
    old = _record()
    del old["batch_size"]  # written before the batch was recorded: unknown
    plan = compare(old, _record(batch_size=32), data_change=None)
    assert data_position(plan, 10) == 10
    # and an old model config without the fields added since compares by their defaults
    del old["model_config"]["dropout_rate"]  # MODEL's is the default
    assert compare(old, _record(), data_change=None) == DataPlan()


def test_other_changes_resume_as_before():
    new = _record(task_modules=["my.tasks"])
    assert compare(_record(), new, data_change=None) == DataPlan()
    options = {"pack": False, "loss_options": {"sbo_weight": 2.0}, "task_weights": {"a": 3.0}}
    assert compare(_record(), _record(recipe_options=options), data_change=None) == DataPlan()


# Stage 1 from batch 0, stage 2 from batch 10 (global batches = steps).
STAGES = [[0, {"a": 1.0}], [10, {"a": 1.0, "b": 1.0}]]


def test_stages_may_change_from_the_data_position_on():
    """The stages after the position are the run's future: added, moved or re-weighted."""
    later = [
        [[0, {"a": 1.0}], [10, {"a": 1.0, "b": 1.0}], [20, {"a": 1.0, "b": 1.0, "c": 2.0}]],
        [[0, {"a": 1.0}], [10, {"a": 1.0, "b": 3.0}]],  # stage 2's rates, resumed inside stage 1
        [[0, {"a": 1.0}], [12, {"a": 1.0, "b": 1.0}]],  # stage 2 moved later
        [[0, {"a": 1.0}], [8, {"a": 1.0, "b": 1.0}]],  # stage 2 moved earlier, still ahead
    ]
    for consumed, stages in zip((15, 7, 7, 7), later, strict=True):
        plan = compare(
            _record(stages=STAGES), _record(stages=stages), data_change=None,
            batches_consumed=consumed,
        )  # fmt: skip
        assert data_position(plan, consumed) == consumed
    # a stage added at the position itself begins there: nothing of it was read
    stages = [*STAGES, [15, {"a": 1.0, "b": 1.0, "c": 1.0}]]
    assert compare(_record(stages=STAGES), _record(stages=stages), data_change=None,
                   batches_consumed=15) == DataPlan()  # fmt: skip
    # and before any batch was read anything goes
    assert compare(_record(), _record(stages=STAGES), data_change=None,
                   batches_consumed=0) == DataPlan()  # fmt: skip


def test_stages_the_run_has_read_may_not_change():
    """A stage before the position, or the one it is in, changed: the record would be untrue
    and the resumed stream would skip into another sample."""
    moved = [[0, {"a": 1.0}], [12, {"a": 1.0, "b": 1.0}]]
    with pytest.raises(InvalidRunError) as caught:
        compare(_record(stages=STAGES), _record(stages=moved), data_change=None,
                batches_consumed=15)  # fmt: skip
    (problem,) = caught.value.problems
    assert "before the data position (15 batches read)" in problem, problem
    assert (
        "stage 2 from batch 10 at {'a': 1.0, 'b': 1.0} -> from batch 12 at {'a': 1.0, 'b': 1.0}"
        in problem
    ), problem
    assert "train.data_change='restart'" in problem and "batch 15 or later" in problem, problem

    reweighted = [[0, {"a": 1.0}], [10, {"a": 1.0, "b": 2.0}]]  # the stage it is in
    assert "stage 2 from batch 10" in _refused_at(15, STAGES, reweighted)
    earlier = [[0, {"a": 1.0}], [5, {"a": 1.0, "b": 1.0}]]  # stage 2 moved before position 7
    assert "stage 2 none -> from batch 5" in _refused_at(7, STAGES, earlier)
    dropped = [[0, {"a": 1.0}]]
    assert "stage 2 from batch 10 at {'a': 1.0, 'b': 1.0} -> none" in _refused_at(
        15, STAGES, dropped
    )
    assert "the run has no stages and the resume has" in _refused_at(1, None, STAGES)
    assert "the run has stages and the resume has none" in _refused_at(1, STAGES, None)
    # 'rescale' keeps the position, so it does not excuse a changed past (batch 8 -> 16: 30
    # batches consumed are 15 of the new size); 'restart' reads the new stages from batch 0
    with pytest.raises(InvalidRunError, match=r"\(15 batches read\)"):
        compare(_record(stages=STAGES), _record(batch_size=16, stages=moved),
                data_change="rescale", batches_consumed=30)  # fmt: skip
    for old, new in ((STAGES, moved), (None, STAGES), (STAGES, None)):
        plan = compare(_record(**({"stages": old} if old else {})),
                       _record(**({"stages": new} if new else {})),
                       data_change="restart", batches_consumed=15)  # fmt: skip
        assert data_position(plan, 15) == 0, (old, new)


def _refused_at(consumed: int, old_stages, new_stages) -> str:
    old, new = (_record(**({"stages": s} if s else {})) for s in (old_stages, new_stages))
    with pytest.raises(InvalidRunError) as caught:
        compare(old, new, data_change=None, batches_consumed=consumed)
    (problem,) = caught.value.problems
    return problem


def test_a_changed_packing_changes_the_data_and_needs_restart():
    """Packed rows are other batches: the data position would point elsewhere."""
    packed = _record(recipe_options={"pack": True, "loss_options": {}, "task_weights": {}})
    problem = _refused(_record(), packed)
    assert "pack False -> True" in problem and "'restart'" in problem, problem
    assert "'restart'" in _refused(_record(), packed, "rescale")
    assert data_position(compare(_record(), packed, data_change="restart"), 10) == 0
    old = _record()
    del old["recipe_options"]  # written before it was recorded: the old packing is unknown
    assert compare(old, packed, data_change=None) == DataPlan()


def test_a_changed_shuffle_buffer_changes_the_data_and_needs_restart():
    """Another buffer shuffles the examples otherwise: the same position is other batches."""
    problem = _refused(_record(), _record(shuffle_buffer_size=20000))
    assert "shuffle_buffer_size None -> 20000" in problem and "'restart'" in problem, problem
    assert "'restart'" in _refused(_record(shuffle_buffer_size=20000), _record(), "rescale")
    assert (
        compare(_record(shuffle_buffer_size=50), _record(shuffle_buffer_size=50), data_change=None)
        == DataPlan()
    )
    from lmsuite.training.train_config import DataConfig

    assert gin_run.TRAIN_PARAMETERS["shuffle_buffer_size"] == ("data", "shuffle_buffer_size")
    config = DataConfig(task="t", sequence_length={"x": 1}, batch_size=1, shuffle_buffer_size=0)
    assert any("data.shuffle_buffer_size must be an integer >= 1" in p for p in config.problems())


def test_the_option_is_a_gin_train_parameter_and_checked():
    assert gin_run.TRAIN_PARAMETERS["data_change"] == ("data", "data_change")
    from lmsuite.training.train_config import DataConfig

    config = DataConfig(task="t", sequence_length={"x": 1}, batch_size=1, data_change="skip")
    assert any("data.data_change" in p and "'skip'" in p for p in config.problems())


def test_run_json_with_batch_size_still_reads():
    run = run_config.parse_run_config(json.dumps(_record()))
    assert run.model_config == MODEL and run.recipe == "bert_mlm"


# ---------------------------------------------------------------------------- end to end
def test_a_resume_with_another_width_exits_2_and_leaves_the_records(capsys, tmp_path):
    model_dir = tmp_path / "run"
    smoke = [
        "train",
        "--gin_file=experiments/smoke.gin",
        f"--model_dir={model_dir}",
        "--gin.TRAIN_STEPS=2",
        "--gin.WARMUP_STEPS=1",
        "--gin.CHECKPOINT_EVERY=1",
        "--gin.train.final_eval=False",
    ]
    assert cli.main(smoke) == 0, capsys.readouterr().err[-3000:]
    records = {name: (model_dir / name).read_bytes() for name in ("run.json", "config.gin")}
    capsys.readouterr()

    code = cli.main([*smoke, "--gin.ModelConfig.d_model=64", "--gin.TRAIN_STEPS=4"])
    err = capsys.readouterr().err
    assert code == cli.CONFIG_ERROR_EXIT_CODE == 2, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "d_model 32 -> 64" in lines[0], err[-3000:]
    assert lines[0].startswith("lmsuite: configuration error: resuming the run recorded in ")
    assert str(model_dir / "run.json") in lines[0]
    for name, before in records.items():
        assert (model_dir / name).read_bytes() == before, name
