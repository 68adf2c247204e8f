"""Checkpoints: round trip, keep policy, one save in flight, committed when written, damaged
steps named with their file and skipped, unfinished saves named and cleaned, failures named."""

import json
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from lmsuite.training import checkpointing
from lmsuite.training.train_state import TrainState

TX = optax.adam(1e-2)


def _state(step: int) -> TrainState:
    params = {
        "dense": {"kernel": jnp.arange(64.0 * 64).reshape(64, 64) + step, "bias": jnp.ones(3)}
    }
    return TrainState(
        step=jnp.asarray(step, jnp.int32),
        params=params,
        opt_state=TX.init(params),
        skipped=jnp.zeros((), jnp.int32),
        tx=TX,
    )


def _abstract():
    return jax.eval_shape(lambda: _state(0))


def _save_steps(directory, steps, keep=3):
    _save_steps_of(directory, {step: _state(step) for step in steps}, keep)


def _save_steps_of(directory, states, keep=3):
    ckpt = checkpointing.Checkpointer(directory=directory, keep=keep)
    for step, state in states.items():
        ckpt.save(step, state, {"batches_consumed": 10 * step})
    ckpt.close()


def test_round_trip_restores_state_and_data_position(tmp_path):
    _save_steps(tmp_path / "ckpt", [1, 2])
    ckpt = checkpointing.Checkpointer(directory=tmp_path / "ckpt")
    state, data = ckpt.restore_latest(_abstract())
    assert data == {"batches_consumed": 20}
    assert int(state.step) == 2
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(_state(2)), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_newest_data_position_is_read_without_the_state_and_without_writing(tmp_path):
    """What a resume's checks read before the run restores anything (`resume_checks`)."""
    directory = tmp_path / "ckpt"
    assert checkpointing.newest_data_position(directory) == 0
    assert not directory.exists()  # the read creates nothing
    _save_steps(directory, [1, 2])
    listing = sorted(p.relative_to(directory) for p in directory.rglob("*"))
    assert checkpointing.newest_data_position(directory) == 20
    (directory / "2" / "data" / "metadata").write_text("{not json")  # a damaged record
    assert checkpointing.newest_data_position(directory) == 10  # the step before it
    assert sorted(p.relative_to(directory) for p in directory.rglob("*")) == listing


def test_keep_policy_and_empty_directory(tmp_path):
    _save_steps(tmp_path / "ckpt", [1, 2, 3, 4, 5], keep=2)
    assert checkpointing.Checkpointer(directory=tmp_path / "ckpt").committed_steps() == [4, 5]
    assert (
        checkpointing.Checkpointer(directory=tmp_path / "empty").restore_latest(_abstract()) is None
    )
    with pytest.raises(ValueError, match="keep must be >= 2"):
        checkpointing.Checkpointer(directory=tmp_path / "x", keep=1)


def _largest_file(step_dir):
    return max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def test_a_finished_save_is_committed_without_another_save_or_close(tmp_path):
    directory = tmp_path / "ckpt"
    ckpt = checkpointing.Checkpointer(directory=directory, nice=19)
    ckpt.save(1, _state(1), {"batches_consumed": 10})
    deadline = time.monotonic() + 120
    while not (directory / "1").exists():  # Orbax's rename: the commit
        assert time.monotonic() < deadline, "step 1 was not committed"
        time.sleep(0.05)
    manifest = json.loads((directory / "1" / checkpointing.MANIFEST).read_text())
    assert any(name.startswith("state/") for name in manifest["files"])
    assert all(len(f["sha256"]) == 64 for f in manifest["files"].values())
    checkpointing.verify(directory / "1")
    ckpt.close()


def test_one_save_in_flight_the_next_waits_for_its_commit(tmp_path):
    directory = tmp_path / "ckpt"
    ckpt = checkpointing.Checkpointer(directory=directory, nice=19)
    slow_start = ckpt.manager.save

    def slow(step, *args, **kwargs):
        time.sleep(1.5)  # a save that outlasts the checkpoint interval
        return slow_start(step, *args, **kwargs)

    ckpt.manager.save = slow
    ckpt.save(1, _state(1), {"batches_consumed": 10})
    assert not (directory / "1").exists()
    ckpt.save(2, _state(2), {"batches_consumed": 20})
    # save(2) returned only once step 1 was committed, and counted the wait.
    assert (directory / "1" / checkpointing.MANIFEST).exists()
    assert ckpt.wait_seconds >= 1.0
    ckpt.close()
    assert checkpointing.Checkpointer(directory=directory).committed_steps() == [1, 2]


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["missing_file", "truncated_array", "flipped_byte"])
def test_damaged_newest_step_is_named_and_previous_restored(tmp_path, capsys, damage):
    directory = tmp_path / "ckpt"
    _save_steps(directory, [1, 2])
    step_dir = directory / "2"
    victim = _largest_file(step_dir)
    name = str(victim.relative_to(step_dir))
    if damage == "missing_file":
        victim.unlink()
        expected = f"{name} is missing"
    elif damage == "truncated_array":
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
        expected = f"{name} has {victim.stat().st_size} bytes"
    else:
        _flip_a_byte(victim)
        expected = f"{name} has the right size but its SHA-256 differs"
    ckpt = checkpointing.Checkpointer(directory=directory)
    state, data = ckpt.restore_latest(_abstract())
    err = capsys.readouterr().err
    assert "not loading checkpoint step 2" in err and expected in err
    assert int(state.step) == 1 and data == {"batches_consumed": 10}
    assert not step_dir.exists() and any((tmp_path / "ckpt.damaged").iterdir())
    # Training continues from step 1 and can save step 2 again.
    ckpt.save(2, _state(2), {"batches_consumed": 20})
    ckpt.close()
    assert checkpointing.Checkpointer(directory=directory).committed_steps() == [1, 2]


def test_a_step_without_checksums_loads_with_a_warning(tmp_path, capsys):
    """A step an older lmsuite left without its marker is complete by Orbax's commit."""
    directory = tmp_path / "ckpt"
    _save_steps(directory, [1, 2])
    (directory / "2" / checkpointing.MANIFEST).unlink()
    state, _ = checkpointing.Checkpointer(directory=directory).restore_latest(_abstract())
    assert int(state.step) == 2
    assert "checkpoint step 2 has no checksums" in capsys.readouterr().err


def test_a_manifest_of_sizes_only_is_still_checked_for_sizes(tmp_path, capsys):
    directory = tmp_path / "ckpt"
    _save_steps(directory, [1, 2])
    manifest = directory / "2" / checkpointing.MANIFEST
    files = json.loads(manifest.read_text())["files"]
    manifest.write_text(json.dumps({name: f["bytes"] for name, f in files.items()}))
    checkpointing.verify(directory / "2")
    victim = _largest_file(directory / "2")
    victim.write_bytes(victim.read_bytes()[:100])
    with pytest.raises(checkpointing.DamagedCheckpointError, match="has 100 bytes"):
        checkpointing.verify(directory / "2")


def test_unfinished_saves_are_named_and_removed_at_start(tmp_path, capsys):
    directory = tmp_path / "ckpt"
    _save_steps(directory, [1])
    # The name the pinned Orbax gives a step while it is being written.
    leftover = directory / f"2{checkpointing.TMP_SUFFIX}"
    (leftover / "state").mkdir(parents=True)
    checkpointing.Checkpointer(directory=directory)
    assert not leftover.exists()
    assert f"removing {leftover}: an unfinished save" in capsys.readouterr().err


def test_complete_checkpoint_of_another_shape_is_an_error_not_a_fallback(tmp_path):
    directory = tmp_path / "ckpt"
    _save_steps(directory, [1, 2])
    other = jax.eval_shape(
        lambda: _state(0).replace(
            params={"dense": {"kernel": jnp.zeros((8, 8)), "bias": jnp.ones(3)}}
        )
    )
    ckpt = checkpointing.Checkpointer(directory=directory)
    refused = (
        r"checkpoint .*2 is committed and complete but does not .*: "
        r"params/dense/kernel is \(64, 64\) in the checkpoint and \(8, 8\) in this run$"
    )
    with pytest.raises(ValueError, match=refused):
        ckpt.restore_latest(other)  # the optimizer's state kept its shapes: no "more arrays"
    small = {"dense": {"kernel": jnp.zeros((8, 8)), "bias": jnp.ones(3)}}
    retrained = jax.eval_shape(lambda: _state(0).replace(params=small, opt_state=TX.init(small)))
    with pytest.raises(ValueError, match=r"\(8, 8\) in this run \(and 2 more arrays\)"):
        ckpt.restore_latest(retrained)  # Adam's mu and nu of the kernel too
    assert checkpointing.Checkpointer(directory=directory).committed_steps() == [1, 2]


def _nice_of(native_id: int) -> int:
    stat = open(f"/proc/self/task/{native_id}/stat").read()
    return int(stat.rsplit(")", 1)[1].split()[16])


def test_niced_save_copies_the_state_so_donation_cannot_corrupt_it(tmp_path):
    ckpt = checkpointing.Checkpointer(directory=tmp_path / "ckpt", nice=19)
    worker = ckpt._call(threading.get_native_id)
    assert _nice_of(worker) == 19 and _nice_of(threading.get_native_id()) == 0
    for step in (1, 2):
        state = _state(step)
        ckpt.save(step, state, {"batches_consumed": 10 * step})
        # What the next train step's donation does to these buffers, before the worker runs.
        for leaf in jax.tree.leaves(state):
            leaf.delete()
    ckpt.close()
    restored, data = checkpointing.Checkpointer(directory=tmp_path / "ckpt").restore_latest(
        _abstract()
    )
    assert data == {"batches_consumed": 20}
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(_state(2)), strict=True):
        np.testing.assert_array_equal(a, b)
    nice_20 = r"checkpoint nice must be an integer in \[0, 19\], got 20"
    with pytest.raises(ValueError, match=nice_20):
        checkpointing.Checkpointer(directory=tmp_path / "x", nice=20)


def test_a_failed_background_save_is_one_named_error_from_the_next_call(tmp_path):
    directory = tmp_path / "ckpt"
    _save_steps(directory, [1])
    ckpt = checkpointing.Checkpointer(directory=directory, nice=19)
    original = ckpt.manager.save

    def disk_full(step, *args, **kwargs):
        if step == 2:
            raise OSError(28, "No space left on device")
        return original(step, *args, **kwargs)

    ckpt.manager.save = disk_full
    ckpt.save(2, _state(2), {"batches_consumed": 20})  # returns: the worker fails later
    with pytest.raises(checkpointing.CheckpointWriteError) as raised:
        ckpt.save(3, _state(3), {"batches_consumed": 30})
    message = str(raised.value)
    assert f"checkpoint step 2 could not be written to {directory}: the disk is full (" in message
    assert "MiB free); the newest committed checkpoint is step 1" in message
    assert "\n" not in message
    ckpt.save(3, _state(3), {"batches_consumed": 30})  # the next save goes ahead
    ckpt.close()
    assert checkpointing.Checkpointer(directory=directory).committed_steps() == [1, 3]


def test_one_process_writes_replicated_arrays_without_slicing_them(tmp_path, monkeypatch):
    """Orbax's replica-parallel save cuts a replicated array into one compiled slice per
    replica, for hosts to write a part each; one process writes every part itself."""
    sliced = []
    slice_in_dim = jax.lax.slice_in_dim
    monkeypatch.setattr(
        jax.lax, "slice_in_dim", lambda *a, **k: sliced.append(a[0].shape) or slice_in_dim(*a, **k)
    )
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    assert len(jax.devices()) > 1 and jax.process_count() == 1
    state = jax.device_put(_state(3), replicated)
    # The spy sees Orbax's slices: with its default, Orbax's own checkpointer slices.
    monkeypatch.setattr(
        ocp.type_handlers.get_type_handler(jax.Array), "_use_replica_parallel", True
    )
    with ocp.StandardCheckpointer() as orbax_default:
        orbax_default.save(tmp_path / "orbax_default", state)
    assert sliced, "Orbax no longer slices through jax.lax.slice_in_dim: this test checks nothing"
    sliced.clear()
    _save_steps_of(tmp_path / "ckpt", {3: state})
    assert sliced == []
    ckpt = checkpointing.Checkpointer(directory=tmp_path / "ckpt")
    restored, _ = ckpt.restore_latest(_abstract())
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(a, b)
