"""The user's own text through the CLI: `lmsuite vocab train --text_files`, `lmsuite train
--train_files` for a recipe, and a run that `lmsuite eval` and `lmsuite.load` reopen with nothing
named again (run.json records the text task)."""

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest
import seqio

from lmsuite import cli
from lmsuite.data import text_files
from tests.data.generated_text import write_text_files
from tests.training import cli_errors

T5 = [
    "--gin_file=experiments/t5_1_1_tiny.gin",
    "--gin.SEQUENCE_LENGTH={'inputs': 64, 'targets': 16}",
]
BERT = [
    "--gin_file=experiments/bert_tiny.gin",
    "--gin.SEQUENCE_LENGTH={'input_ids': 64, 'masked_ids': 10}",
    "--gin.WARMUP_STEPS=0",
]
SHORT = [  # a few steps, one checkpoint, one held-out batch
    "--gin.ModelConfig.vocab_size=512",  # the 412-piece vocabulary + 100 sentinels
    "--gin.TRAIN_STEPS=2",
    "--gin.BATCH_SIZE=8",
    "--gin.CHECKPOINT_EVERY=2",
    "--gin.train.eval_batches=1",
    "--gin.train.progress_bar=False",
]


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("my_text")
    write_text_files(directory)
    return directory


@pytest.fixture(scope="module")
def vocab_model(text_dir, tmp_path_factory):
    """`lmsuite vocab train --text_files` on the folder: the model's path (printed on stdout)."""
    out = tmp_path_factory.mktemp("vocab")
    argv = ["vocab", "train", f"--text_files={text_dir}/doc[0-2].txt",
            f"--text_files={text_dir}/doc[3-5].txt", "--size=412", f"--out_dir={out}"]  # fmt: skip
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.main(argv) == 0
    (path,) = printed.getvalue().split()
    return path


def _fails(capsys, *argv) -> list[str]:
    code = cli.main(list(argv))
    err = capsys.readouterr().err
    assert code == cli.CONFIG_ERROR_EXIT_CODE, err[-3000:]
    return cli_errors.problem_lines(err)


# ------------------------------------------------------------------------------ vocab train
def test_vocab_train_writes_a_model_with_lmsuites_ids_and_says_where(vocab_model, text_dir):
    assert vocab_model.endswith("-sp412-seed0.model") and os.path.isfile(vocab_model)
    vocab = seqio.SentencePieceVocabulary(vocab_model, extra_ids=100)
    assert vocab.vocab_size == 512
    assert [vocab.tokenizer.id_to_piece(i) for i in range(7)] == [
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<s>", "</s>"]  # fmt: skip
    assert vocab.decode([511]) == "<extra_id_0>"


def test_vocab_train_with_a_file_as_corpus_points_at_text_files(capsys):
    (error,) = _fails(capsys, "vocab", "train", "--corpus=corpus.txt", "--size=400")
    assert "--corpus='corpus.txt' is not an embedded corpus" in error
    assert "one of ['peoples_daily', 'shakespeare', 'wiki_sample']" in error
    assert "your own files go in --text_files (e.g. --text_files=corpus.txt)" in error
    (error,) = _fails(capsys, "vocab", "train", "--size=400")
    assert "takes one of --corpus=NAME" in error


def test_vocab_train_names_a_glob_that_matches_nothing(capsys, tmp_path):
    (error,) = _fails(capsys, "vocab", "train", f"--text_files={tmp_path}/*.txt", "--size=400")
    assert error == f"  - text_files: '{tmp_path}/*.txt' matches no file"


# ------------------------------------------------------------------------------ train
def test_text_flags_without_train_files_are_refused(capsys, tmp_path):
    (error,) = _fails(capsys, "train", *T5, "--validation_files=v.txt", f"--model_dir={tmp_path}")
    assert "--validation_files describe the --train_files task; add --train_files=GLOB" in error


def test_train_files_and_a_task_binding_are_refused(capsys, tmp_path, text_dir):
    (error,) = _fails(capsys, "train", *T5, f"--train_files={text_dir}/*.txt",
                      "--gin.TASK='wiki_sample_bert_mlm'", f"--model_dir={tmp_path}")  # fmt: skip
    assert "drop --gin.TASK='wiki_sample_bert_mlm'" in error


def test_a_vocab_the_model_size_does_not_match_is_refused(capsys, tmp_path, text_dir, vocab_model):
    files, model_dir = f"--train_files={text_dir}/*.txt", f"--model_dir={tmp_path}/r"
    errors = _fails(capsys, "train", *BERT, files, f"--vocab={vocab_model}", model_dir)
    assert len(errors) == 1, errors
    assert "ModelConfig.vocab_size = 8100, but task 'text_bert_mlm_nsp_" in errors[0]
    assert f"tokenizes with {vocab_model} (512 ids)" in errors[0]
    assert "set --gin.ModelConfig.vocab_size=512" in errors[0]
    assert not (tmp_path / "r").exists()


def test_a_t5_run_on_text_files_reopens_from_its_run_json(capsys, tmp_path, text_dir, vocab_model):
    run = tmp_path / "run"
    argv = ["train", *T5, *SHORT, f"--train_files={text_dir}/*.txt", f"--vocab={vocab_model}"]
    assert cli.main([*argv, f"--model_dir={run}"]) == 0, capsys.readouterr().err[-3000:]
    captured = capsys.readouterr()
    record = json.loads((run / "run.json").read_text())
    name = record["task"]
    assert name.startswith("text_t5_span_corruption_") and f"on {name!r}" in captured.out
    assert f"task {name!r} (t5_span_corruption for recipe 't5_span_corruption'): 5 train and " \
           "1 validation documents" in captured.err  # fmt: skip
    assert record["task_modules"] == []
    assert record["text_task"]["train_files"] == [str(p) for p in sorted(text_dir.glob("*.txt"))]
    assert record["text_task"]["vocabulary"] == vocab_model
    # As in a new process: the task is not registered; load and eval register it from run.json.
    seqio.TaskRegistry.remove(name)
    del text_files.TEXT_TASKS[name]
    assert cli.main(["eval", f"--model_dir={run}", "--batch_size=2", "--max_batches=1"]) == 0
    assert f"lmsuite eval: {name} validation at step 2" in capsys.readouterr().out
    import lmsuite

    (text,) = lmsuite.load(str(run)).generate("The old farmer", max_new_tokens=3)
    assert isinstance(text, str)


# ------------------------------------------------------------------------- end to end
def _lmsuite(cwd, *argv, code: str | None = None) -> str:
    """`lmsuite ARGV` (or `python -c CODE`) in a new process in `cwd`; its stdout."""
    command = [sys.executable, "-c", code] if code else [sys.executable, "-m", "lmsuite", *argv]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


# slow: five fresh processes per recipe (about 3 minutes on 2 cores); the fast suite keeps the
# in-process T5 run above
@pytest.mark.slow
@pytest.mark.parametrize(
    "experiment, use",
    [
        (T5, "generate('Every old farmer', max_new_tokens=4)"),
        (BERT, "fill_mask('The old farmer [MASK] the bridge.', top_k=2)"),
    ],  # fmt: skip
    ids=["t5_1_1_tiny", "bert_tiny"],
)
def test_users_text_to_a_trained_model_in_fresh_processes(tmp_path, experiment, use):
    (tmp_path / "my_text").mkdir()
    write_text_files(tmp_path / "my_text")
    (model,) = _lmsuite(tmp_path, "vocab", "train", "--text_files=my_text/*.txt", "--size=412",
                        "--out_dir=vocab").split()  # fmt: skip
    _lmsuite(tmp_path, "train", *experiment, *SHORT, "--train_files=my_text/*.txt",
             f"--vocab={model}", "--model_dir=run")  # fmt: skip
    evaluated = _lmsuite(tmp_path, "eval", "--model_dir=run", "--batch_size=2")
    assert "validation at step 2" in evaluated and "loss:" in evaluated
    printed = _lmsuite(tmp_path, code=f"import lmsuite; print(lmsuite.load('run').{use})")
    assert printed.strip().startswith("[")
