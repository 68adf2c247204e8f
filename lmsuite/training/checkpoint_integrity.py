"""A checksum for every file of a checkpoint step, written inside the step before Orbax commits
it, and checked before the step is loaded.

Orbax commits a step atomically (on a local disk it renames `<step>.orbax-checkpoint-tmp` to
`<step>` once every process has written its shards; on a bucket it writes
`commit_success.txt`), so a step that Orbax lists is complete. What Orbax does not check is
that the bytes read back are the bytes written: a flipped bit in an array file restores without
a word as NaN or garbage parameters. The manifest (`COMMITTED`, JSON) maps each file under the
step's items to its size and SHA-256:

  {"format": 2, "files": {"state/d/5e85...": {"bytes": 4000123, "sha256": "9f2c..."}, ...}}

Steps written by lmsuite before checksums hold a map from file to size only ({"state/...": 123});
those are checked for sizes. A step Orbax committed without any manifest (an older lmsuite that
was killed before writing its marker) is complete by Orbax's commit but cannot be checked, and
`verify` says so rather than refusing it.
"""

import hashlib
import json

from etils import epath

MANIFEST = "COMMITTED"
FORMAT = 2
_CHUNK = 8 << 20
# Written by Orbax after our manifest (the commit itself) or rewritten by it later: not part of
# the state's bytes.
_NOT_CHECKED = {MANIFEST, MANIFEST + ".tmp", "commit_success.txt", "_CHECKPOINT_METADATA"}


class DamagedCheckpointError(ValueError):
    """A checkpoint step that must not be loaded; the message names the step, file and damage."""


def _files(step_dir: epath.Path) -> list[tuple[str, epath.Path]]:
    """(path relative to the step, path) for every checked file, sorted."""
    found = []
    pending = [step_dir]
    while pending:  # epath has no rglob (on GCS it would be one listing per directory anyway)
        for path in pending.pop().iterdir():
            if path.is_dir():
                pending.append(path)
            elif path.name not in _NOT_CHECKED or path.parent != step_dir:
                found.append((str(path.relative_to(step_dir)), path))
    return sorted(found)


def sha256(path: epath.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def record(step_dir: str | epath.PathLike) -> None:
    """Writes the manifest of `step_dir` (atomically: a partial manifest is never read)."""
    step_dir = epath.Path(step_dir)
    files = {
        name: {"bytes": path.stat().length, "sha256": sha256(path)}
        for name, path in _files(step_dir)
    }
    tmp = step_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps({"format": FORMAT, "files": files}, indent=0))
    tmp.rename(step_dir / MANIFEST)


def verify(step_dir: str | epath.PathLike) -> bool:
    """Checks every file of a committed step against its manifest.

    Returns:
      True when the checksums matched; False for a step with no manifest, which Orbax's commit
      says is complete but whose bytes cannot be checked.
    Raises:
      DamagedCheckpointError: naming the step, the file and what is wrong with it.
    """
    step_dir = epath.Path(step_dir)
    manifest = step_dir / MANIFEST
    if not manifest.exists():
        return False
    try:
        expected = json.loads(manifest.read_text())
    except json.JSONDecodeError as error:
        raise DamagedCheckpointError(
            f"checkpoint {step_dir}: unreadable {MANIFEST}: {error}"
        ) from error
    if expected.get("format") == FORMAT:
        expected = expected["files"]
    else:  # lmsuite before checksums: {name: size}
        expected = {name: {"bytes": size} for name, size in expected.items()}
    found = dict(_files(step_dir))
    problems = []
    for name, want in expected.items():
        if name not in found:
            problems.append(f"{name} is missing")
            continue
        size = found[name].stat().length
        if size != want["bytes"]:
            problems.append(f"{name} has {size} bytes, {want['bytes']} were written")
        elif "sha256" in want and sha256(found[name]) != want["sha256"]:
            problems.append(
                f"{name} has the right size but its SHA-256 differs from the one written"
            )
    if problems:
        raise DamagedCheckpointError(f"checkpoint {step_dir} is damaged: " + "; ".join(problems))
    return True
