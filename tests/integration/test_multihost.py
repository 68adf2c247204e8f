"""Two processes on localhost (jax.distributed, CPU collectives over gloo) give the losses of
one process with the same global batch and the same 2-device mesh."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests import xla_flags
from tests.integration.smoke_runs import REPO


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _env(devices: int) -> dict[str, str]:
    return dict(
        os.environ,
        PYTHONPATH=str(REPO),
        JAX_PLATFORMS="cpu",
        TF_CPP_MIN_LOG_LEVEL="3",
        XLA_FLAGS=xla_flags.with_devices(devices),
    )


@pytest.mark.slow  # three process launches: about a minute on 2 cores
def test_two_processes_match_one(tmp_path):
    worker = [sys.executable, "-m", "tests.integration.multihost_worker"]
    single = subprocess.run(
        [*worker, str(tmp_path / "single.json")],
        env=_env(2), cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr[-3000:]
    port = _free_port()
    processes = [
        subprocess.Popen(
            [*worker, str(tmp_path / "multi.json"), str(pid), "2", str(port)],
            env=_env(1),
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for pid in range(2)
    ]
    for p in processes:
        _, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr[-3000:]
    reference = json.loads((tmp_path / "single.json").read_text())
    multi = json.loads((tmp_path / "multi.json").read_text())
    assert reference["devices"] == multi["devices"] == 2
    np.testing.assert_allclose(multi["losses"], reference["losses"], rtol=1e-5)
    assert multi["losses"][-1] != multi["losses"][0]
