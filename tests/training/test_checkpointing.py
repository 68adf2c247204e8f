"""Checkpoints: round trip, keep policy, damaged steps named and skipped, temp dirs cleaned."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
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
    ckpt = checkpointing.Checkpointer(directory=directory, keep=keep)
    for step in steps:
        ckpt.save(step, _state(step), {"batches_consumed": 10 * step})
    ckpt.close()


def test_round_trip_restores_state_and_data_position(tmp_path):
    _save_steps(tmp_path / "ckpt", [1, 2])
    ckpt = checkpointing.Checkpointer(directory=tmp_path / "ckpt")
    state, data = ckpt.restore_latest(_abstract())
    assert data == {"batches_consumed": 20}
    assert int(state.step) == 2
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(_state(2)), strict=True):
        np.testing.assert_array_equal(a, b)


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


@pytest.mark.parametrize("damage", ["missing_file", "truncated_array", "no_commit"])
def test_damaged_newest_step_is_named_and_previous_restored(tmp_path, capsys, damage):
    directory = tmp_path / "ckpt"
    _save_steps(directory, [1, 2])
    step_dir = directory / "2"
    if damage == "missing_file":
        victim = next(p for p in step_dir.rglob("*") if p.is_file() and p.name != "COMMITTED")
        victim.unlink()
        expected = f"missing {victim.relative_to(step_dir)}"
    elif damage == "truncated_array":
        victim = _largest_file(step_dir)
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
        expected = f"{victim.relative_to(step_dir)} has"
    else:
        (step_dir / "COMMITTED").unlink()
        expected = "no COMMITTED marker"
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


def test_leftover_temporary_directories_are_removed_at_start(tmp_path):
    directory = tmp_path / "ckpt"
    _save_steps(directory, [1])
    leftover = directory / "2.orbax-checkpoint-tmp-1234"
    (leftover / "state").mkdir(parents=True)
    checkpointing.Checkpointer(directory=directory)
    assert not leftover.exists()


def test_complete_checkpoint_of_another_shape_is_an_error_not_a_fallback(tmp_path):
    directory = tmp_path / "ckpt"
    _save_steps(directory, [1, 2])
    other = jax.eval_shape(
        lambda: _state(0).replace(
            params={"dense": {"kernel": jnp.zeros((8, 8)), "bias": jnp.ones(3)}}
        )
    )
    ckpt = checkpointing.Checkpointer(directory=directory)
    with pytest.raises(ValueError, match="checkpoint .*2 is committed and complete but does not"):
        ckpt.restore_latest(other)
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
    with pytest.raises(ValueError, match="checkpoint nice value must be in \\[0, 19\\], got 20"):
        checkpointing.Checkpointer(directory=tmp_path / "x", nice=20)


def test_failed_background_save_is_raised_by_the_next_call(tmp_path, monkeypatch):
    ckpt = checkpointing.Checkpointer(directory=tmp_path / "ckpt", nice=19)

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(ckpt.manager, "save", disk_full)
        ckpt.save(1, _state(1), {"batches_consumed": 10})  # returns: the worker fails later
        with pytest.raises(OSError, match="No space left"):
            ckpt.commit()
    ckpt.save(2, _state(2), {"batches_consumed": 20})
    ckpt.close()
    assert checkpointing.Checkpointer(directory=tmp_path / "ckpt").committed_steps() == [2]


def test_a_failed_save_is_raised_even_when_another_save_was_queued_behind_it(tmp_path):
    ckpt = checkpointing.Checkpointer(directory=tmp_path / "ckpt", nice=19)
    release = threading.Event()
    ckpt._worker.submit(release.wait)  # hold the worker so that both saves queue up
    original = ckpt.manager.save

    def fail_step_1(step, *args, **kwargs):
        if step == 1:
            raise OSError("No space left on device")
        return original(step, *args, **kwargs)

    ckpt.manager.save = fail_step_1
    ckpt.save(1, _state(1), {"batches_consumed": 10})
    ckpt.save(2, _state(2), {"batches_consumed": 20})
    release.set()
    with pytest.raises(OSError, match="No space left"):
        ckpt.commit()
    ckpt.close()
    assert checkpointing.Checkpointer(directory=tmp_path / "ckpt").committed_steps() == [2]
