"""Host malloc settings: when they apply, the relaunch, their effect on XLA's step buffers."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lmsuite.training import host_malloc

ROOT = Path(__file__).resolve().parents[2]


def _clean_env(**extra) -> dict[str, str]:
    # One CPU device, as in training (the suite forces 8 for the mesh tests).
    dropped = {*host_malloc.SETTINGS, "XLA_FLAGS"}
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    return {**env, "JAX_PLATFORMS": "cpu", **extra}


def test_applies_only_on_a_cpu_step_without_user_settings():
    if not host_malloc.applies(_clean_env()):
        pytest.skip("not Linux with glibc")
    assert not host_malloc.applies(_clean_env(LMSUITE_HOST_MALLOC="0"))
    assert not host_malloc.applies(_clean_env(MALLOC_ARENA_MAX="4"))
    assert not host_malloc.applies(_clean_env(JAX_PLATFORMS="tpu"))
    assert host_malloc.applies(_clean_env(JAX_PLATFORMS="cpu,tpu"))


def test_makefile_sets_the_same_values():
    line = next(
        line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("HOST_")
    )
    assert dict(re.findall(r"(\w+)=(\S+)", line)) == host_malloc.SETTINGS


def test_relaunch_keeps_the_command_line_and_adds_the_settings():
    if not host_malloc.applies(_clean_env()):
        pytest.skip("not Linux with glibc")
    code = (
        "import json, os, sys\n"
        "print('before', flush=True)\n"
        "from lmsuite.training import host_malloc\n"
        "host_malloc.relaunch_with_settings()\n"
        "print(json.dumps([sys.argv[1:], {k: os.environ.get(k) for k in host_malloc.SETTINGS}]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "a b", "--flag=1"],
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.splitlines()
    # The first run printed "before" and was replaced; the relaunched run printed it again.
    assert out[:2] == ["before", "before"]
    argv, settings = json.loads(out[2])
    assert argv == ["a b", "--flag=1"] and settings == host_malloc.SETTINGS


# A jitted function whose 64 MB temporary (4096 x 4096 float32) XLA takes from malloc per call.
_FAULTS_PER_CALL = """
import json, resource
import jax, jax.numpy as jnp
f = jax.jit(lambda x: (jnp.sin(x @ x.T) @ x).sum())
x = jnp.ones((4096, 64))
for _ in range(10):  # until the heap's layout settles
    f(x).block_until_ready()
per_call = []
for _ in range(10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    f(x).block_until_ready()
    per_call.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(sorted(per_call)[5]))  # the median call: a call still settling is an outlier
"""


def test_settings_keep_xla_temporaries_mapped():
    if not host_malloc.applies(_clean_env()):
        pytest.skip("not Linux with glibc")

    def faults(env):
        run = subprocess.run(
            [sys.executable, "-c", _FAULTS_PER_CALL],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(run.stdout.splitlines()[-1])

    default, tuned = faults(_clean_env()), faults(_clean_env(**host_malloc.SETTINGS))
    # 64 MB is 16,384 pages: glibc's default faults them in again on every call (16,431 here).
    # The median call, not the mean: under a loaded suite a few calls of the tuned process
    # still fault while its heap settles (a mean of 6,568 once, against 0 alone).
    assert default > 10_000
    assert tuned < 0.2 * default


def test_active_only_with_every_setting():
    assert host_malloc.active(host_malloc.SETTINGS)
    assert not host_malloc.active({**host_malloc.SETTINGS, "MALLOC_ARENA_MAX": "2"})
    assert not host_malloc.active({})
