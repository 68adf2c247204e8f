"""Per-process SeqIO input: sharding, exact skip on resume, global arrays, prefetch."""

import functools
import os
import sys
import threading
from pathlib import Path

import jax
import numpy as np
import pytest
import seqio
import tensorflow as tf

import lmsuite.data.tasks  # noqa: F401  (registers shakespeare_bert_mlm)
from lmsuite import partitioning
from lmsuite.data.feature_converters import EncoderMlmFeatureConverter
from lmsuite.training import checkpointing, input_pipeline, step

TASK = "lmsuite_test_counting_lm"
VOCAB = seqio.PassThroughVocabulary(size=200)


def _examples(split, shuffle_files=False, seed=None, first=1):
    del split, shuffle_files, seed
    # Example i is the token run [i+1, i+2, i+3] (ids stay below the vocab size), from `first`.
    ids = [[(i + k) % 60 + first for k in range(1, 4)] for i in range(40)]
    return tf.data.Dataset.from_tensor_slices({"targets": tf.constant(ids, tf.int32)})


@pytest.fixture(scope="module", autouse=True)
def _task():
    for name, first in ((TASK, 1), (f"{TASK}_high", 101)):  # the second: ids 102 and up
        seqio.TaskRegistry.remove(name)
        seqio.TaskRegistry.add(
            name,
            source=seqio.FunctionDataSource(
                functools.partial(_examples, first=first), splits=("train",)
            ),
            preprocessors=[],
            output_features={"targets": seqio.Feature(VOCAB, add_eos=False)},
        )
    yield
    for name in (TASK, f"{TASK}_high"):
        seqio.TaskRegistry.remove(name)


def _dataset(task=TASK, **kwargs):
    return input_pipeline.process_dataset(
        task=task,
        sequence_length={"targets": 4},
        feature_converter=seqio.LMFeatureConverter(pack=False),
        global_batch_size=4,
        seed=3,
        **kwargs,
    )


def test_resume_skips_exactly_the_consumed_batches():
    full = [b["decoder_target_tokens"] for b in _dataset().take(6).as_numpy_iterator()]
    resumed = [
        b["decoder_target_tokens"] for b in _dataset(skip_batches=4).take(2).as_numpy_iterator()
    ]
    np.testing.assert_array_equal(np.stack(resumed), np.stack(full[4:6]))
    # A shuffled stream: not simply the source order.
    assert not np.array_equal(full[0][:, 0], [2, 3, 4, 5])


def test_a_shuffle_buffer_of_one_example_keeps_the_source_order():
    """`shuffle_buffer_size` is each task's SeqIO shuffle buffer, for a task and for each task
    of a mixture: one example shuffles nothing."""
    in_order = [b["decoder_target_tokens"][:, 0] for b in _dataset(shuffle_buffer_size=1).take(3)]
    np.testing.assert_array_equal(np.concatenate(in_order), np.arange(2, 14))
    shuffled = [b["decoder_target_tokens"][:, 0] for b in _dataset().take(3)]
    assert not np.array_equal(np.concatenate(shuffled), np.arange(2, 14))

    mixture = "lmsuite_test_counting_mixture"
    seqio.MixtureRegistry.remove(mixture)
    seqio.MixtureRegistry.add(mixture, [(TASK, 1.0), (f"{TASK}_high", 1.0)])
    try:
        firsts = np.concatenate(
            [
                b["decoder_target_tokens"][:, 0]
                for b in _dataset(task=mixture, shuffle_buffer_size=1).take(10).as_numpy_iterator()
            ]
        )
    finally:
        seqio.MixtureRegistry.remove(mixture)
    low, high = firsts[firsts < 100], firsts[firsts >= 100]  # each task's examples, in its order
    assert len(low) > 5 and len(high) > 5
    np.testing.assert_array_equal(low, np.arange(2, 2 + len(low)))
    np.testing.assert_array_equal(high, np.arange(102, 102 + len(high)))


def test_prefetcher_builds_global_arrays_and_reports_waiting():
    mesh = partitioning.make_mesh(devices=jax.devices()[:1])
    local = _dataset().take(3).as_numpy_iterator()
    first = next(_dataset().as_numpy_iterator())
    shardings = step.batch_shardings(
        {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in first.items()},
        mesh,
        rules=partitioning.DEFAULT_RULES,
    )
    prefetcher = input_pipeline.Prefetcher(local, shardings, size=2)
    batches = list(prefetcher)
    prefetcher.close()
    assert len(batches) == 3
    assert isinstance(batches[0]["decoder_input_tokens"], jax.Array)
    np.testing.assert_array_equal(
        batches[0]["decoder_target_tokens"], first["decoder_target_tokens"]
    )
    assert prefetcher.wait_seconds >= 0.0


def test_prefetcher_reraises_errors_from_its_thread():
    def broken():
        yield {"x": np.zeros((2, 3), np.int32)}
        raise OSError("disk gone")

    mesh = partitioning.make_mesh(devices=jax.devices()[:1])
    shardings = {"x": partitioning.named_sharding(mesh, ("batch", None))}
    prefetcher = input_pipeline.Prefetcher(broken(), shardings)
    next(prefetcher)
    with pytest.raises(OSError, match="disk gone"):
        next(prefetcher)
    prefetcher.close()
    assert not any(t.name == "prefetch" and t.is_alive() for t in threading.enumerate())


def _nice_of_threads() -> dict[int, int]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        out[int(tid)] = int(stat[stat.rindex(")") + 2 :].split()[16])
    return out


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_niced_prefetcher_runs_tf_data_below_the_step_and_keeps_the_batches():
    mesh = partitioning.make_mesh(devices=jax.devices()[:1])
    first = next(_dataset().as_numpy_iterator())
    shardings = step.batch_shardings(
        {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in first.items()},
        mesh,
        rules=partitioning.DEFAULT_RULES,
    )
    plain = input_pipeline.Prefetcher(_dataset().take(4), shardings)
    expected = [jax.device_get(b) for b in plain]
    plain.close()
    before = set(_nice_of_threads())
    niced = input_pipeline.Prefetcher(_dataset().take(4), shardings, nice=19)
    got = [jax.device_get(next(niced))]
    # Every thread tf.data started for the prefetcher runs at nice 19. The prefetch thread
    # itself, which holds the GIL while it converts batches, and the caller (which dispatches
    # the step) keep their priority.
    started = {tid: nice for tid, nice in _nice_of_threads().items() if tid not in before}
    prefetch = niced._thread.native_id
    assert started.pop(prefetch) == 0
    assert started and set(started.values()) == {19}, started
    assert _nice_of_threads()[threading.get_native_id()] == 0
    got += [jax.device_get(b) for b in niced]
    niced.close()
    assert len(got) == len(expected) == 4
    for a, b in zip(got, expected, strict=True):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    with pytest.raises(ValueError, match="input nice must be an integer in \\[0, 19\\], got -5"):
        input_pipeline.Prefetcher([], shardings, nice=-5)


def test_missing_feature_is_named():
    mesh = partitioning.make_mesh(devices=jax.devices()[:1])
    shardings = {"y": partitioning.named_sharding(mesh, ("batch",))}
    with pytest.raises(ValueError, match="batch feature 'y' missing; the batch has \\['x'\\]"):
        input_pipeline.to_global({"x": np.zeros((2,))}, shardings)


def test_fused_maps_give_the_batches_of_the_unoptimised_pipeline():
    # A stochastic task (dynamic MLM masking) through process_dataset, which fuses SeqIO's maps,
    # against the same SeqIO dataset batched with tf.data's default optimisations.
    lengths = {"input_ids": 32, "masked_ids": 5}
    converter = EncoderMlmFeatureConverter()
    fused = input_pipeline.process_dataset(
        task="shakespeare_bert_mlm",
        sequence_length=lengths,
        feature_converter=converter,
        global_batch_size=4,
        seed=5,
        input_threads=1,
    )
    plain = seqio.get_dataset(
        "shakespeare_bert_mlm",
        task_feature_lengths=lengths,
        feature_converter=converter,
        dataset_split="train",
        shuffle=True,
        num_epochs=None,
        shard_info=seqio.ShardInfo(index=0, num_shards=1),
        seed=5,
        verbose=False,
    ).batch(4, drop_remainder=True)
    assert fused.options().experimental_optimization.map_fusion
    got_batches = list(fused.take(3).as_numpy_iterator())
    want_batches = list(plain.take(3).as_numpy_iterator())
    assert len(got_batches) == len(want_batches) == 3
    for got, want in zip(got_batches, want_batches, strict=True):
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_niced_prefetcher_raises_an_error_from_the_first_batch():
    # The first batch is read by the short-lived niced helper thread; its error must still
    # reach the consumer.
    failing = tf.data.Dataset.from_tensors({"x": tf.constant([1.0])}).map(
        lambda f: {"x": tf.debugging.check_numerics(f["x"] / 0.0, "first batch is bad")}
    )
    mesh = partitioning.make_mesh(devices=jax.devices()[:1])
    shardings = {"x": jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())}
    prefetcher = input_pipeline.Prefetcher(failing, shardings, nice=19)
    with pytest.raises(tf.errors.InvalidArgumentError, match="first batch is bad"):
        next(prefetcher)
    prefetcher.close()


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_a_run_stopping_during_a_slow_first_batch_closes_the_prefetcher_at_once():
    # A run that fails (or is interrupted) while tf.data still reads its first batch: close()
    # ends the prefetch thread, where it used to sit joining the niced helper until its join
    # timed out and leave the thread behind.
    release = threading.Event()

    def rows():
        release.wait(timeout=60)
        yield {"x": np.ones(1, np.float32)}

    slow = tf.data.Dataset.from_generator(
        rows, output_signature={"x": tf.TensorSpec([1], tf.float32)}
    )
    mesh = partitioning.make_mesh(devices=jax.devices()[:1])
    shardings = {"x": jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())}
    prefetcher = input_pipeline.Prefetcher(slow, shardings, nice=19)
    try:
        prefetcher.close()  # the first batch is still blocked: nothing has set `release`
        assert not prefetcher._thread.is_alive()
    finally:
        release.set()  # lets the helper's read end


def test_thread_priorities_only_on_linux(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert input_pipeline.default_input_nice() == 0
    assert checkpointing.default_checkpoint_nice() == 0
    with pytest.raises(ValueError, match="input nice 19 needs Linux .*darwin"):
        input_pipeline.Prefetcher([], {}, nice=19)
    with pytest.raises(ValueError, match="checkpoint nice 19 needs Linux .*darwin"):
        checkpointing.Checkpointer(directory=tmp_path / "ckpt", nice=19)
