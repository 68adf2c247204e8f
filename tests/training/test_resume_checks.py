"""A resume compares the run it is asked for with the run.json it finds before it writes
anything: another model or recipe is refused, a changed batch, task, lengths or packing is
refused unless `train.data_change` says how the data position follows (issue 25, item 5)."""

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
    new = _record(task_modules=["my.tasks"], stages=[[0, {"a": 1.0}]])
    assert compare(_record(), new, data_change=None) == DataPlan()
    options = {"pack": False, "loss_options": {"sbo_weight": 2.0}, "task_weights": {"a": 3.0}}
    assert compare(_record(), _record(recipe_options=options), data_change=None) == DataPlan()


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
