"""Fault tests on experiments/smoke.gin (30 steps, checkpoint every 10, every step logged).

A resumed run must log, step for step, bitwise the losses of an uninterrupted run: that holds
only if the state, the optimizer, the dropout keys and the data position all resume exactly.
"""

import random
import re
import signal
import socket
import subprocess
import time

import pytest

from lmsuite.training import checkpointing
from tests.integration import smoke_runs as smoke


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("reference")
    result = smoke.run(model_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    losses = smoke.losses(model_dir)
    assert sorted(losses) == list(range(1, smoke.SMOKE_STEPS + 1))
    assert smoke.committed_steps(model_dir) == [10, 20, 30]
    assert losses[30] < losses[1]
    for name in ("config.gin", "model-info.txt"):
        assert (model_dir / name).stat().st_size > 0
    assert any((model_dir / "tensorboard").iterdir())
    return model_dir, losses


@pytest.mark.slow  # three runs
def test_kill_during_checkpoint_write_then_sigterm_then_resume_is_bitwise(reference, tmp_path):
    _, expected = reference
    model_dir = tmp_path / "run"
    # 1. SIGKILL while step 20's checkpoint is being written: step 10 is the newest committed.
    killed = smoke.run(model_dir, **{checkpointing.KILL_DURING_SAVE_ENV: "20"})
    assert killed.returncode == -signal.SIGKILL
    assert smoke.committed_steps(model_dir) == [10]
    torn = [p.name for p in (model_dir / "checkpoints").iterdir() if p.name.startswith("20")]
    # 2. Resume; SIGTERM once step 23 is logged: a checkpoint of the step it stopped at.
    process = smoke.start(model_dir)
    smoke.wait_for_step(process, model_dir, 23)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 143, stderr[-3000:]
    # The torn save is an Orbax temporary directory, named and removed at start.
    assert torn and all(name.startswith(f"20{checkpointing.TMP_SUFFIX}") for name in torn)
    assert f"20{checkpointing.TMP_SUFFIX}: an unfinished save" in stderr
    assert "resumed from step 10 (committed " in stderr
    stopped_at = max(smoke.losses(model_dir))
    assert stopped_at >= 23 and f"SIGTERM at step {stopped_at}" in stderr
    assert max(smoke.committed_steps(model_dir)) == stopped_at
    # 3. Resume to the end.
    final = smoke.run(model_dir)
    assert final.returncode == 0, final.stderr[-3000:]
    assert smoke.losses(model_dir) == expected


def _kill_at_random_step_and_resume(reference, tmp_path, seed, *bindings, low=2):
    _, expected = reference
    model_dir = tmp_path / f"trial{seed}"
    kill_after = random.Random(seed).randint(low, smoke.SMOKE_STEPS - 2)
    process = smoke.start(model_dir, *bindings)
    smoke.wait_for_step(process, model_dir, kill_after)
    process.kill()
    process.wait(timeout=60)
    result = smoke.run(model_dir, *bindings)
    assert result.returncode == 0, result.stderr[-3000:]
    assert smoke.losses(model_dir) == expected, f"killed after step {kill_after}"
    return kill_after


def _resumed_from(stderr: str) -> int:
    found = re.findall(r"resumed from step (\d+) \(committed ", stderr)
    return int(found[0]) if found else 0


def _kills_then_resume(reference, model_dir, seed, kills, *, first_after_commit=False):
    """SIGKILLs a run `kills` times at random moments (at a random step, then up to half a
    second later: before, during or after a save), resuming after each; then runs it to the
    end. Each resume must start from the newest step committed when the process died, having
    lost at most one checkpoint interval plus the steps run while the next save was written
    (at most another interval: with one save in flight, the loop waits at the save after it),
    and the losses must be the uninterrupted run's, bit for bit."""
    _, expected = reference
    rng = random.Random(seed)
    every = smoke.CHECKPOINT_EVERY
    history = []
    resumed = 0
    for kill in range(kills):
        process = smoke.start(model_dir)
        if kill == 0 and first_after_commit:  # right after the first save is committed
            deadline = time.monotonic() + 600
            while not (model_dir / "checkpoints" / str(every)).exists():
                assert process.poll() is None, process.stderr.read()[-3000:]
                assert time.monotonic() < deadline
                time.sleep(0.01)
            at = f"right after step {every} was committed"
        else:
            step = rng.randint(resumed + 1, smoke.SMOKE_STEPS - 1)
            smoke.wait_for_step(process, model_dir, step)
            time.sleep(rng.uniform(0, 0.5))
            at = f"at step {step} + a moment"
        process.kill()
        _, stderr = process.communicate(timeout=60)
        assert _resumed_from(stderr) == resumed, (history, stderr[-3000:])
        logged = max(smoke.losses(model_dir), default=0)
        committed = max(smoke.committed_steps(model_dir), default=0)
        history.append((at, logged, committed))
        assert logged - committed <= 2 * every, history
        if first_after_commit and kill == 0:
            assert committed == every, history
        resumed = committed
    final = smoke.run(model_dir)
    assert final.returncode == 0, final.stderr[-3000:]
    assert _resumed_from(final.stderr) == resumed, (history, final.stderr[-3000:])
    assert smoke.losses(model_dir) == expected, history
    return history


def _memory_reference(tmp_path_factory, name, bindings):
    model_dir = tmp_path_factory.mktemp(name)
    result = smoke.run(model_dir, *bindings)
    assert result.returncode == 0, result.stderr[-3000:]
    losses = smoke.losses(model_dir)
    assert sorted(losses) == list(range(1, smoke.SMOKE_STEPS + 1))
    assert smoke.committed_steps(model_dir) == [10, 20, 30]
    return model_dir, losses


@pytest.fixture(scope="module")
def xlnet_reference(tmp_path_factory):
    return _memory_reference(tmp_path_factory, "xlnet_reference", smoke.XLNET)


@pytest.fixture(scope="module")
def txl_reference(tmp_path_factory):
    return _memory_reference(tmp_path_factory, "txl_reference", smoke.TXL)


# slow: the fast suite keeps the BERT kill -9 resume and XLNet's memory dependence
@pytest.mark.slow
def test_kill_9_and_resume_xlnet_with_its_memory_is_bitwise(xlnet_reference, tmp_path):
    """Killed after a checkpoint (step >= 11), the resumed run restores the memory from it; a
    memory restarted from zeros would change every later loss."""
    killed_after = _kill_at_random_step_and_resume(
        xlnet_reference, tmp_path, 0, *smoke.XLNET, low=11
    )
    assert killed_after >= 11


@pytest.mark.slow
def test_kill_9_and_resume_transformer_xl_with_its_memory_is_bitwise(txl_reference, tmp_path):
    """As XLNet's: Transformer-XL's LM carries its memory in the train state."""
    killed_after = _kill_at_random_step_and_resume(txl_reference, tmp_path, 0, *smoke.TXL, low=11)
    assert killed_after >= 11


@pytest.mark.slow
def test_transformer_xl_losses_depend_on_the_memory(txl_reference, tmp_path):
    _, with_memory = txl_reference
    model_dir = tmp_path / "no_memory"
    result = smoke.run(model_dir, *smoke.TXL, "--gin.make_recipe.loss_options={'memory': False}")
    assert result.returncode == 0, result.stderr[-3000:]
    without = smoke.losses(model_dir)
    # Step 1's memory is zeros; every later step reads the previous segment's states.
    assert all(without[s] != with_memory[s] for s in range(2, smoke.SMOKE_STEPS + 1))


def test_xlnet_losses_depend_on_the_memory(xlnet_reference, tmp_path):
    """The bitwise resume above can fail only if the memory matters: without it, the same run's
    losses differ at every step (even the first, whose memory is zeros: attended zero states
    still take attention weight, as in the reference)."""
    _, with_memory = xlnet_reference
    model_dir = tmp_path / "no_memory"
    result = smoke.run(model_dir, *smoke.XLNET, "--gin.make_recipe.loss_options={'memory': False}")
    assert result.returncode == 0, result.stderr[-3000:]
    without = smoke.losses(model_dir)
    assert all(without[s] != with_memory[s] for s in range(1, smoke.SMOKE_STEPS + 1))


def test_kills_right_after_a_commit_and_at_random_resume_from_the_newest_save(reference, tmp_path):
    _kills_then_resume(reference, tmp_path / "run", 0, kills=2, first_after_commit=True)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 5))
def test_five_kills_at_random_moments_resume_bitwise(reference, tmp_path, seed):
    """With the four seeds, 20 kills."""
    history = _kills_then_resume(reference, tmp_path / "run", seed, kills=5)
    assert len(history) == 5


@pytest.mark.slow  # damaged steps are also covered in tests/training/test_checkpointing.py
def test_corrupted_checkpoint_is_named_and_previous_step_used(reference, tmp_path):
    source, expected = reference
    model_dir = smoke.copy_run(source, tmp_path / "run")
    step_dir = model_dir / "checkpoints" / "30"
    victim = max(
        (p for p in step_dir.rglob("*") if p.is_file() and p.name != "COMMITTED"),
        key=lambda p: p.stat().st_size,
    )
    victim.write_bytes(victim.read_bytes()[:100])
    result = smoke.run(model_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "not loading checkpoint step 30" in result.stderr
    assert str(victim.relative_to(step_dir)) in result.stderr
    assert smoke.losses(model_dir) == expected  # steps 21-30 re-run from step 20


def test_nan_loss_stops_with_the_step_and_keeps_the_last_checkpoint(reference, tmp_path):
    source, _ = reference
    model_dir = smoke.copy_run(source, tmp_path / "run")
    manifest = (model_dir / "checkpoints" / "30" / "COMMITTED").read_text()
    result = smoke.run(
        model_dir,
        "--gin.TRAIN_STEPS=40",
        "--gin.SCHEDULE='constant'",
        "--gin.LEARNING_RATE=1e30",
    )
    assert result.returncode == 3, result.stderr[-3000:]
    assert re.search(r"loss is (nan|inf|-inf) .* at step 3[1-3]; stopping", result.stderr)
    assert "last good checkpoint is step 30" in result.stderr
    assert smoke.committed_steps(model_dir) == [10, 20, 30]
    assert (model_dir / "checkpoints" / "30" / "COMMITTED").read_text() == manifest


def test_a_second_writer_is_refused_and_the_first_run_goes_on(reference, tmp_path):
    _, expected = reference
    model_dir = tmp_path / "run"
    first = smoke.start(model_dir)
    smoke.wait_for_step(first, model_dir, 3)
    # Paused, so that it cannot finish (and release the lease) while the second one starts up:
    # on a loaded 2-core machine the second's start-up took longer than the first's 27 steps.
    first.send_signal(signal.SIGSTOP)
    try:
        second = smoke.run(model_dir)
    finally:
        first.send_signal(signal.SIGCONT)
    assert second.returncode == 2, second.stderr[-3000:]
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in second.stderr
    assert (
        f"is being trained by another process (host {socket.gethostname()} pid {first.pid},"
        in (lines[0])
    )
    _, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr[-3000:]
    assert smoke.losses(model_dir) == expected  # nothing of the first run's log was lost
    assert not (model_dir / "LEASE").exists()  # released at the end


@pytest.fixture
def small_disk(tmp_path):
    """A 6 MiB tmpfs: one smoke checkpoint (3.4 MiB) fits, a second does not."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=6M", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_a_full_disk_is_one_line_and_keeps_the_newest_committed_step(small_disk):
    model_dir = small_disk / "run"
    result = smoke.run(model_dir)
    assert result.returncode == 1, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert re.fullmatch(
        rf"lmsuite: checkpoint step 20 could not be written to {model_dir}/checkpoints: the disk "
        r"is full \([\d.]+ MiB free\); the newest committed checkpoint is step 10",
        lines[0],
    )
    assert sorted(p.name for p in (model_dir / "checkpoints").iterdir()) == ["10"]
    assert checkpointing.verify(model_dir / "checkpoints" / "10")


@pytest.mark.slow  # two runs
def test_a_run_with_rbg_dropout_bits_resumes_bitwise(reference, tmp_path):
    """train.prng_impl='rbg' (the paper-sized experiments' dropout bits): a killed run resumes
    with the uninterrupted run's losses, and the bits differ from threefry's."""
    rbg = ("--gin.train.prng_impl='rbg'",)
    whole = tmp_path / "whole"
    result = smoke.run(whole, *rbg)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = smoke.losses(whole)
    assert expected != reference[1]  # other dropout masks
    model_dir = tmp_path / "killed"
    process = smoke.start(model_dir, *rbg)
    smoke.wait_for_step(process, model_dir, 14)
    process.kill()
    process.wait(timeout=60)
    result = smoke.run(model_dir, *rbg)
    assert result.returncode == 0, result.stderr[-3000:]
    assert smoke.losses(model_dir) == expected
