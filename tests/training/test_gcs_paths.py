"""Model-dir files on gs:// go through epath with the URI intact.

No bucket is reachable here, so gs:// is served from a local directory: epath's OS backend with
every call's path rewritten from gs://... to tmp/fake_gcs/.... A path that lost its scheme on
the way (pathlib turns gs://b into gs:/b) would land under the working directory instead, which
each test checks is empty.
"""

import json

import jax
import numpy as np
import pytest
from etils import epath
from etils.epath import gpath, testing
from jax.sharding import NamedSharding, PartitionSpec

from lmsuite import partitioning
from lmsuite.training import checkpoint_integrity, checkpointing, metrics, report


@pytest.fixture
def fake_gcs(tmp_path, monkeypatch):
    root = tmp_path / "fake_gcs"
    root.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)  # else gs:// always uses TF

    def local(path):
        text = str(path)
        if text.startswith(str(root)):  # the OS backend calling itself, already rewritten
            return text
        if not text.startswith("gs://"):
            raise AssertionError(f"a model-dir path lost its gs:// scheme: {text!r}")
        return str(root / text[len("gs://") :])

    def redirect(original, path, *args, **kwargs):
        args = [local(a) if str(a).startswith("gs://") else a for a in args]
        return original(local(path), *args, **kwargs)

    def glob(original, pattern):
        return ["gs://" + str(epath.Path(p).relative_to(root)) for p in original(local(pattern))]

    def listdir(original, path):
        return original(local(path))

    names = ["copy", "exists", "isdir", "makedirs", "mkdir", "open", "remove", "rename"]
    names += ["replace", "rmtree", "stat", "walk"]
    with testing.mock_epath(**{n: redirect for n in names}, glob=glob, listdir=listdir):
        yield root
    assert not any(cwd.iterdir()), sorted(map(str, cwd.rglob("*")))


def test_metrics_jsonl_appends_and_reads_one_history_on_gcs(fake_gcs):
    path = epath.Path("gs://bucket/run/metrics.jsonl")
    path.parent.mkdir(parents=True)
    records = [{"step": s, "loss": 1.0 / s} for s in (10, 20, 30)]
    before = "".join(json.dumps(r) + "\n" for r in records) + '{"step": 40, "lo'
    path.write_text(before)
    assert metrics.read_jsonl("gs://bucket/run/metrics.jsonl") == records
    metrics.mark_resumed(path, 20)
    with path.open("a") as f:  # what MetricsLog.write appends
        f.write(json.dumps({"step": 30, "loss": 0.5}) + "\n")
    assert metrics.read_jsonl(path) == [*records[:2], {"step": 30, "loss": 0.5}]
    assert (fake_gcs / "bucket/run/metrics.jsonl").read_text().startswith(before + "\n")


def test_checkpoint_manifest_records_and_verifies_on_gcs(fake_gcs):
    assert str(checkpointing.absolute("gs://bucket/run")) == "gs://bucket/run"
    step = epath.Path("gs://bucket/run/checkpoints/10")
    (step / "state" / "d").mkdir(parents=True)
    (step / "state" / "d" / "array").write_bytes(b"x" * 100)
    (step / "data").mkdir()
    (step / "data" / "position.json").write_text('{"batches_consumed": 10}')
    assert checkpointing.verify(step) is False  # no manifest: nothing to check against
    checkpoint_integrity.record(step)
    manifest = json.loads(
        (fake_gcs / "bucket/run/checkpoints/10" / checkpointing.MANIFEST).read_text()
    )
    assert sorted(manifest["files"]) == ["data/position.json", "state/d/array"]
    assert checkpointing.verify("gs://bucket/run/checkpoints/10") is True
    (step / "state" / "d" / "array").write_bytes(b"y" * 100)  # same size, other bytes
    with pytest.raises(checkpointing.DamagedCheckpointError, match="state/d/array has the right"):
        checkpointing.verify(step)
    (step / "state" / "d" / "array").write_bytes(b"x" * 99)  # truncated
    with pytest.raises(checkpointing.DamagedCheckpointError, match="has 99 bytes, 100 were"):
        checkpointing.verify(step)


def test_report_files_are_written_to_gcs(fake_gcs):
    epath.Path("gs://bucket/run").mkdir(parents=True)
    report.plot_loss_curve(
        [{"step": s, "loss": 5.0 - s / 10, "mlm_accuracy": s / 100} for s in range(1, 20)],
        "gs://bucket/run/loss_curve.png",
        baseline=0.05,
    )
    assert (fake_gcs / "bucket/run/loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    params = {"dense": {"kernel": np.zeros((2, 3), np.float32)}}
    mesh = partitioning.make_mesh(devices=jax.devices()[:1])
    report.write_model_info(
        "gs://bucket/run/model-info.txt",
        params,
        {"dense": {"kernel": PartitionSpec("embed", "mlp")}},
        {"dense": {"kernel": NamedSharding(mesh, PartitionSpec(None, None))}},
    )
    assert "6 parameters" in (fake_gcs / "bucket/run/model-info.txt").read_text()
