"""One writer per run directory: the lease is taken, refused while its holder lives, taken over
(with a warning) once the holder is gone, and released."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from lmsuite.training import lease


def _write(model_dir, **fields):
    record = dict(host=socket.gethostname(), pid=os.getpid(), started=0.0, renewed=time.time())
    record.update(fields)
    (model_dir / lease.LEASE_FILE).write_text(json.dumps(record))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_taken_renewed_and_released(tmp_path):
    held = lease.Lease(tmp_path)
    record = json.loads((tmp_path / lease.LEASE_FILE).read_text())
    assert record["host"] == socket.gethostname() and record["pid"] == os.getpid()
    held.renew()
    assert json.loads((tmp_path / lease.LEASE_FILE).read_text())["renewed"] >= record["renewed"]
    held.release()
    assert not (tmp_path / lease.LEASE_FILE).exists()


def test_a_live_holder_on_this_host_is_named_and_refuses(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _write(tmp_path, pid=holder.pid, started=1764780000.0)
        with pytest.raises(lease.LeaseHeldError, match=f"another process .*pid {holder.pid}"):
            lease.Lease(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert json.loads((tmp_path / lease.LEASE_FILE).read_text())["pid"] == holder.pid


def test_a_dead_holder_on_this_host_is_taken_over_with_a_warning(tmp_path, capsys):
    dead = _dead_pid()
    _write(tmp_path, pid=dead)
    lease.Lease(tmp_path)
    assert f"taking over the stale lease of host {socket.gethostname()} pid {dead}" in (
        capsys.readouterr().err
    )
    assert json.loads((tmp_path / lease.LEASE_FILE).read_text())["pid"] == os.getpid()


def test_another_hosts_lease_holds_until_it_is_stale(tmp_path, capsys):
    _write(tmp_path, host="worker-elsewhere", pid=1, renewed=time.time() - 10)
    with pytest.raises(lease.LeaseHeldError, match=r"worker-elsewhere pid 1.*renewed 1\d s ago"):
        lease.Lease(tmp_path, stale_after=3600)
    _write(tmp_path, host="worker-elsewhere", pid=1, renewed=time.time() - 7200)
    lease.Lease(tmp_path, stale_after=3600)
    assert "not renewed for 7200 s" in capsys.readouterr().err


def test_a_torn_lease_is_replaced(tmp_path, capsys):
    (tmp_path / lease.LEASE_FILE).write_text('{"host": "a", "pi')
    lease.Lease(tmp_path)
    assert "replacing the unreadable lease" in capsys.readouterr().err
