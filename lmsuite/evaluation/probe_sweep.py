"""One probe recipe for every pretrained model: a learning-rate sweep selected on a dev split
carved from the probe's train split, the selected rate's accuracy reported on the probe's own
held-out split (which chooses nothing). `lmsuite study` runs it for every run it trains.

  result = sweep(loaded, "trec_questions", out_dir="runs/x/probes", learning_rates=(1e-4, 1e-3),
                 seed=0)
  result["test_accuracy"], result["selected_learning_rate"]

Each rate's metrics are written to `out_dir/<probe>/lr<rate>/metrics.json` as it finishes, and
a rate whose file exists is not trained again: a killed sweep resumes with the next rate.
"""

import json
import os
import time
from collections.abc import Sequence

import numpy as np

from lmsuite.evaluation import finetune, finetune_data

DEV_FRACTION = 0.1  # of the probe's train split, chosen once (seed DEV_SEED) for every run
DEV_SEED = 0


def dev_split(
    train: list, *, fraction: float = DEV_FRACTION, max_train: int | None = None
) -> tuple[list, list]:
    """(train', dev): a fixed random `fraction` of `train` held out for choosing the learning
    rate, the same rows for every model; `max_train` keeps the first that many of train' (a
    toy budget's shortcut).

    Example: 5,452 TREC questions -> 4,907 to fine-tune on, 545 to choose the rate.
    """
    if not 0 < fraction < 1:
        raise ValueError(f"the dev fraction must be in (0, 1), got {fraction}")
    if len(train) < 2:
        raise ValueError(f"a dev split needs at least 2 train examples, got {len(train)}")
    order = np.random.default_rng(DEV_SEED).permutation(len(train))
    n_dev = max(1, round(fraction * len(train)))
    dev = [train[i] for i in order[:n_dev]]
    rest = [train[i] for i in order[n_dev:]]
    if max_train is not None:
        if max_train < 1:
            raise ValueError(f"max_train must be >= 1, got {max_train}")
        rest = rest[:max_train]
    return rest, dev


def _rate_name(rate: float) -> str:
    return f"lr{rate:g}"


def sweep(
    model,
    probe: str,
    *,
    out_dir: str,
    learning_rates: Sequence[float],
    seed: int,
    epochs: int = 3,
    batch_size: int = 32,
    max_length: int = 64,
    max_train: int | None = None,
    max_dev: int | None = None,
    from_scratch: bool = False,
) -> dict:
    """Fine-tunes `model` (a `LoadedModel` or a path) on `probe` once per learning rate and
    returns the rate with the best dev accuracy (the first of equals) and its test accuracy.

    Returns:
      {"probe", "selected_learning_rate", "dev_accuracy", "test_accuracy",
       "test_majority_class_share", "test_examples", "per_rate": {rate: {dev, test}},
       "seconds"} (seconds: the fine-tuning time of every rate, each kept in its metrics.json,
       so a sweep resumed after a stop counts the rates an earlier process ran).
    """
    if not learning_rates:
        raise ValueError("the sweep needs at least one learning rate")
    bad = [r for r in learning_rates if not (np.isfinite(r) and r > 0)]
    if bad:
        raise ValueError(f"learning rates must be finite and > 0, got {bad}")
    train, test, labels = finetune_data.probe_examples(probe)
    train, dev = dev_split(train, max_train=max_train)
    if max_dev is not None:
        dev = dev[:max_dev]
    model = finetune.open_model(model)
    per_rate = {}
    for rate in learning_rates:
        path = os.path.join(out_dir, probe, _rate_name(rate), "metrics.json")
        if os.path.exists(path):
            with open(path) as f:
                per_rate[rate] = json.load(f)
            continue
        started = time.perf_counter()
        result = finetune.finetune_classifier(
            model,
            train=train,
            validation=dev,
            test=test,
            num_labels=len(labels),
            learning_rate=rate,
            epochs=epochs,
            batch_size=batch_size,
            max_length=max_length,
            seed=seed,
            from_scratch=from_scratch,
            progress=False,
        )
        m = result.metrics
        record = {
            "dev_accuracy": m["validation_accuracy"],
            "test_accuracy": m["test_accuracy"],
            "test_majority_class_share": m["test_majority_class_share"],
            "train_examples": len(train),
            "dev_examples": len(dev),
            "test_examples": len(test),
            "history": result.history,
            "seconds": time.perf_counter() - started,
        }
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f, indent=1)
        os.replace(tmp, path)  # whole or absent: a killed sweep never reads half a file
        per_rate[rate] = record
    best = max(
        learning_rates, key=lambda r: (per_rate[r]["dev_accuracy"], -learning_rates.index(r))
    )
    chosen = per_rate[best]
    return {
        "probe": probe,
        "selected_learning_rate": best,
        "dev_accuracy": chosen["dev_accuracy"],
        "test_accuracy": chosen["test_accuracy"],
        "test_majority_class_share": chosen["test_majority_class_share"],
        "test_examples": chosen["test_examples"],
        "per_rate": {
            f"{r:g}": {"dev": per_rate[r]["dev_accuracy"], "test": per_rate[r]["test_accuracy"]}
            for r in learning_rates
        },
        "seconds": sum(per_rate[r].get("seconds", 0.0) for r in learning_rates),
    }
