"""lmsuite installed the way users install it: the README's commands, a built wheel, a fresh
virtualenv outside the repository, and an empty working directory, on Python 3.11 (the oldest
stack: jax 0.10.2) and 3.13 (the newest, Colab's).

In each fresh venv: the CPU command, then `lmsuite train --gin_file=experiments/smoke.gin
--model_dir=run` (relative: the gin file comes from the wheel), `lmsuite eval --model_dir=run`,
`lmsuite.load('run').fill_mask(...)` with neither `transformers` nor `torch` installed, then the
notebooks command and `notebooks/evaluate_checkpoint.ipynb` executed in that venv's kernel. The
TPU, GPU and HF commands are resolved by pip (`--dry-run`: their wheels are for other machines).
The notebooks' Colab cell is run with a fake Colab on each runtime and must install with the
table's command for it.

About four minutes per Python on 2 cores, mostly pip unpacking TensorFlow and JAX from its cache;
`make test` installs on 3.13, `make test-all` on both.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import nbformat
import pytest

ROOT = pathlib.Path(__file__).parents[2]
README = ROOT / "README.md"
URL = "git+https://github.com/lmsuite/lmsuite"
# The oldest stack in `make test-all` only: the fast suite keeps Colab's Python.
PYTHONS = [pytest.param("3.11", marks=pytest.mark.slow), "3.13"]
ENV = {"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}


def install_commands() -> dict[str, str]:
    """The README install table: platform -> command (only rows whose command is a pip line)."""
    text = README.read_text()
    table = text.split("<!-- install-table")[1].split("<!-- /install-table -->")[0]
    commands = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[2].startswith("`pip install"):
            commands[cells[0]] = cells[2].strip("`")
    return commands


def with_wheel(command: str, wheel: pathlib.Path) -> list[str]:
    """The README command with the repository URL replaced by the wheel, as pip's argv."""
    match = re.fullmatch(r'pip install "(lmsuite(\[\w+\])?) @ ' + re.escape(URL) + '"', command)
    assert match, f"unexpected install command {command!r}"
    return ["-m", "pip", "install", f"{match.group(1)} @ {wheel.as_uri()}"]


def find_python(version: str) -> str | None:
    found = subprocess.run(
        [str(ROOT / ".ci" / "find_python"), version], capture_output=True, text=True
    )
    return found.stdout.strip() if found.returncode == 0 else None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    """lmsuite's wheel, built from this checkout (with `build`, in an isolated environment)."""
    out = tmp_path_factory.mktemp("dist")
    build = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (built,) = out.glob("lmsuite-*.whl")
    return built


def environment(env=None) -> dict[str, str]:
    out = {**os.environ, **ENV, **(env or {})}
    out.pop("PYTHONPATH", None)  # nothing from the checkout may leak in
    return out


def run(argv, *, cwd, timeout=900, env=None, check=True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        argv, cwd=cwd, env=environment(env), capture_output=True, text=True, timeout=timeout
    )
    if check:
        assert done.returncode == 0, (
            f"{argv} exited {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        )
    return done


def test_the_table_names_every_platform():
    commands = install_commands()
    assert set(commands) >= {"CPU", "TPU VM", "Jupyter, the notebooks", "HuggingFace import/export"}
    assert any(k.startswith("GPU") for k in commands)
    text = README.read_text()
    assert "| Colab (CPU, GPU or TPU runtime) | 3.13 |" in text


def test_the_wheel_carries_the_gin_files_and_no_tests(wheel):
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    gin_files = {n for n in names if n.endswith(".gin")}
    assert "lmsuite/gin/experiments/smoke.gin" in gin_files
    assert "lmsuite/gin/runs/pretrain.gin" in gin_files
    expected = {str(p.relative_to(ROOT)) for p in (ROOT / "lmsuite" / "gin").rglob("*.gin")}
    assert gin_files == expected
    assert not any(n.startswith(("tests/", "benchmarks/", "notebooks/")) for n in names)


@pytest.mark.parametrize("version", PYTHONS)
def test_install_train_eval_load_notebook(version, wheel, tmp_path):
    python = find_python(version)
    if python is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must test the install on Python {version}; none was found")
        pytest.skip(f"no python{version} on this machine")
    commands = install_commands()
    venv = tmp_path / "venv"
    run([python, "-m", "venv", str(venv)], cwd=tmp_path)
    py = str(venv / "bin" / "python")
    work = tmp_path / "empty"
    work.mkdir()
    run([py, *with_wheel(commands["CPU"], wheel), "--quiet"], cwd=work)
    version_check = run([py, "-c", "import sys, jax; print(sys.version_info[:2], jax.__version__)"],
                        cwd=work)  # fmt: skip
    assert f"(3, {version.split('.')[1]})" in version_check.stdout
    for extra_only in ("transformers", "torch"):
        assert run([py, "-c", f"import {extra_only}"], cwd=work, check=False).returncode != 0

    lmsuite = str(venv / "bin" / "lmsuite")
    train = run([lmsuite, "train", "--gin_file=experiments/smoke.gin", "--model_dir=run",
                 "--gin.TRAIN_STEPS=10", "--gin.train.eval_batches=1"], cwd=work)  # fmt: skip
    assert "checkpoints:" in train.stdout and str(work / "run") in train.stdout
    assert sorted(os.listdir(work)) == ["run"]
    evaluated = run([lmsuite, "eval", "--model_dir=run", "--max_batches=2"], cwd=work)
    assert "eval/mlm_accuracy" in evaluated.stdout
    missing = run([lmsuite, "train", "--gin_file=experiments/nope.gin", "--model_dir=x"],
                  cwd=work, check=False)  # fmt: skip
    assert missing.returncode != 0
    assert str(venv) in missing.stderr and "lmsuite/gin" in missing.stderr  # the folders searched

    load = run([py, "-c", "import json, lmsuite; m = lmsuite.load('run'); "
                "print(json.dumps(m.fill_mask('The cat sat on the [MASK].', top_k=3)))"],
               cwd=work)  # fmt: skip
    predictions = json.loads(load.stdout.strip().splitlines()[-1])
    assert len(predictions) == 3 and all("[MASK]" not in p["sequence"] for p in predictions)
    needs_hf = run([py, "-c", "import lmsuite; lmsuite.load('run').save_hf('hf')"], cwd=work,
                   check=False)  # fmt: skip
    assert "pip install 'lmsuite[hf]'" in needs_hf.stderr

    run([py, *with_wheel(commands["Jupyter, the notebooks"], wheel), "--quiet"], cwd=work)
    notebook = tmp_path / "evaluate_checkpoint.ipynb"
    shutil.copy(ROOT / "notebooks" / "evaluate_checkpoint.ipynb", notebook)
    executed = tmp_path / "executed.ipynb"
    run([py, "-c", EXECUTE_NOTEBOOK, str(notebook), str(executed)], cwd=work,
        env={"LMSUITE_RUN_DIR": "run"})  # fmt: skip
    nb = nbformat.read(executed, as_version=4)
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    assert "all checks passed" in "".join(o.get("text", "") for o in last.outputs)
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "pip install 'lmsuite[hf]'" in text  # the generation cell names the extra it lacks

    # The other platforms' resolves wait mostly on the package index: they run side by side.
    resolving = {
        platform: subprocess.Popen(
            [py, *with_wheel(command, wheel), "--dry-run", "--quiet"],
            cwd=work,
            env=environment(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for platform, command in commands.items()
        if platform not in ("CPU", "Jupyter, the notebooks")
    }
    for platform, resolve in resolving.items():
        _, err = resolve.communicate(timeout=900)
        assert resolve.returncode == 0, f"{platform}: {commands[platform]}\n{err[-3000:]}"


# Runs in the fresh venv: nbclient executes the notebook in that venv's own python3 kernel.
EXECUTE_NOTEBOOK = """
import os, sys
import nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3",
               resources={"metadata": {"path": os.getcwd()}}).execute()
nbformat.write(nb, sys.argv[2])
"""


@pytest.mark.parametrize("runtime", ["CPU", "GPU", "TPU"])
def test_the_colab_cell_installs_with_the_table_command(runtime, monkeypatch):
    """The notebooks' first cell, run as in a Colab runtime of each kind, pip-installs with the
    README's command for that platform (LMSUITE_REPO in place of the URL)."""
    import glob
    import types

    calls = []
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(subprocess, "check_call", lambda argv: calls.append(argv))
    monkeypatch.setattr(
        glob,
        "glob",
        lambda pattern: ["/dev/vfio/0"] if runtime == "TPU" and "vfio" in pattern else [],
    )
    monkeypatch.setattr(
        shutil, "which", lambda name: "/usr/bin/nvidia-smi" if runtime == "GPU" else None
    )
    monkeypatch.setenv("LMSUITE_REPO", "https://example.org/fork")
    sources = set()
    for name in ("evaluate_checkpoint", "pretrain_quickstart", "register_task"):
        nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
        sources.add(next(c for c in nb.cells if c.cell_type == "code").source)
    (source,) = sources  # one install cell, the same in every notebook
    exec(compile(source, "first_cell", "exec"), {})
    ((*pip, requirement),) = calls
    assert pip == [sys.executable, "-m", "pip", "install", "-q"]
    row = {"CPU": "CPU", "GPU": next(k for k in install_commands() if k.startswith("GPU")),
           "TPU": "TPU VM"}[runtime]  # fmt: skip
    expected = install_commands()[row].replace(URL, "git+https://example.org/fork")
    assert expected == f'pip install "{requirement}"'
