"""Every malformed input to the `lmsuite` CLI is one line on stderr naming the value and what was
expected, exit status 2, no traceback, and nothing written first (issue 25, item 6).

Most cases run in-process through `cli.main`; a few run as real processes to prove that the
process's whole stderr is that one line (no start-up noise from JAX, TensorFlow or absl)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmsuite import cli

SMOKE = ("train", "--gin_file=experiments/smoke.gin", "--gin.TRAIN_STEPS=6", "--model_dir={run}")
REPO = Path(__file__).resolve().parents[2]

# (argv, a substring of the one line). "{run}" is the run directory that must not appear,
# "{file}" an existing regular file, "{dir}" an existing directory.
CASES = [
    # ------------------------------------------------------------------ lmsuite train: paths
    (("train", "--gin_file=experiments/smoke.gin", "--model_dir="), "--model_dir must name a"),
    ((*SMOKE, "--model_dir={file}"), "is a file"),
    ((*SMOKE, "--gin_file=nope.gin"), "gin file 'nope.gin' not found"),
    ((*SMOKE, "--gin_file={dir}"), "is a directory; expected a .gin file"),
    ((*SMOKE, "--tfds_data_dir={file}"), "--tfds_data_dir"),
    ((*SMOKE, "--gin_search_paths={run}/nowhere"), "--gin_search_paths"),
    # ------------------------------------------------------------- the run's macros and values
    ((*SMOKE, "--gin.CHECKPOINT_EVERY=-1"), "checkpointing.every must be an integer >= 1, got -1"),
    ((*SMOKE, "--gin.CHECKPOINT_EVERY=0"), "checkpointing.every must be an integer >= 1, got 0"),
    ((*SMOKE, "--gin.CHECKPOINT_EVERY=2.5"), "checkpointing.every must be an integer >= 1"),
    ((*SMOKE, "--gin.train.log_every=0"), "trainer.log_every must be an integer >= 1, got 0"),
    ((*SMOKE, "--gin.train.eval_every=-1"), "trainer.eval_every must be an integer >= 0"),
    ((*SMOKE, "--gin.train.keep_checkpoints=0"), "checkpointing.keep must be an integer >= 1"),
    ((*SMOKE, "--gin.train.num_microbatches=0"), "trainer.num_microbatches must be an integer"),
    ((*SMOKE, "--gin.train.eval_batches=0"), "data.eval_batches must be an integer >= 1"),
    ((*SMOKE, "--gin.LEARNING_RATE=-1e-3"), "-0.001"),
    ((*SMOKE, "--gin.LEARNING_RATE=0"), "learning rate"),
    ((*SMOKE, "--gin.LEARNING_RATE=1e999"), "inf"),
    ((*SMOKE, "--gin.LEARNING_RATE='fast'"), "'fast'"),
    ((*SMOKE, "--gin.WARMUP_STEPS=-1"), "-1"),
    ((*SMOKE, "--gin.WARMUP_STEPS=1.5"), "1.5"),
    ((*SMOKE, "--gin.TRAIN_STEPS=0"), "train_steps"),
    ((*SMOKE, "--gin.TRAIN_STEPS=-5"), "-5"),
    ((*SMOKE, "--gin.TRAIN_STEPS=2.5"), "2.5"),
    ((*SMOKE, "--gin.TRAIN_STEPS='10'"), "'10'"),
    ((*SMOKE, "--gin.BATCH_SIZE=0"), "data.batch_size must be an integer >= 1, got 0"),
    ((*SMOKE, "--gin.BATCH_SIZE=8.0"), "data.batch_size must be an integer >= 1, got 8.0"),
    ((*SMOKE, "--gin.SEQUENCE_LENGTH={'input_ids': 0, 'masked_ids': 10}"), "'input_ids'"),
    ((*SMOKE, "--gin.SEQUENCE_LENGTH=64"), "64"),
    ((*SMOKE, "--gin.MESH_SHAPE=(0, 1, 1)"), "mesh_shape sizes must each be >= 1"),
    ((*SMOKE, "--gin.MESH_SHAPE=(2, 1, 1)"), "mesh_shape (2, 1, 1) needs 2 devices"),
    ((*SMOKE, "--gin.MESH_SHAPE=(2, 1)"), "trainer.mesh_shape must be three integers"),
    ((*SMOKE, "--gin.train.seed='x'"), "trainer.seed"),
    ((*SMOKE, "--gin.WEIGHT_DECAY=-1"), "weight_decay (WEIGHT_DECAY) must be a finite number >= 0"),
    ((*SMOKE, "--gin.WEIGHT_DECAY='x'"), "got 'x'"),
    ((*SMOKE, "--gin.train.eval_split='nope'"), "one of ['train', 'validation'], got 'nope'"),
    ((*SMOKE, "--gin.train.input_threads=0"), "data.input_threads must be an integer >= 1"),
    ((*SMOKE, "--gin.train.input_nice='19'"), "data.input_nice must be an integer in [0, 19]"),
    ((*SMOKE, "--gin.train.checkpoint_nice=20"), "checkpointing.nice must be an integer in"),
    ((*SMOKE, "--gin.ModelConfig.d_model=0"), "ModelConfig.d_model must be a positive int, got 0"),
    ((*SMOKE, "--gin.OPTIMIZER='sgdx'"), "got 'sgdx'"),
    ((*SMOKE, "--gin.SCHEDULE='exp'"), "got 'exp'"),
    ((*SMOKE, "--train_files={run}/none/*.txt"), "matches no file"),
    ((*SMOKE, "--task_module=nope_module"), "No module named 'nope_module'"),
    ((*SMOKE, "--distributed", "--num_processes=2"), "go together"),
    (("pretrain", "--model_dir="), "--model_dir must name a directory"),
    # ------------------------------------------------------------------- gin's own syntax
    ((*SMOKE, "--gin.TASK=shakespeare_mlm"), "--gin.TASK=\"'shakespeare_mlm'\""),
    ((*SMOKE, "--gin.RECIPE=bert_mlm"), "--gin.RECIPE=\"'bert_mlm'\""),
    ((*SMOKE, "--gin.TRAIN_STEPS"), "--gin.KEY=VALUE"),
    ((*SMOKE, "--gin.TRAIN_STEPS=1 2"), "--gin.TRAIN_STEPS=1 2: gin cannot parse '1 2'"),
    ((*SMOKE, "--gin_file={dir}/broken.gin"), "broken.gin': line 2: "),
    ((*SMOKE, "--gin.TASK='nope'"), "unknown task 'nope'"),
    ((*SMOKE, "--gin.RECIPE='nope'"), "'nope'"),
    # ------------------------------------------------------------------------ argparse
    ((*SMOKE, "--frobnicate"), "unrecognized arguments: --frobnicate"),
    ((*SMOKE, "--num_processes=two"), "invalid int value: 'two'"),
    (("frobnicate",), "invalid choice: 'frobnicate'"),
    # ------------------------------------------------------------- the other commands
    (("tasks", "show", "wiki_sample_bert_mlm", "--n=-1"), "--n must be an integer >= 1, got -1"),
    (("tasks", "show", "wiki_sample_bert_mlm", "--n=0"), "--n must be an integer >= 1, got 0"),
    (("tasks", "show", "nope"), "unknown task 'nope'"),
    (("tasks", "show"), "needs a task name"),
    (("tasks", "show", "wiki_sample_bert_mlm", "--split=nope"), "has no split 'nope'"),
    (("recipes", "show", "nope"), "unknown recipe 'nope'"),
    (("vocab", "train", "--corpus=wiki_sample", "--size=0"), "--size"),
    (("vocab", "train", "--corpus=nope", "--size=100"), "'nope'"),
    (("vocab", "train", "--corpus=wiki_sample", "--size=100", "--out_dir={file}"), "is a file"),
    (("eval", "--model_dir={run}"), "run.json"),
    (("eval", "--model_dir={file}"), "is a file"),
    (("eval", "--model_dir="), "--model_dir must name a directory"),
    (("eval", "--model_dir={run}", "--step=-1"), "--step must be an integer >= 0, got -1"),
    (("eval", "--model_dir={run}", "--batch_size=0"), "--batch_size must be an integer >= 1"),
    (("eval", "--model_dir={run}", "--max_batches=0"), "--max_batches must be an integer >= 1"),
    (("eval", "--model_dir={run}", "--sequence_length=input_ids"), "expected KEY:LENGTH"),
    (("compile", "--gin_file=experiments/smoke.gin", "--topology=v4-8", "--mesh=0,1,1"), "0,1,1"),
    (("compile", "--gin_file=experiments/smoke.gin", "--topology=v9-8"), "v9-8"),
    (("compile", "--gin_file=experiments/smoke.gin", "--topology=v4-8", "--mesh=1,2"), "1,2"),
    (("finetune", "--model_dir={run}", "--task=nope", "--output_dir={run}"), "'nope'"),
    (
        (
            "finetune",
            "--model_dir={dir}",
            "--task=vader_sentiment",
            "--output_dir={run}",
            "--epochs=0",
        ),
        "--epochs",
    ),  # fmt: skip
    (
        (
            "finetune",
            "--model_dir={dir}",
            "--task=vader_sentiment",
            "--output_dir={run}",
            "--batch_size=0",
        ),
        "--batch_size",
    ),  # fmt: skip
    (
        (
            "finetune",
            "--model_dir={dir}",
            "--task=vader_sentiment",
            "--output_dir={run}",
            "--learning_rate=-1",
        ),
        "--learning_rate",
    ),  # fmt: skip
    (
        (
            "finetune",
            "--model_dir={dir}",
            "--task=vader_sentiment",
            "--output_dir={run}",
            "--max_length=0",
        ),
        "--max_length",
    ),  # fmt: skip
    (("info", "--gin_file=nope.gin"), "nope.gin"),
    (("info", "--gin_file=models/bert_tiny.gin", "--gin.ModelConfig.d_model=-1"), "got -1"),
    (("vocab", "train", "--size=100"), "takes one of --corpus=NAME"),
    (("finetune", "--model_dir={dir}", "--task=vader_sentiment", "--output_dir={file}"), "a file"),
]


def _argv(argv, tmp_path: Path) -> list[str]:
    (tmp_path / "a_file").write_text("not a directory\n")
    (tmp_path / "a_dir").mkdir(exist_ok=True)
    (tmp_path / "a_dir" / "broken.gin").write_text("include 'runs/pretrain.gin'\nTASK = 'a' 'b\n")
    paths = {"run": tmp_path / "run", "file": tmp_path / "a_file", "dir": tmp_path / "a_dir"}
    out = []
    for arg in argv:
        for name, path in paths.items():
            arg = arg.replace(f"{{{name}}}", str(path))
        out.append(arg)
    return out


def _assert_one_clean_line(code, err: str, expected: str, tmp_path: Path, before: set) -> None:
    assert code == cli.CONFIG_ERROR_EXIT_CODE, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].strip(), err[-3000:]
    assert expected in lines[0], lines[0]
    assert not (tmp_path / "run").exists()  # nothing written
    assert set(os.listdir(tmp_path)) == before  # nor in the working directory


@pytest.fixture(scope="module", autouse=True)
def _warm_imports():
    cli.register_configurables()
    import lmsuite.data.tasks  # noqa: F401


@pytest.mark.parametrize("argv, expected", CASES, ids=[" ".join(c[0][1:])[-60:] for c in CASES])
def test_a_bad_input_is_one_line_and_exit_2(argv, expected, tmp_path, capsys, monkeypatch):
    argv = _argv(argv, tmp_path)
    monkeypatch.chdir(tmp_path)  # `--model_dir=` must not train here either
    before = set(os.listdir(tmp_path))
    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    _assert_one_clean_line(code, capsys.readouterr().err, expected, tmp_path, before)


def test_a_pickled_checkpoint_the_safe_loader_refuses_is_named_not_loaded(
    tmp_path, capsys, monkeypatch
):
    """A pytorch_model.bin holding a Python object: torch's weights_only loader refuses it and
    its message suggests weights_only=False; lmsuite names the file and loads nothing."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_dir = tmp_path / "hf"
    transformers.BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, architectures=["BertForMaskedLM"],
    ).save_pretrained(hf_dir)  # fmt: skip
    torch.save({"x": torch.zeros(1), "args": _Trap()}, hf_dir / "pytorch_model.bin")
    _UNPICKLED.clear()
    monkeypatch.chdir(tmp_path)
    before = set(os.listdir(tmp_path))
    argv = ["finetune", f"--hf_dir={hf_dir}", "--task=vader_sentiment", "--output_dir=run"]
    code = cli.main(argv)
    err = capsys.readouterr().err
    expected = f"{hf_dir / 'pytorch_model.bin'} holds Python objects"
    _assert_one_clean_line(code, err, expected, tmp_path, before)
    assert "safetensors" in err and "weights_only=False" not in err
    assert _UNPICKLED == []  # the object was never built: nothing was loaded unsafely


_UNPICKLED: list[str] = []


class _Trap:
    """An object whose unpickling is recorded (it must never happen)."""

    def __init__(self):
        self.armed = True  # (a state, so that unpickling calls __setstate__)

    def __setstate__(self, state):
        _UNPICKLED.append("unpickled")
        self.__dict__.update(state)


# Two real processes in the fast suite (a gin run checked; argparse); the rest with `slow`
# (each process imports JAX and TensorFlow again: ~15 s on two cores).
_SLOW = pytest.mark.slow
SUBPROCESS_CASES = [
    pytest.param(*CASES[0], id="--model_dir="),
    pytest.param((*SMOKE, "--frobnicate"), "unrecognized arguments", id="--frobnicate"),
    pytest.param(
        (*SMOKE, "--gin.LEARNING_RATE=-1e-3"), "-0.001", id="LEARNING_RATE=-1e-3", marks=_SLOW
    ),
    pytest.param(
        (*SMOKE, "--gin.TASK=shakespeare_mlm"),
        "--gin.TASK=\"'shakespeare_mlm'\"",
        id="TASK=shakespeare_mlm",
        marks=_SLOW,
    ),
    pytest.param(
        ("tasks", "show", "wiki_sample_bert_mlm", "--n=-1"),
        "--n must be an integer >= 1",
        id="tasks --n=-1",
        marks=_SLOW,
    ),
]


@pytest.mark.parametrize("argv, expected", SUBPROCESS_CASES)
def test_the_real_process_prints_only_that_line(argv, expected, tmp_path):
    argv = _argv(argv, tmp_path)
    before = set(os.listdir(tmp_path))
    drop = ("TF_CPP_MIN_LOG_LEVEL", "XLA_FLAGS")  # (conftest's quiet: prove the CLI's own)
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "lmsuite.cli", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    _assert_one_clean_line(done.returncode, done.stderr, expected, tmp_path, before)
