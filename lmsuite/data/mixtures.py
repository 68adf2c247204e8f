"""SeqIO mixtures whose examples remember their task.

`seqio.Mixture.get_dataset` samples its tasks at their rates but keeps only the mixture's
output features (an MLM task's `masked_*` features are dropped) and forgets which task each
example came from. `mixed_examples` samples the same way (each task's `get_dataset`, then
`tf.data.Dataset.sample_from_datasets` with `Mixture.get_rate` and SeqIO's sampling seed) and
keeps every feature its tasks share, plus:

  task_ids     int32 [n]: the task's 1-based index (`task_names` order) on each token of the
               features named in `along` (their lengths summed), so that packing keeps it
               aligned with them: a per-token tag the loss reads to split its metrics by task;
  task_index   int32 []: the 0-based index, with `example_task=True` (`lmsuite tasks show`).

Example (`wiki_sample_seq2seq_mixture`, along=("targets",), rates 1:1:1): an example of its
second task (`wiki_sample_prefix_lm`) with targets [31, 9, 1] gets task_ids [2, 2, 2].

`get_dataset` is `seqio.get_dataset` for a task, and for a mixture these examples through the
feature converter, which carries `task_ids` as a passthrough feature of length
sum(sequence_length[f] for f in along).
"""

from collections.abc import Mapping, Sequence

import seqio
import tensorflow as tf

TASK_IDS = "task_ids"
TASK_INDEX = "task_index"
TASK_IDS_SPEC = seqio.FeatureConverter.FeatureSpec(dtype=tf.int32)


def is_mixture(name: str) -> bool:
    return name in seqio.MixtureRegistry.names()


def task_names(name: str) -> tuple[str, ...]:
    """The tasks of mixture `name` in SeqIO's order (sorted by name); () for a task."""
    if not is_mixture(name):
        return ()
    return tuple(t.name for t in seqio.get_mixture_or_task(name).tasks)


def rates(name: str) -> dict[str, float]:
    """Each task's share of the examples of mixture `name` (its rate over the total)."""
    mixture = seqio.get_mixture_or_task(name)
    raw = {t.name: float(mixture.get_rate(t)) for t in mixture.tasks}
    total = sum(raw.values())
    if total <= 0:
        raise ValueError(f"mixture {name!r} has no positive rate: {raw}")
    return {task: rate / total for task, rate in raw.items()}


def example_spec(
    task: seqio.Task, sequence_length: Mapping[str, int], split: str = "train"
) -> dict[str, tf.TensorSpec]:
    """The features of `task`'s examples (its `element_spec`): its preprocessing graph is built,
    nothing is read."""
    return dict(task.get_dataset(dict(sequence_length), split=split, shuffle=False).element_spec)


def task_features(
    name: str, *, sequence_length: Mapping[str, int], split: str = "train"
) -> dict[str, frozenset[str]]:
    """Each task of mixture `name` with `split` -> the features of its own examples (before
    `mixed_examples` adds the labels its task lacks; `example_spec`).

    Example: an NSP task and a SOP task -> {nsp: {..., "next_sentence_label"},
    sop: {..., "sentence_order_label"}}.
    """
    mixture = seqio.get_mixture_or_task(name)
    return {
        task.name: frozenset(example_spec(task, sequence_length, split))
        for task in mixture.tasks
        if split in task.splits
    }


def task_ids_length(sequence_length: Mapping[str, int], along: Sequence[str]) -> int:
    """The length of `task_ids`: the summed lengths of the features it runs along."""
    missing = [f for f in along if f not in sequence_length]
    if missing:
        raise ValueError(
            f"task ids run along {list(along)}, but sequence_length {dict(sequence_length)} "
            f"has no length for {missing}"
        )
    return sum(int(sequence_length[f]) for f in along)


def _filler(label_fill: Mapping[str, bool]):
    """Adds each label of `label_fill` (name -> per token) an example lacks, as -1 (none)."""

    def fill(ex):
        ex = dict(ex)
        for name, per_token in label_fill.items():
            if name not in ex:
                shape = [tf.size(ex["input_ids"])] if per_token else []
                ex[name] = tf.fill(shape, tf.constant(-1, tf.int32))
        return ex

    return fill


def _tagger(index: int, along: Sequence[str], example_task: bool):
    def tag(ex):
        ex = dict(ex)
        if along:
            n = tf.add_n([tf.size(ex[f]) for f in along])
            ex[TASK_IDS] = tf.fill([n], tf.constant(index + 1, tf.int32))
        if example_task:
            ex[TASK_INDEX] = tf.constant(index, tf.int32)
        return ex

    return tag


def mixed_examples(
    name: str,
    *,
    sequence_length: Mapping[str, int],
    split: str = "train",
    shuffle: bool = True,
    seed: int | None = None,
    num_epochs: int | None = None,
    shard_info: seqio.ShardInfo | None = None,
    along: Sequence[str] = (),
    example_task: bool = False,
    label_fill: Mapping[str, bool] | None = None,
    task_rates: Mapping[str, float] | None = None,
    known_features: dict[str, frozenset[str]] | None = None,
    shuffle_buffer_size: int | None = None,
) -> tf.data.Dataset:
    """The examples of mixture `name` sampled at its rates, tagged (see the module docstring).

    `label_fill` (label -> per token) gives every example each label its task lacks, as -1:
    a multi-task row's tasks each carry their own labels (`lmsuite.objectives.labels`).
    `task_rates` (task -> rate) samples only those tasks of the mixture, at those rates (a stage of
    a continual schedule, `lmsuite.data.stages`); task ids and features stay the mixture's.
    `known_features` (task -> its tagged examples' feature names) is a memo shared by calls with
    the same split, lengths, `along`, `label_fill` and `example_task` (the stages of one
    schedule): a task left out of `task_rates` whose features it holds is not built, since
    building a task's preprocessing graph is most of a mixture's start-up cost.
    `shuffle_buffer_size`: each task's shuffle buffer (examples) when `shuffle`; None: the
    task's own (SeqIO's default is 1,000).

    Raises:
      ValueError: `name` is not a mixture, no task has `split`, a feature of `along` is missing
        from a task's examples, or the tasks share none of the features `along` names.
    """
    if not is_mixture(name):
        raise ValueError(f"{name!r} is not a registered seqio mixture")
    mixture = seqio.get_mixture_or_task(name)
    tasks = [t for t in mixture.tasks if split in t.splits]
    if not tasks:
        raise ValueError(f"no task of mixture {name!r} has a {split!r} split")
    index = {t.name: i for i, t in enumerate(mixture.tasks)}
    if task_rates is not None:
        unknown = sorted(set(task_rates) - set(index))
        if unknown:
            raise ValueError(f"{unknown} are not tasks of mixture {name!r}: {sorted(index)}")
    known = {} if known_features is None else known_features
    datasets = {}
    for task in tasks:
        if task_rates is not None and task.name not in task_rates and task.name in known:
            continue  # only its features are needed
        ds = task.get_dataset(
            dict(sequence_length),
            split=split,
            shuffle=shuffle,
            seed=seed,
            shard_info=shard_info,
            num_epochs=num_epochs,
            shuffle_buffer_size=shuffle_buffer_size,
        )
        missing = [f for f in along if f not in ds.element_spec]
        if missing:
            raise ValueError(
                f"task {task.name!r} of mixture {name!r} has no feature {missing} to carry task "
                f"ids along; its examples have {sorted(ds.element_spec)}"
            )
        if label_fill:
            ds = ds.map(_filler(label_fill))
        datasets[task.name] = ds.map(_tagger(index[task.name], along, example_task))
        known[task.name] = frozenset(datasets[task.name].element_spec)
    # the features stay every task's shared ones, whatever is sampled
    shared = frozenset.intersection(*(known[t.name] for t in tasks))
    if task_rates is None:
        chosen, weights = tasks, [float(mixture.get_rate(t)) for t in tasks]
    else:
        chosen = [t for t in tasks if t.name in task_rates]
        if not chosen:
            raise ValueError(f"no task of {sorted(task_rates)} has a {split!r} split")
        weights = [float(task_rates[t.name]) for t in chosen]
    datasets = [
        datasets[t.name].map(lambda ex, keep=shared: {k: ex[k] for k in keep}) for t in chosen
    ]
    # SeqIO's choice: the given seed, else unseeded when shuffling, else 42.
    sample_seed = seed if seed is not None else (None if shuffle else 42)
    return tf.data.Dataset.sample_from_datasets(
        datasets, weights=weights, seed=sample_seed, stop_on_empty_dataset=True
    )


def get_dataset(
    name: str,
    *,
    task_feature_lengths: Mapping[str, int],
    feature_converter: seqio.FeatureConverter,
    along: Sequence[str] | None,
    dataset_split: str = "train",
    shuffle: bool = True,
    num_epochs: int | None = None,
    shard_info: seqio.ShardInfo | None = None,
    seed: int | None = None,
    label_fill: Mapping[str, bool] | None = None,
    task_rates: Mapping[str, float] | None = None,
    known_features: dict[str, frozenset[str]] | None = None,
    shuffle_buffer_size: int | None = None,
) -> tf.data.Dataset:
    """`seqio.get_dataset` for a task; for a mixture its `mixed_examples` (tagged along `along`;
    None: untagged) through `feature_converter`, which must then pass `task_ids` through.
    `label_fill` and `shuffle_buffer_size` as in `mixed_examples`, for a task too; `task_rates`
    and `known_features` as there (mixtures only)."""
    if task_rates is not None and not is_mixture(name):
        raise ValueError(f"task rates {dict(task_rates)} need a mixture; {name!r} is a task")
    if not is_mixture(name) and (label_fill or shuffle_buffer_size is not None):
        ds = seqio.get_mixture_or_task(name).get_dataset(
            dict(task_feature_lengths),
            split=dataset_split,
            shuffle=shuffle,
            seed=seed,
            shard_info=shard_info,
            num_epochs=num_epochs,
            shuffle_buffer_size=shuffle_buffer_size,
        )
        if label_fill:
            ds = ds.map(_filler(label_fill))
        return feature_converter(ds, task_feature_lengths=dict(task_feature_lengths))
    if not is_mixture(name):
        return seqio.get_dataset(
            name,
            task_feature_lengths=dict(task_feature_lengths),
            feature_converter=feature_converter,
            dataset_split=dataset_split,
            shuffle=shuffle,
            num_epochs=num_epochs,
            shard_info=shard_info,
            seed=seed,
            verbose=False,
        )
    ds = mixed_examples(
        name,
        sequence_length=task_feature_lengths,
        split=dataset_split,
        shuffle=shuffle,
        seed=seed,
        num_epochs=num_epochs,
        shard_info=shard_info,
        along=along or (),
        label_fill=label_fill,
        task_rates=task_rates,
        known_features=known_features,
        shuffle_buffer_size=shuffle_buffer_size,
    )
    lengths = dict(task_feature_lengths)
    if along:
        lengths[TASK_IDS] = task_ids_length(task_feature_lengths, along)
    return feature_converter(ds, task_feature_lengths=lengths)
