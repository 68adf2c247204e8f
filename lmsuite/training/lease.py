"""One writer per run directory: a lease file, MODEL_DIR/LEASE, held while `lmsuite train` runs.

Two trainings writing one directory interleave their metrics and race each other's checkpoint
saves; the second is refused instead, with the holder named. The lease records who holds it:

  {"host": "worker-0", "pid": 4242, "started": 1764780000.0, "renewed": 1764780600.0}

A lease whose holder is gone is taken over with a warning: on the same host, when its pid no
longer runs; on another host (a pod relaunched on new VMs), when it was last renewed more than
`stale_after` seconds ago. The holder renews it at every checkpoint save. Orbax has no such
lock (its multi-process barriers coordinate the processes of one run, not two runs).

Creating the file is atomic on a local disk (O_EXCL); on a bucket (gs://) there is no exclusive
create through epath, so the lease is written and read back: two launches in the same second
could both pass, which the pod scripts already prevent by refusing a second launch per worker.
"""

import json
import os
import socket
import sys
import time

from etils import epath

LEASE_FILE = "LEASE"
STALE_AFTER_SECONDS = 3600.0


class LeaseHeldError(RuntimeError):
    """Another live process holds the run directory's lease; the message names it."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class Lease:
    """Acquired on construction; `renew()` at each save, `release()` at the end.

    Raises:
      LeaseHeldError: when a live holder has it (naming host, pid and start time).
    """

    def __init__(self, model_dir: epath.Path, *, stale_after: float = STALE_AFTER_SECONDS):
        self.path = epath.Path(model_dir) / LEASE_FILE
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.started = time.time()
        self._stale_after = stale_after
        holder = self._read()
        if holder is not None:
            self._check_stale(holder, stale_after)
        self._create(replace=holder is not None)

    def _record(self) -> str:
        fields = dict(host=self.host, pid=self.pid, started=self.started, renewed=time.time())
        return json.dumps(fields) + "\n"

    def _read(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, OSError):
            return {}  # torn by a kill while it was written: nobody can be holding it

    def _check_stale(self, holder: dict, stale_after: float) -> None:
        if not holder:
            print(f"lmsuite: replacing the unreadable lease {self.path}", file=sys.stderr)
            return
        who = (
            f"host {holder.get('host')} pid {holder.get('pid')}, started "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(holder.get('started', 0)))}"
        )
        age = time.time() - float(holder.get("renewed", 0))
        if holder.get("host") == self.host:
            if _alive(int(holder.get("pid", -1))) and holder.get("pid") != self.pid:
                raise LeaseHeldError(
                    f"{self.path.parent} is being trained by another process ({who}); one run "
                    f"directory takes one writer: wait for it, stop it, or choose another "
                    f"--model_dir"
                )
            why = "that process is gone"
        elif age < stale_after:
            raise LeaseHeldError(
                f"{self.path.parent} is being trained by {who}, lease renewed {age:.0f} s ago; "
                f"one run directory takes one writer. If that process is dead, delete "
                f"{self.path} (or wait: a lease not renewed for {stale_after:.0f} s is taken over)"
            )
        else:
            why = f"not renewed for {age:.0f} s"
        print(f"lmsuite: taking over the stale lease of {who} ({why})", file=sys.stderr)

    def _create(self, *, replace: bool) -> None:
        if "://" in str(self.path) or replace:
            self.path.write_text(self._record())
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:  # created between our read and now: read it again, once
            holder = self._read()
            self._check_stale(holder or {}, self._stale_after)
            self.path.write_text(self._record())
            return
        with os.fdopen(fd, "w") as f:
            f.write(self._record())

    def renew(self) -> None:
        """Rewrites the lease's `renewed` time (a heartbeat for other hosts)."""
        self.path.write_text(self._record())

    def release(self) -> None:
        """Removes the lease if it is still ours."""
        holder = self._read()
        if holder and holder.get("host") == self.host and holder.get("pid") == self.pid:
            self.path.unlink(missing_ok=True)
