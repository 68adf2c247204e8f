"""What `lmsuite tasks list` and `lmsuite tasks show NAME --n 3` print.

`show_task` decodes examples piece by piece so a user sees exactly what the model sees:
specials as `[CLS]`, `[SEP]`, `[MASK]`, `</s>`, sentinels as `<X0>`, `<X1>`, ...; trailing
padding is dropped; other features (labels, masked positions, ...) are printed as lists.

Example (wiki_sample_t5_span_corruption):
  --- example 0
  inputs:  In Greek mythology<X0> a Greek hero of the Trojan War<X1> ...</s>
  targets: <X0>, Achilles or Achilleus was<X1> ...</s>
A mixture's examples (`wiki_sample_seq2seq_mixture`) are sampled at its rates, each headed by
its task (`task: wiki_sample_prefix_lm`).
"""

import numpy as np
import seqio

import lmsuite.data.tasks  # noqa: F401  (registers the tasks)
from lmsuite.data import mixtures
from lmsuite.data import vocab as vocab_lib

DEFAULT_LENGTHS = {
    "input_ids": 128,
    "inputs": 128,
    "targets": 64,
    "input_k": 128,
}
_SPECIAL_NAMES = {
    vocab_lib.PAD_ID: "[PAD]",
    vocab_lib.UNK_ID: "[UNK]",
    vocab_lib.CLS_ID: "[CLS]",
    vocab_lib.SEP_ID: "[SEP]",
    vocab_lib.MASK_ID: "[MASK]",
    vocab_lib.BOS_ID: "<s>",
    vocab_lib.EOS_ID: "</s>",
}


def list_tasks() -> list[str]:
    """Every registered task and mixture name, sorted."""
    return sorted(set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names()))


def render_ids(ids, vocab: seqio.SentencePieceVocabulary) -> str:
    """Decodes ids piece by piece, showing specials and sentinels.

    Example: [2, 812, 4, 8099, 3] -> "[CLS] the[MASK]<X0>[SEP]" (when 812 is "▁the").
    """
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    while ids and ids[-1] == vocab_lib.PAD_ID:
        ids.pop()
    base_size = vocab.vocab_size - vocab.extra_ids
    parts = []
    for i in ids:
        if i in _SPECIAL_NAMES:
            parts.append(_SPECIAL_NAMES[i])
        elif i >= base_size:
            parts.append(f"<X{vocab.vocab_size - 1 - i}>")
        else:
            parts.append(vocab.tokenizer.id_to_piece(i).replace(vocab_lib.WORD_START, " "))
    return "".join(parts).strip()


def show_task(
    name: str,
    *,
    n: int = 3,
    split: str = "validation",
    seed: int = 0,
    sequence_length: dict[str, int] | None = None,
) -> str:
    """Returns `n` decoded examples of task (or mixture) `name`."""
    if name not in list_tasks():
        raise ValueError(f"unknown task {name!r}; `lmsuite tasks list` shows the registered ones")
    task = seqio.get_mixture_or_task(name)
    features = task.output_features
    lengths = sequence_length or {k: DEFAULT_LENGTHS.get(k, 128) for k in features}
    if mixtures.is_mixture(name):
        # Every feature the tasks share, each example with the task it came from.
        dataset = mixtures.mixed_examples(
            name, sequence_length=lengths, split=split, shuffle=False, seed=seed, example_task=True
        )
        shares = ", ".join(f"{t} {r:.0%}" for t, r in mixtures.rates(name).items())
        head = f"mixture {name} ({split}, sequence_length={lengths}; rates: {shares})"
    else:
        dataset = task.get_dataset(lengths, split=split, shuffle=False, seed=seed)
        head = f"task {name} ({split}, sequence_length={lengths})"
    names = mixtures.task_names(name)
    lines = [head]
    for index, example in enumerate(dataset.take(n).as_numpy_iterator()):
        lines.append(f"--- example {index}")
        if mixtures.TASK_INDEX in example:
            lines.append(f"task: {names[int(example.pop(mixtures.TASK_INDEX))]}")
        for key in sorted(example):
            value = example[key]
            if key in features:
                lines.append(f"{key}: {render_ids(value, features[key].vocabulary)}")
            elif key == "masked_ids":
                vocab = next(iter(features.values())).vocabulary
                pieces = [render_ids([i], vocab) for i in value if i != vocab_lib.PAD_ID]
                lines.append(f"{key}: {' | '.join(pieces)}")
            elif isinstance(value, bytes | np.bytes_):
                lines.append(f"{key}: {value.decode('utf-8', 'replace')[:200]}")
            else:
                lines.append(f"{key}: {np.asarray(value).tolist()}")
    return "\n".join(lines)
