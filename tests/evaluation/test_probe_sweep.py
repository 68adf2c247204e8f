"""`probe_sweep`: one fixed dev split, the rate chosen on it, no rate trained twice."""

import json

import pytest

from lmsuite.evaluation import finetune, finetune_data, probe_sweep


def test_the_dev_split_is_fixed_disjoint_and_a_tenth():
    train, _, _ = finetune_data.probe_examples("trec_questions")
    rest, dev = probe_sweep.dev_split(train)
    again, dev_again = probe_sweep.dev_split(train)
    assert dev == dev_again and rest == again
    assert len(dev) == round(0.1 * len(train)) and len(rest) + len(dev) == len(train)
    ids = {id(e) for e in dev}
    assert not any(id(e) in ids for e in rest)
    assert probe_sweep.dev_split(train, max_train=50)[0] == rest[:50]


@pytest.mark.parametrize("bad", [0.0, 1.0])
def test_a_dev_fraction_outside_zero_one_is_refused(bad):
    with pytest.raises(ValueError, match=f"got {bad}"):
        probe_sweep.dev_split([1, 2, 3], fraction=bad)


class _Result:
    def __init__(self, dev, test):
        self.metrics = {"validation_accuracy": dev, "test_accuracy": test,
                        "test_majority_class_share": 0.2}  # fmt: skip
        self.history = [{"epoch": 1}]


def test_the_best_dev_rate_is_chosen_and_its_test_accuracy_reported(tmp_path, monkeypatch):
    calls = []
    by_rate = {1e-4: (0.50, 0.90), 1e-3: (0.70, 0.60), 3e-3: (0.70, 0.10)}

    def fake(model, *, learning_rate, train, validation, test, **kwargs):
        calls.append(learning_rate)
        assert not {id(e) for e in train} & {id(e) for e in validation}
        return _Result(*by_rate[learning_rate])

    monkeypatch.setattr(finetune, "finetune_classifier", fake)
    monkeypatch.setattr(finetune, "open_model", lambda m: m)
    out = probe_sweep.sweep(
        "model", "vader_sentiment", out_dir=str(tmp_path), learning_rates=(1e-4, 1e-3, 3e-3), seed=0
    )
    # 1e-3 and 3e-3 tie on dev: the first is taken; the test split chooses nothing
    assert out["selected_learning_rate"] == 1e-3 and out["test_accuracy"] == 0.60
    assert out["per_rate"]["0.0001"] == {"dev": 0.50, "test": 0.90}
    assert calls == [1e-4, 1e-3, 3e-3]
    saved = json.loads((tmp_path / "vader_sentiment" / "lr0.001" / "metrics.json").read_text())
    assert saved["dev_accuracy"] == 0.70

    # a resumed sweep reads the finished rates back and trains only the new one
    by_rate[1e-2] = (0.95, 0.40)
    again = probe_sweep.sweep(
        "model", "vader_sentiment", out_dir=str(tmp_path),
        learning_rates=(1e-4, 1e-3, 3e-3, 1e-2), seed=0,
    )  # fmt: skip
    assert calls == [1e-4, 1e-3, 3e-3, 1e-2]
    assert again["selected_learning_rate"] == 1e-2 and again["test_accuracy"] == 0.40
    # its time counts the rates the first sweep ran, as each rate's metrics.json recorded them
    rate_seconds = [
        json.loads((tmp_path / "vader_sentiment" / name / "metrics.json").read_text())["seconds"]
        for name in ("lr0.0001", "lr0.001", "lr0.003", "lr0.01")
    ]
    assert all(t > 0 for t in rate_seconds)
    assert out["seconds"] == pytest.approx(sum(rate_seconds[:3]))
    assert again["seconds"] == pytest.approx(sum(rate_seconds))
