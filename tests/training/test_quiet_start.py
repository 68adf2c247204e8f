"""A first run reads well: `lmsuite` prints none of TensorFlow's, absl's or the data libraries'
start-up noise unless `--verbose`, and keeps its own warnings and errors.

Each command runs in a subprocess, as `make pretrain` does: a fresh TensorFlow import, the
relaunch with the host malloc settings, and no TF_CPP_MIN_LOG_LEVEL (the suite's own setting,
from the Makefile and conftest.py, is taken out of the child's environment).
"""

import os
import re
import subprocess
import sys

import pytest

from lmsuite.cli import quiet

# What a run printed before the quiet start; written independently of lmsuite/cli/quiet.py, and
# broader (any C++ log line of TF, absl or XLA, any Python warning through absl).
NOISE = [
    re.compile(p)
    for p in (
        r"absl::InitializeLog",
        r"^[IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\]",
        r"oneDNN",
        r"cuda",
        r"TensorFlow binary is optimized",
        r"^WARNING:absl:",
        r"uncached FunctionDataset",
        r"dataset_info\.json",
    )
]
# A C++ log line of TensorFlow's or XLA's, whichever prints: which ones do depends on the CPU
# (the oneDNN line, "port.cc] oneDNN custom operations are on", only where TensorFlow turns oneDNN
# on by default: AVX-512 VNNI/BF16 or AMX, which CI's CPUs lack) and on what loads first.
# (Before absl is initialised the time reads 00:00:<seconds since the epoch>.)
CPP_LOG = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ \S+\.cc:\d+\] ")
TRAIN = [
    "train",
    "--gin_file=experiments/smoke.gin",
    "--gin.TRAIN_STEPS=2",
    "--gin.WARMUP_STEPS=1",
    "--gin.CHECKPOINT_EVERY=2",
    "--gin.train.progress_bar=False",
]


def _lmsuite(tmp_path, *argv) -> subprocess.CompletedProcess:
    # The Makefile's 8 virtual devices only slow a one-device run down; `make pretrain` has none.
    drop = ("TF_CPP_MIN_LOG_LEVEL", "XLA_FLAGS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return subprocess.run(
        [sys.executable, "-m", "lmsuite.cli", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def _noise(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if any(p.search(line) for p in NOISE)]


def test_train_prints_nothing_on_stderr_but_its_own_lines(tmp_path):
    run = _lmsuite(tmp_path, *TRAIN, f"--model_dir={tmp_path / 'run'}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "lmsuite train: step 2 of 2" in run.stdout
    assert _noise(run.stderr) == [], run.stderr
    others = [line for line in run.stderr.splitlines() if not line.startswith("lmsuite:")]
    assert others == [], run.stderr


@pytest.mark.slow
def test_verbose_train_prints_tensorflows_and_seqios_start_up_lines(tmp_path):
    run = _lmsuite(tmp_path, *TRAIN, f"--model_dir={tmp_path / 'run'}", "--verbose")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "lmsuite train: step 2 of 2" in run.stdout  # the same run, only louder
    lines = run.stderr.splitlines()
    assert any(CPP_LOG.search(x) for x in lines), lines
    assert any(x.startswith("WARNING:absl:Using an uncached FunctionDataset") for x in lines)


def test_own_warnings_and_errors_still_print_and_verbose_brings_the_noise_back(tmp_path):
    """A production task on a TFDS directory with a half-written dataset: TFDS warns about the
    variant folder (noise: the preflight says it better), lmsuite warns about the vocabulary and
    lists the unprepared dataset as an error. Quiet, only lmsuite's lines print; with
    --verbose, TensorFlow's and TFDS's too."""
    data_dir = tmp_path / "tfds"
    (data_dir / "wikipedia" / "20230601.en" / "1.0.0").mkdir(parents=True)
    argv = [
        *TRAIN,
        f"--model_dir={tmp_path / 'run'}",
        "--gin.TASK='wikipedia_bert_mlm'",
        "--gin.ModelConfig.vocab_size=8200",
        f"--tfds_data_dir={data_dir}",
    ]
    for flags in ([], ["--verbose"]):
        run = _lmsuite(tmp_path, *argv, *flags)
        assert run.returncode == 2, run.stderr[-3000:]
        lines = run.stderr.splitlines()
        assert any(x.startswith("lmsuite: warning: task 'wikipedia_bert_mlm'") for x in lines)
        assert any(x.startswith("lmsuite: configuration error") for x in lines), lines
        assert any("which is not prepared in the data dir" in x for x in lines), lines
        if not flags:
            assert _noise(run.stderr) == [], run.stderr
            assert all(x.startswith(("lmsuite:", "  - ")) for x in lines), lines
    noise = _noise(run.stderr)
    assert any(CPP_LOG.search(x) for x in noise), noise
    assert any("absl::InitializeLog" in x for x in noise), noise
    assert (
        f"WARNING:absl:Variant folder {data_dir}/wikipedia/20230601.en/1.0.0 has no "
        "dataset_info.json" in lines
    ), lines


def test_lines_other_than_tensorflows_load_noise_survive_the_import_filter(tmp_path):
    """What the filter drops is the loaders' known lines, not whatever came during the import."""
    script = (
        "import os, sys\n"
        "from lmsuite.cli import quiet\n"
        "with quiet._stderr_without(quiet.IMPORT_NOISE):\n"
        "    os.write(2, b'WARNING: All log messages before absl::InitializeLog() is called"
        " are written to STDERR\\n')\n"
        "    os.write(2, b'I0000 00:00:1796149921.567706   14214 port.cc:153] oneDNN custom"
        " operations are on.\\n')\n"
        "    os.write(2, b'E0000 00:00:1796149921.567706   14214 other.cc:1] a real error\\n')\n"
        "    print('a Python warning', file=sys.stderr)\n"
        "print('after', file=sys.stderr)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines() == [
        "E0000 00:00:1796149921.567706   14214 other.cc:1] a real error",
        "a Python warning",
        "after",
    ]


def test_verbose_removes_the_log_filter_a_quiet_start_installed():
    import logging

    absl_logger = logging.getLogger("absl")
    record = logging.LogRecord("absl", logging.WARNING, __file__, 1, quiet.ABSL_NOISE[0], (), None)
    quiet.quiet_start(verbose=False)
    assert not all(f.filter(record) for f in absl_logger.filters)
    quiet.quiet_start(verbose=True)
    assert all(f.filter(record) for f in absl_logger.filters)


@pytest.mark.parametrize(
    "flags", [["--verbose", "recipes", "list"], ["recipes", "list", "--verbose"]]
)
def test_verbose_is_accepted_before_or_after_the_command(flags):
    from lmsuite import cli

    assert cli.parse_args(flags).verbose is True
    assert cli.parse_args(["recipes", "list"]).verbose is False
