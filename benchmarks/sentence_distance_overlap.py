"""How far word overlap alone carries ERNIE 2.0's sentence distance from the training articles to
unseen ones: a reference for what `ernie2_tiny`'s head could learn on the embedded corpus.

    python benchmarks/sentence_distance_overlap.py [--task=wiki_sample_ernie2_sentence_distance]

Each `[CLS] A [SEP] B [SEP]` row (one pass of the task, masked pieces restored) becomes six
numbers: a constant, the Jaccard overlap of A's and B's piece sets, the count and the share of
the pieces they share outside the 200 most frequent training pieces, and the log sizes of both
sets. A 3-class logistic regression (full-batch gradient descent on the standardised features)
is fitted on the train split and scored on the held-out split, against always the most frequent
class, with the binomial p. No position, order or meaning: a model that reads only which
pieces the two sentences share.
"""

import argparse
import collections
import sys

import numpy as np
import seqio

from lmsuite.data import (
    tasks,  # noqa: F401  (registers the tasks)
    vocab,
)
from lmsuite.data.preprocessors import ernie2
from lmsuite.training import report

LENGTHS = {"input_ids": 128, "masked_ids": 20}
FREQUENT = 200  # pieces this frequent (by training count rank) are left out of the rare overlap


def restored_sides(ex) -> tuple[set[int], set[int]]:
    """The piece sets of A and B, with every masked piece put back.

    Example: input_ids [2, 10, 4, 3, 12, 3] ([CLS] 10 [MASK] [SEP] 12 [SEP]), token_type_ids
    [0, 0, 0, 0, 1, 1], masked position 2 holding 11 -> ({10, 11}, {12}).
    """
    ids = np.array(ex["input_ids"])
    used = np.asarray(ex["masked_weights"]) > 0
    ids[np.asarray(ex["masked_positions"])[used]] = np.asarray(ex["masked_ids"])[used]
    body = ids > vocab.EOS_ID  # the specials are never masked
    types = np.asarray(ex["token_type_ids"])
    return set(ids[body & (types == 0)].tolist()), set(ids[body & (types == 1)].tolist())


def features(a: set[int], b: set[int], frequent: set[int]) -> list[float]:
    rare_a, rare_b = a - frequent, b - frequent
    shared = len(rare_a & rare_b)
    return [
        1.0,
        len(a & b) / max(1, len(a | b)),
        float(shared),
        shared / max(1, min(len(rare_a), len(rare_b))),
        float(np.log1p(len(a))),
        float(np.log1p(len(b))),
    ]


def rows(task: str, split: str) -> tuple[list[tuple[set[int], set[int]]], np.ndarray]:
    dataset = seqio.get_mixture_or_task(task).get_dataset(
        LENGTHS, split=split, shuffle=False, num_epochs=1, use_cached=False
    )
    sides, labels = [], []
    for ex in dataset.as_numpy_iterator():
        sides.append(restored_sides(ex))
        labels.append(int(ex[ernie2.DISTANCE_KEY]))
    return sides, np.array(labels)


def fit(x: np.ndarray, y: np.ndarray, *, classes: int, steps: int = 3000, lr: float = 0.5):
    weights = np.zeros((x.shape[1], classes))
    target = np.eye(classes)[y]
    for _ in range(steps):
        z = x @ weights
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        weights -= lr * x.T @ (p - target) / len(y)
    return weights


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="wiki_sample_ernie2_sentence_distance")
    args = parser.parse_args(argv)
    train_sides, train_y = rows(args.task, "train")
    held_sides, held_y = rows(args.task, "validation")
    counts = collections.Counter(p for a, b in train_sides for p in (*a, *b))
    frequent = {p for p, _ in counts.most_common(FREQUENT)}
    x = np.array([features(a, b, frequent) for a, b in train_sides])
    x_held = np.array([features(a, b, frequent) for a, b in held_sides])
    mean, scale = x[:, 1:].mean(0), x[:, 1:].std(0) + 1e-9
    x[:, 1:], x_held[:, 1:] = (x[:, 1:] - mean) / scale, (x_held[:, 1:] - mean) / scale
    weights = fit(x, train_y, classes=3)
    out = {}
    for split, xs, ys in (("train", x, train_y), ("held-out", x_held, held_y)):
        accuracy = float(((xs @ weights).argmax(1) == ys).mean())
        majority = float(np.bincount(ys).max() / len(ys))
        line = report.label_line(
            "word_overlap_accuracy", "label", accuracy, rows=len(ys), majority=majority,
            unit="rows",
        )  # fmt: skip
        print(line.replace("held-out", split, 1))
        out[split] = accuracy
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
