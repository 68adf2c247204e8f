"""Per-process SeqIO input, global jax arrays, and host-side prefetch.

Each process reads its own shard (`seqio.ShardInfo(process_index, process_count)`), batches
`global_batch / process_count` examples, and the rows of all processes are assembled into one
global array per feature with `jax.make_array_from_process_local_data`. A background thread keeps
`prefetch` batches ready and records how long the training loop had to wait for each one.

The data position is the number of global batches consumed; a resumed run skips exactly that
many, so it sees the batches it would have seen.
"""

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import jax
import numpy as np
import seqio
import tensorflow as tf
from jax.sharding import NamedSharding

from lmsuite.data import mixtures
from lmsuite.data import stages as stages_lib
from lmsuite.training import thread_priority


def process_dataset(
    *,
    task: str,
    sequence_length: Mapping[str, int],
    feature_converter: seqio.FeatureConverter,
    global_batch_size: int,
    split: str = "train",
    shuffle: bool = True,
    seed: int = 0,
    repeat: bool = True,
    skip_batches: int = 0,
    input_threads: int | None = None,
    input_sharding: str = "source",
    rows_task: Callable[[str, int], str] | None = None,
    task_ids_along: Sequence[str] | None = None,
    label_fill: Mapping[str, bool] | None = None,
    stages: Sequence[stages_lib.Stage] = (),
    shuffle_buffer_size: int | None = None,
) -> tf.data.Dataset:
    """This process's batches of `task`, after `skip_batches` global batches.

    `input_threads` caps tf.data's threads (None: tf.data's autotuning decides).
    `input_sharding`: "source" (each process reads its own SeqIO shard: input work scales with
    the pod) or "replicated" (each process builds the whole global batch and keeps its rows:
    the batches do not depend on the process count, so a run on N hosts sees what one host
    sees, at N times the input work).

    `rows_task`: for tasks whose examples are interleaved rows of streams (XLNet: row i of batch
    t + 1 continues row i of batch t): (task, rows) -> the task laid out for a pipeline that
    batches `rows` examples (the process's rows with "source", the global batch with
    "replicated"). Its examples are read in order, never shuffled.

    A mixture's examples come from `mixtures.get_dataset`: every feature its tasks share, and
    with `task_ids_along` their per-token task ids (the feature converter must pass them).
    `label_fill`: the labels of a multi-task row, -1 where an example's task lacks one.
    `stages`: a continual schedule over mixture `task` (`lmsuite.data.stages`): from global
    batch `stage.start` on, its tasks at its rates; a skip starts in the stage it falls in.
    `shuffle_buffer_size`: each task's shuffle buffer in examples (None: the task's own, SeqIO's
    1,000). A task that makes many examples of one document (sentence pairs) emits them one
    after the other, and a buffer much smaller than a pass over the corpus keeps a document's
    examples within a few steps of each other (docs/data.md, "Shuffle buffer").

    Example: 2 processes, global batch 8 -> each yields dicts of (4, ...) numpy-ready tensors;
    "source": process 0 reads SeqIO shard 0 of 2; "replicated": process 1 keeps rows 4-7.
    """
    num_processes = jax.process_count()
    if input_sharding not in INPUT_SHARDINGS:
        raise ValueError(f"input_sharding={input_sharding!r}; expected one of {INPUT_SHARDINGS}")
    if global_batch_size % num_processes:
        raise ValueError(
            f"global batch size {global_batch_size} is not divisible by the "
            f"{num_processes} processes"
        )
    replicated = input_sharding == "replicated"
    local_batch = global_batch_size // num_processes
    if rows_task is not None:
        task = rows_task(task, global_batch_size if replicated else local_batch)
        shuffle = False  # a shuffle would interleave unrelated rows and steps
    if stages and (rows_task is not None or not repeat):
        raise ValueError(
            "a staged schedule needs a mixture read endlessly, not rows of streams "
            f"(rows_task) or one pass (repeat={repeat})"
        )

    known_features: dict[str, frozenset[str]] = {}  # shared by the stages (mixed_examples)

    def batched(task_rates=None, stage_seed=seed):
        dataset = mixtures.get_dataset(
            task,
            task_feature_lengths=dict(sequence_length),
            feature_converter=feature_converter,
            along=task_ids_along,
            label_fill=label_fill,
            task_rates=task_rates,
            known_features=known_features,
            shuffle_buffer_size=shuffle_buffer_size,
            dataset_split=split,
            shuffle=shuffle,
            num_epochs=None if repeat else 1,
            shard_info=seqio.ShardInfo(
                index=0 if replicated else jax.process_index(),
                num_shards=1 if replicated else num_processes,
            ),
            seed=stage_seed,
        )
        if replicated:
            first = jax.process_index() * local_batch
            return dataset.batch(global_batch_size, drop_remainder=True).map(
                lambda batch: {k: v[first : first + local_batch] for k, v in batch.items()}
            )
        return dataset.batch(local_batch, drop_remainder=True)

    if stages:
        dataset = stages_lib.staged(
            stages,
            lambda index, task_rates: batched(task_rates, None if seed is None else seed + index),
            skip_batches=skip_batches,
        )
    else:
        dataset = batched()
        if skip_batches:
            dataset = dataset.skip(skip_batches)
    options = tf.data.Options()
    # SeqIO chains many small per-example maps (preprocessors, validation, trimming, the feature
    # converter); fusing them saves tf.data's per-call cost: 17.0 -> 14.4 ms of CPU per 32 x 128
    # MLM batch, the same batches.
    options.experimental_optimization.map_fusion = True
    if input_threads is None:
        return dataset.prefetch(tf.data.AUTOTUNE).with_options(options)
    # On a CPU-only host the input pipeline shares the cores with XLA's step: cap it.
    options.autotune.cpu_budget = input_threads
    options.threading.private_threadpool_size = input_threads
    return dataset.prefetch(2).with_options(options)


INPUT_SHARDINGS = ("source", "replicated")
EVAL_SPLIT = "validation"
EVAL_BATCHES = 10


def eval_dataset(
    *,
    task: str,
    sequence_length: Mapping[str, int],
    feature_converter: seqio.FeatureConverter,
    global_batch_size: int,
    split: str = EVAL_SPLIT,
    batches: int = EVAL_BATCHES,
    input_sharding: str = "source",
    rows_task: Callable[[str, int], str] | None = None,
    task_ids_along: Sequence[str] | None = None,
    label_fill: Mapping[str, bool] | None = None,
) -> tf.data.Dataset:
    """The held-out batches periodic evaluation reads: `split` in order, unshuffled, one pass,
    the first `batches` batches (fewer if the split is smaller)."""
    return process_dataset(
        task=task,
        sequence_length=sequence_length,
        feature_converter=feature_converter,
        global_batch_size=global_batch_size,
        split=split,
        shuffle=False,
        repeat=False,
        input_sharding=input_sharding,
        rows_task=rows_task,
        task_ids_along=task_ids_along,
        label_fill=label_fill,
    ).take(batches)


def to_global(
    local_batch: Mapping[str, np.ndarray], shardings: Mapping[str, NamedSharding]
) -> dict[str, jax.Array]:
    """Assembles each process's rows into global arrays sharded along the batch.

    Example: on 2 processes, local {"input_ids": (4, 128)} -> global (8, 128) array.
    """
    out = {}
    for name, sharding in shardings.items():
        if name not in local_batch:
            raise ValueError(f"batch feature {name!r} missing; the batch has {sorted(local_batch)}")
        local = np.asarray(local_batch[name])
        global_shape = (local.shape[0] * jax.process_count(),) + local.shape[1:]
        out[name] = jax.make_array_from_process_local_data(sharding, local, global_shape)
    return out


def default_input_nice() -> int:
    """tf.data's nice value: 19 on the CPU backend (the input shares the cores with XLA's
    step), else 0.

    Measured with `benchmarks/train_loop.py` on 2 cores (`experiments/default.gin`, 600 steps,
    malloc settings): with tf.data's threads at nice 19 the loop ran at 0.939 of the bare step
    against 0.873 at nice 0, and never waited for input. An earlier version niced the prefetch
    thread too: it holds the GIL while it converts batches, so the training thread waited on a
    nice-19 GIL holder and the loop starved (5-7 s of every 10 s waiting for input).
    """
    if not thread_priority.supported():
        return 0
    return 19 if jax.default_backend() == "cpu" else 0


def _start_niced(local_batches, nice: int, stop: threading.Event):
    """An iterator over `local_batches` whose tf.data threads run at `nice`; empty if `stop` is
    set before the first batch is read.

    A helper thread lowers its own priority (Linux schedules threads individually; a thread
    inherits its creator's nice value), creates the iterator and reads the first batch, which
    starts tf.data's threads. The caller keeps its priority: it holds the GIL while it converts
    batches, and a niced GIL holder would stall the training thread's dispatch. The caller
    polls `stop` meanwhile, so that a run stopping during a slow first batch is not held.
    """
    if not isinstance(local_batches, tf.data.Dataset):
        return iter(local_batches)
    if not nice:
        return local_batches.as_numpy_iterator()
    started: dict = {}

    def start():
        try:
            thread_priority.lower_this_thread(nice)
            iterator = local_batches.as_numpy_iterator()
            started["first"] = list(itertools.islice(iterator, 1))
            started["iterator"] = iterator
        except Exception as error:  # re-raised in the caller
            started["error"] = error

    helper = threading.Thread(target=start, name="prefetch-start", daemon=True)
    helper.start()
    while helper.is_alive():
        if stop.is_set():
            return iter(())
        helper.join(timeout=0.1)
    if "error" in started:
        raise started["error"]
    return itertools.chain(started["first"], started["iterator"])


class Prefetcher:
    """Iterates global batches prepared by a background thread.

    `local_batches` is a tf.data.Dataset (iterated with `as_numpy_iterator()` created inside the
    thread) or any iterable of numpy dicts. With `nice` > 0 tf.data's own threads run at that
    priority (`_start_niced`), in the gaps of XLA's threads instead of preempting them; the
    prefetch thread keeps the caller's. On a CPU-only host this reduces how much the input
    pipeline slows the step (`benchmarks/train_loop.py`); the batches and their order do not
    change.

    `wait_seconds` accumulates how long `next()` blocked: the time the device would have idled.
    An exception in the thread is re-raised by `next()`.
    """

    _END = object()

    def __init__(
        self,
        local_batches: tf.data.Dataset | Iterable[Mapping[str, np.ndarray]],
        shardings: Mapping[str, NamedSharding],
        *,
        size: int = 2,
        nice: int = 0,
    ):
        thread_priority.check(nice, what="input nice")
        self._queue: queue.Queue = queue.Queue(maxsize=size)
        self._stop = threading.Event()
        self.wait_seconds = 0.0
        self._thread = threading.Thread(
            target=self._fill, args=(local_batches, shardings, nice), daemon=True, name="prefetch"
        )
        self._thread.start()

    def _fill(self, local_batches, shardings, nice):
        try:
            local_batches = _start_niced(local_batches, nice, self._stop)
            for local in local_batches:
                item = to_global(local, shardings)
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
            self._queue.put(self._END)
        except Exception as error:  # handed to the consumer, which re-raises it
            self._queue.put(error)

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, jax.Array]:
        start = time.perf_counter()
        item = self._queue.get()
        self.wait_seconds += time.perf_counter() - start
        if item is self._END:
            raise StopIteration
        if isinstance(item, Exception):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
