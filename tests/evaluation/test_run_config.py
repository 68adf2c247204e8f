"""run.json remembers what registers its task: the task modules and the text-file task, which
`register_run_tasks` (called by `lmsuite.load` and `lmsuite eval`) imports and registers again;
older run.json files without those keys still parse."""

import json
import sys

import pytest
import seqio

from lmsuite.data import text_files
from lmsuite.evaluation import run_config
from lmsuite.models import ModelConfig

CONFIG = ModelConfig(vocab_size=64, d_model=8, num_heads=2, d_ff=16, num_layers=1).to_json()


def _run(**extra):
    return run_config.parse_run_config(json.dumps({"model_config": CONFIG, "task": "t", **extra}))


def test_an_older_run_json_parses_without_the_new_keys():
    run = _run(sequence_length={"input_ids": 8}, recipe="bert_mlm")
    assert (run.task_modules, run.text_task) == ((), None)
    run_config.register_run_tasks(run)  # nothing to import or register


def test_the_runs_task_modules_are_imported(tmp_path, monkeypatch):
    (tmp_path / "my_run_tasks.py").write_text("IMPORTED = True\n")
    (tmp_path / "my_broken_tasks.py").write_text("import not_a_module_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("my_run_tasks", "my_broken_tasks"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    run_config.register_run_tasks(_run(task_modules=["my_run_tasks"]))
    assert sys.modules["my_run_tasks"].IMPORTED
    with pytest.raises(ValueError, match=r"run.json names the task module 'my_broken_tasks', "
                       r"which does not import here \(ModuleNotFoundError"):  # fmt: skip
        run_config.register_run_tasks(_run(task_modules=["my_broken_tasks"]))


def test_the_runs_text_task_is_registered_again_without_reading_its_files(tmp_path):
    (tmp_path / "a.txt").write_text("One sentence. Another one.\n\nA second document.\n")
    name = text_files.register_text_task(
        objective="causal_lm", train_files=str(tmp_path / "a.txt"), split_documents="blank_line"
    )
    record = json.loads(json.dumps(text_files.TEXT_TASKS[name].to_json()))
    seqio.TaskRegistry.remove(name)  # as in a new process
    del text_files.TEXT_TASKS[name]
    (tmp_path / "a.txt").unlink()  # loading a model needs the vocabulary, not the text
    run_config.register_run_tasks(_run(task=name, text_task=record))
    assert name in seqio.TaskRegistry.names() and name in text_files.TEXT_TASKS
    with pytest.raises(ValueError, match=r"its text_task does not register: a recorded text "
                       r"task has unknown keys \['file'\]"):  # fmt: skip
        run_config.register_run_tasks(_run(text_task={**record, "file": "x"}))
