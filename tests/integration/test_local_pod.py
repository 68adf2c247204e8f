"""The multi-host launch path without a TPU: `tpu_scripts/launch.sh --local 2` starts
`lmsuite train --distributed` as two processes of two CPU devices each (one coordinator, gloo
collectives, per-host input, one shared model dir).

With `train.input_sharding = 'replicated'` the global batches do not depend on the number of
hosts, so the pod logs the losses of one process with the same four devices and global batch
(to float rounding: gloo sums across processes in another order than XLA within one). Killing
one of the pod's processes stops the pod; launching it again resumes from the newest committed
checkpoint, bitwise: the resumed pod's losses equal an uninterrupted pod's.
"""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.integration import smoke_runs as smoke

LAUNCH = smoke.REPO / "tpu_scripts" / "launch.sh"
REPLICATED = "--gin.train.input_sharding='replicated'"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _pod(model_dir: Path) -> subprocess.Popen:
    env = smoke.env(MODEL_DIR=str(model_dir), LMSUITE=str(Path(sys.executable).parent / "lmsuite"))
    env.pop("XLA_FLAGS")  # the script sets each process's devices
    return subprocess.Popen(
        [str(LAUNCH), "--local", "2", "--devices-per-process", "2", "--port", str(_free_port()),
         "--", "--gin_file=experiments/smoke.gin", REPLICATED],
        env=env, cwd=smoke.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _run_pod(model_dir: Path, attempt: int = 1) -> dict[int, float]:
    pod = _pod(model_dir)
    _, stderr = pod.communicate(timeout=900)
    assert pod.returncode == 0, stderr[-3000:]
    logs = model_dir / "logs"
    assert f"attempt {attempt}: logs in {logs}/attempt-{attempt}/" in stderr
    assert (logs / "latest").readlink() == Path(f"attempt-{attempt}")
    for k in range(1, attempt + 1):  # an earlier attempt's logs are kept
        assert sorted(p.name for p in (logs / f"attempt-{k}").iterdir()) == [
            "process_0.log",
            "process_1.log",
        ]
    return smoke.losses(model_dir)


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("single")
    # launch.sh gives the pod's processes XLA_FLAGS of their own (XLA's default compile level,
    # not the fast suite's): this run matches them
    result = smoke.run(model_dir, REPLICATED, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert result.returncode == 0, result.stderr[-3000:]
    return smoke.losses(model_dir)


@pytest.fixture(scope="module")
def pod_losses(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("pod")
    losses = _run_pod(model_dir)
    assert smoke.committed_steps(model_dir) == [10, 20, 30]
    return losses


def test_two_processes_log_the_losses_of_one(single_process, pod_losses):
    assert sorted(pod_losses) == sorted(single_process) == list(range(1, smoke.SMOKE_STEPS + 1))
    steps = sorted(single_process)
    np.testing.assert_allclose(
        [pod_losses[s] for s in steps], [single_process[s] for s in steps], rtol=1e-6
    )
    assert pod_losses[30] < pod_losses[1]


def _kill_one_process_and_relaunch(pod_losses, model_dir: Path, seed: int, after_commit=False):
    # After step 23 step 10 is committed (the save of step 20 waited for it) and step 30 is
    # not: the relaunch must resume, not start over or find it done. With `after_commit`, the
    # kill lands right after step 20's save was committed, and the relaunch resumes from it.
    kill_after = random.Random(seed).randint(23, smoke.SMOKE_STEPS - 3)
    pod = _pod(model_dir)
    deadline = time.monotonic() + 600
    while not (
        (model_dir / "checkpoints" / "20").exists()
        if after_commit
        else max(smoke.losses(model_dir) or {0: 0}) >= kill_after
    ):
        assert pod.poll() is None, pod.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the pod did not reach the step"
        time.sleep(0.01 if after_commit else 0.2)
    victim = subprocess.run(
        ["pgrep", "-f", "--", f"--process_id=1 --model_dir={model_dir}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for pid in victim:
        os.kill(int(pid), signal.SIGKILL)
    _, stderr = pod.communicate(timeout=300)
    assert pod.returncode != 0
    assert "attempt 1: process 1 exited with status" in stderr, stderr[-3000:]
    assert 10 in smoke.committed_steps(model_dir)
    assert smoke.SMOKE_STEPS not in smoke.committed_steps(model_dir)
    resumed = _run_pod(model_dir, attempt=2)
    assert resumed == pod_losses, f"process 1 killed after step {kill_after}"
    if after_commit:
        log = (model_dir / "logs" / "attempt-2" / "process_0.log").read_text()
        assert "resumed from step 20 (committed " in log, log[-3000:]


# slow: the fast suite keeps the two-process losses and test_faults' single-process kill -9 resume
@pytest.mark.slow
def test_killing_one_process_then_relaunching_resumes_bitwise(pod_losses, tmp_path):
    _kill_one_process_and_relaunch(pod_losses, tmp_path / "trial0", seed=0)


@pytest.mark.slow
def test_a_kill_right_after_a_save_was_committed_resumes_from_that_save(pod_losses, tmp_path):
    _kill_one_process_and_relaunch(pod_losses, tmp_path / "after_commit", 0, after_commit=True)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_killing_one_process_at_other_steps(pod_losses, tmp_path, seed):
    _kill_one_process_and_relaunch(pod_losses, tmp_path / f"trial{seed}", seed=seed)
