"""The notebooks in notebooks/, executed headless (nbclient + the .venv's ipykernel) on a tiny
checkpoint: every cell runs, the assertions each notebook ends with pass, the plots are drawn.

Each notebook trains or evaluates a tiny model on CPU; all three run in `make test` (the
issue asks for them there), about a minute each on an idle machine.
"""

import os
import pathlib
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from lmsuite import cli
from lmsuite.evaluation.load import committed_steps

NOTEBOOKS = pathlib.Path(__file__).parents[2] / "notebooks"
CELL_TIMEOUT = 600  # seconds per cell; a notebook takes one to two minutes on 2 CPU cores
ENV = {"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}  # as the CLI tests run


def execute(nb, *, cwd, monkeypatch, **env):
    """Runs `nb` in a fresh python3 kernel started from this process's environment plus `env`;
    returns it with its outputs (a failing cell raises CellExecutionError)."""
    for key, value in {**ENV, **env}.items():
        monkeypatch.setenv(key, str(value))  # the kernel inherits the environment at start
    client = NotebookClient(
        nb, timeout=CELL_TIMEOUT, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    )
    client.execute()
    return nb


def _outputs(nb):
    return [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]


def _images(nb) -> int:
    return sum("image/png" in o.get("data", {}) for o in _outputs(nb))


def _last_stdout(nb) -> str:
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    return "".join(o.get("text", "") for o in last.outputs if o.output_type == "stream")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The smoke experiment cut to 10 steps, committed at step 10."""
    model_dir = tmp_path_factory.mktemp("notebooks") / "smoke"
    argv = ["train", "--gin_file=experiments/smoke.gin", f"--model_dir={model_dir}",
            "--gin.TRAIN_STEPS=10", "--gin.train.eval_batches=1"]  # fmt: skip
    assert cli.main(argv) == 0
    assert committed_steps(str(model_dir)) == [10]
    return str(model_dir)


def test_the_kernel_is_this_python(tmp_path, monkeypatch):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import os, sys; print(sys.executable)")]
    execute(nb, cwd=tmp_path, monkeypatch=monkeypatch)
    (printed,) = [o.text.strip() for o in _outputs(nb) if o.output_type == "stream"]
    assert os.path.realpath(printed) == os.path.realpath(sys.executable)


def _read(name: str):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert '"google.colab" in sys.modules' in first.source  # installs only in Colab
    assert not _outputs(nb), f"{name} is stored with outputs"
    return nb


def test_evaluate_checkpoint(tiny_run, tmp_path, monkeypatch):
    nb = execute(
        _read("evaluate_checkpoint"),
        cwd=tmp_path,
        monkeypatch=monkeypatch,
        LMSUITE_RUN_DIR=tiny_run,
    )
    assert "all checks passed" in _last_stdout(nb)
    assert _images(nb) >= 2  # the loss curves and the attention maps
    text = "".join(o.get("text", "") for o in _outputs(nb))
    assert "generating with a tiny GPT-2 converted from HF" in text  # the run is an encoder
    assert not os.path.exists(tmp_path / "runs")  # it used the given run, trained nothing


def test_register_task(tmp_path, monkeypatch):
    out = tmp_path / "run"
    nb = execute(_read("register_task"), cwd=tmp_path, monkeypatch=monkeypatch, LMSUITE_OUT_DIR=out)
    assert "all checks passed" in _last_stdout(nb)
    assert committed_steps(str(out)) == [6]
    text = "".join(o.get("text", "") for o in _outputs(nb))
    assert "masked_ids:" in text and "wiki_sample_lowercase_bert_mlm" in text


def test_pretrain_quickstart(tmp_path, monkeypatch):
    out = tmp_path / "run"
    nb = execute(
        _read("pretrain_quickstart"), cwd=tmp_path, monkeypatch=monkeypatch, LMSUITE_OUT_DIR=out
    )
    assert "all checks passed" in _last_stdout(nb)
    assert _images(nb) >= 1  # the loss curve
    assert (out / "loss_curve.png").stat().st_size > 0
    assert 20 in committed_steps(str(out))
