"""experiments/*.gin: every file passes every check `lmsuite train` makes before compiling; the
production ones stop only at their TFDS data, which is not prepared here; the seq2seq tiny twins
learn (slow: a few minutes each), beating the unigram and majority baselines on held-out targets."""

import json
import os
import re
import shlex
from pathlib import Path

import pytest

from lmsuite import cli
from lmsuite.data import mixtures

EXPERIMENTS = sorted(p.stem for p in (cli.GIN_DIR / "experiments").glob("*.gin"))
PRODUCTION = {
    "t5_small": "c4/en:3.1.0",
    "t5_base": "c4/en:3.1.0",
    "t5_1_1_small": "c4/en:3.1.0",
    "t5_1_1_base": "c4/en:3.1.0",
    "bart_base": "wikipedia/20230601.en:1.0.0",
    "mass_base": "wikipedia/20230601.en:1.0.0",
    "bert_base": "wikipedia/20230601.en:1.0.0",
    "bert_large": "wikipedia/20230601.en:1.0.0",
    "albert_base": "wikipedia/20230601.en:1.0.0",
    "albert_large": "wikipedia/20230601.en:1.0.0",
    "albert_xlarge": "wikipedia/20230601.en:1.0.0",
    "albert_xxlarge": "wikipedia/20230601.en:1.0.0",
    "roberta_base": "wikipedia/20230601.en:1.0.0",
    "spanbert_base": "wikipedia/20230601.en:1.0.0",
    "deberta_base": "wikipedia/20230601.en:1.0.0",
    "electra_small": "wikipedia/20230601.en:1.0.0",
    "electra_base": "wikipedia/20230601.en:1.0.0",
    "structbert_base": "wikipedia/20230601.en:1.0.0",
    "unilm_base": "wikipedia/20230601.en:1.0.0",
    "unilm2_base": "wikipedia/20230601.en:1.0.0",
    "xlnet_base": "wikipedia/20230601.en:1.0.0",
    "xlnet_large": "wikipedia/20230601.en:1.0.0",
    "tupe_base": "wikipedia/20230601.en:1.0.0",
    "txl_base": "wikipedia/20230601.en:1.0.0",
    "ul2_base": "c4/en:3.1.0",
    "ernie2_base": "wikipedia/20230601.en:1.0.0",
}
# Extra flags for every twin run, split as a shell would: LMSUITE_TWIN_FLAGS="--gin.ModelConfig.
# dtype=\"'bfloat16'\"" checks that the twins learn in bf16 against the same baselines.
TWIN_FLAGS = shlex.split(os.environ.get("LMSUITE_TWIN_FLAGS", ""))
TINY_SEQ2SEQ = [
    "t5_tiny",
    "t5_1_1_tiny",
    "t5_iid_tiny",
    "t5_prefix_lm_tiny",
    "bart_tiny",
    "mass_tiny",
    "ul2_tiny",
]
TINY_OTHERS = ["xlnet_tiny", "txl_tiny"]
# Encoder twins: held-out MLM cross-entropy below the unigram, per-row labels above the majority.
TINY_ENCODERS = [
    "bert_tiny",
    "roberta_tiny",
    "spanbert_tiny",
    "albert_tiny",
    "ernie_zh_tiny",
    "deberta_tiny",
    "electra_tiny",
    "structbert_tiny",
    "unilm_tiny",
    "tupe_tiny",
    "unilm2_tiny",
    "bert_multitask_tiny",
    "ernie2_tiny",
]
# Twins' auxiliary labels that may stay at chance: twin -> {label, as the report names it: why}.
# The run is an expected failure only when every label that did not learn is listed; the
# other heads must learn. albert_tiny's SOP, at chance on the Wikipedia sample, learns on the
# Shakespeare corpus. bert_multitask_tiny's NSP and 3-way sentence structure learn at some seeds and
# not at others, and flip with changes to the other tasks' rows (benchmarks/RESULTS.md,
# "2026-12-07 (fifth session)" and "(sixth session)"); its MLM and SOP must learn.
_FRAGILE_PAIR_HEAD = (
    "learns at some seeds only in 6,000 steps (held-out p on either side of 0.01 across seeds, "
    "learning rates and other tasks' masks): benchmarks/RESULTS.md, 2026-12-07 (fifth and sixth "
    "sessions)"
)
AUXILIARY_NOT_LEARNT: dict[str, dict[str, str]] = {
    "bert_multitask_tiny": {
        "next sentence label": _FRAGILE_PAIR_HEAD,
        "sentence relation label": _FRAGILE_PAIR_HEAD,
    }
}
# Twins whose masked LM may stay on the unigram plateau (an expected failure, with the reason).
MLM_PLATEAU: dict[str, str] = {}  # unilm2_tiny's left it with TUPE's positions, 2026-12-06
# Staged twins (ERNIE 2.0's continual schedule): stage -> the held-out accuracies of the tasks
# trained before it began (the MLM trains in every stage), none of which may fall by more than
# FORGETTING_MARGIN (absolute) at any evaluation after it began.
EARLIER_TASKS = {
    "ernie2_tiny": {
        2: {"mlm", "capitalization labels"},
        3: {"mlm", "capitalization labels", "token document labels"},
    }
}
FORGETTING_MARGIN = 0.01
# Paper-sized runs on an embedded corpus (no TFDS data to prepare): checked like the tiny ones.
EMBEDDED_PRODUCTION = ["ernie_zh_base"]


# The Makefile's 8 host devices, whatever this host has: the runs' meshes are checked against
# the devices (txl_base's (-1, 1, 2) cannot be made on one).
DEVICES = 8


def _args(name: str, tmp_path, *extra):
    return cli.parse_args(
        ["train", f"--gin_file=experiments/{name}.gin", f"--model_dir={tmp_path}", *extra]
    )


def test_expected_label_failures_name_the_twins_own_labels(tmp_path):
    """An AUXILIARY_NOT_LEARNT entry must match a label the twin's report prints, or the slow
    test would fail (or excuse nothing) for a typo."""
    for name, labels in AUXILIARY_NOT_LEARNT.items():
        assert name in TINY_ENCODERS, name
        kwargs = cli.load_config(_args(name, tmp_path / name), devices=DEVICES)
        label_metrics = kwargs["recipe"].recipe.objective.label_metrics
        printed = {feature.replace("_", " ") for _, feature in label_metrics}
        assert set(labels) <= printed, (name, set(labels) - printed)
        assert set(labels) < printed, f"{name}: one label at least must still learn"


def test_the_issue_lists_every_experiment():
    listed = set(PRODUCTION) | set(TINY_SEQ2SEQ) | set(TINY_OTHERS) | set(TINY_ENCODERS)
    assert listed | set(EMBEDDED_PRODUCTION) | {"default", "smoke"} == set(EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_passes_the_checks_or_stops_only_at_its_data(name, tmp_path):
    text = (cli.GIN_DIR / "experiments" / f"{name}.gin").read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert len(header) >= 2, "the header cites where the settings come from"
    args = _args(name, tmp_path / "run", f"--tfds_data_dir={tmp_path / 'tfds'}")
    if name not in PRODUCTION:
        kwargs = cli.load_config(args, devices=DEVICES)
        assert kwargs["recipe"].recipe.name in text
        return
    with pytest.raises(cli.ConfigError) as error:
        cli.load_config(args, devices=DEVICES)
    assert len(error.value.problems) == 1, error.value.problems
    assert f"{PRODUCTION[name]!r}, which is not prepared" in error.value.problems[0]


@pytest.mark.parametrize(
    "name, lengths, batch, steps",
    [
        ("t5_1_1_small", {"inputs": 512, "targets": 114}, 256, 10_000),
        ("t5_small", {"inputs": 512, "targets": 114}, 2048, 1_000_000),
        ("bart_base", {"inputs": 512, "targets": 512}, 8000, 500_000),
        ("bert_base", {"input_ids": 512, "masked_ids": 80}, 256, 1_000_000),
        ("albert_base", {"input_ids": 512, "masked_ids": 20}, 4096, 125_000),
        ("albert_large", {"input_ids": 512, "masked_ids": 20}, 4096, 125_000),
        ("albert_xlarge", {"input_ids": 512, "masked_ids": 20}, 4096, 125_000),
        ("albert_xxlarge", {"input_ids": 512, "masked_ids": 20}, 4096, 125_000),
        ("roberta_base", {"input_ids": 512, "masked_ids": 80}, 8000, 500_000),
        ("spanbert_base", {"input_ids": 512, "masked_ids": 79}, 256, 2_400_000),
        ("ernie_zh_base", {"input_ids": 512, "masked_ids": 153}, 128, 1_000_000),
        ("deberta_base", {"input_ids": 512, "masked_ids": 80}, 2048, 1_000_000),
        ("electra_small", {"input_ids": 128, "masked_ids": 19}, 128, 1_000_000),
        ("electra_base", {"input_ids": 512, "masked_ids": 79}, 256, 766_000),
        ("structbert_base", {"input_ids": 512, "masked_ids": 79}, 1024, 330_000),
        ("unilm_base", {"input_ids": 512, "masked_ids": 79}, 320, 770_000),
        ("unilm2_base", {"input_ids": 676, "masked_ids": 82}, 7680, 500_000),
        ("xlnet_base", {"input_k": 512, "target": 85}, 256, 1_000_000),
        ("xlnet_large", {"input_k": 512, "target": 85}, 8192, 500_000),
        ("tupe_base", {"input_ids": 512, "masked_ids": 80}, 256, 1_000_000),
        ("txl_base", {"inputs": 150, "targets": 150}, 60, 200_000),
        ("ul2_base", {"inputs": 512, "targets": 512}, 128, 500_000),
        ("ernie2_base", {"input_ids": 512, "masked_ids": 80}, 768, 400_000),
    ],
)
def test_production_settings_are_the_papers(name, lengths, batch, steps, tmp_path, monkeypatch):
    from lmsuite.training import preflight

    monkeypatch.setattr(preflight, "unprepared_tfds", lambda corpus: None)
    kwargs = cli.load_config(_args(name, tmp_path), devices=DEVICES)
    assert kwargs["sequence_length"] == lengths
    assert (kwargs["batch_size"], kwargs["train_steps"]) == (batch, steps)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_info_reads_the_model_the_experiment_trains(name, tmp_path, monkeypatch):
    """`lmsuite info --gin_file=experiments/NAME.gin` counts the run's own model."""
    from lmsuite.training import preflight

    monkeypatch.setattr(preflight, "unprepared_tfds", lambda corpus: None)
    trained = cli.load_config(_args(name, tmp_path), devices=DEVICES)["model_config"]
    assert cli.model_config_from_gin([f"experiments/{name}.gin"]) == trained


def test_pretrain_writes_to_runs_named_after_the_experiment():
    assert cli.parse_args(["pretrain"]).model_dir == "runs/default"
    args = cli.parse_args(["pretrain", "--gin_file=experiments/t5_1_1_tiny.gin"])
    assert args.model_dir == "runs/t5_1_1_tiny"
    makefile = (Path(__file__).parents[2] / "Makefile").read_text()
    assert "--gin_file=experiments/$(EXPERIMENT).gin" in makefile


@pytest.mark.slow
@pytest.mark.parametrize("name", TINY_SEQ2SEQ)
def test_tiny_seq2seq_experiment_learns(name, tmp_path, capsys):
    """Held-out target cross-entropy below the train split's unigram cross-entropy of the same
    held-out targets, and held-out accuracy above always predicting the most frequent target."""
    code = cli.main(
        ["pretrain", f"--gin_file=experiments/{name}.gin", f"--model_dir={tmp_path}"]
        + ["--gin.train.progress_bar=False", *TWIN_FLAGS]
    )
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    accuracy = re.search(r"held-out target accuracy: ([\d.]+) \(always .*: ([\d.]+)\)", out)
    entropy = re.search(
        r"held-out target cross-entropy: ([\d.]+) nats \(unigram .*: ([\d.]+)\)", out
    )
    assert accuracy and entropy, out
    held_accuracy, majority = map(float, accuracy.groups())
    held_entropy, unigram = map(float, entropy.groups())
    assert held_entropy < unigram and held_accuracy > majority, out
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    final = [r for r in records if "eval/seq2seq_cross_entropy" in r][-1]
    assert round(final["eval/seq2seq_cross_entropy"], 4) == held_entropy
    print(json.dumps({name: {"cross_entropy": held_entropy, "unigram": unigram,
                             "accuracy": held_accuracy, "majority": majority}}))  # fmt: skip


def _learned(out: str, what: str) -> dict[str, float]:
    accuracy = re.search(rf"held-out {what} accuracy: ([\d.]+) \(always .*: ([\d.]+)\)", out)
    entropy = re.search(
        rf"held-out {what} cross-entropy: ([\d.]+) nats \(unigram .*: ([\d.]+)\)", out
    )
    assert accuracy and entropy, out
    (held_accuracy, majority), (held_entropy, unigram) = (
        map(float, m.groups()) for m in (accuracy, entropy)
    )
    return dict(accuracy=held_accuracy, majority=majority, cross_entropy=held_entropy,
                unigram=unigram)  # fmt: skip


def _label_results(out: str) -> list[dict[str, float]]:
    pattern = (
        r"held-out ([a-z ]+) accuracy: ([\d.]+) over ([\d,]+) (?:rows|tokens) \(always the most "
        r"frequent \w+: ([\d.]+); binomial p = ([\d.e+-]+)\)"
    )
    return [
        dict(
            name=m[0],
            accuracy=float(m[1]),
            rows=int(m[2].replace(",", "")),
            majority=float(m[3]),
            p=float(m[4]),
        )  # fmt: skip
        for m in re.findall(pattern, out)
    ]


def _per_task_label_results(model_dir, mixture: str, capsys) -> list[dict[str, float]]:
    """A multi-task twin's heads, each over its own task's whole validation split (`lmsuite eval
    --task`). The run's periodic evaluation reads 40 batches of the whole mixture, so each of
    ERNIE 2.0's four heads sees about 330 held-out rows of its split's 385-1,148; over the whole
    split the binomial test has the power a single-task twin's head gets."""
    found = []
    for task in mixtures.task_names(mixture):
        assert (
            cli.main(["eval", f"--model_dir={model_dir}", f"--task={task}", "--batch_size=16"]) == 0
        )
        out = capsys.readouterr().out
        with capsys.disabled():
            print(out)
        found += _label_results(out)
    return found


def _stage_changes(out: str) -> list[dict]:
    pattern = (
        r"held-out ([a-z ]+) accuracy when stage (\d+) began \(step ([\d,]+)\): ([\d.]+); "
        r"lowest after: ([\d.]+) \(fall ([+-][\d.]+)\)"
    )
    return [
        dict(
            metric=m[0],
            stage=int(m[1]),
            step=int(m[2].replace(",", "")),
            before=float(m[3]),
            lowest_after=float(m[4]),
            fall=float(m[5]),
        )  # fmt: skip
        for m in re.findall(pattern, out)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("name", TINY_ENCODERS)
def test_tiny_encoder_experiment_learns(name, tmp_path, capsys):
    """Held-out MLM cross-entropy below the train split's unigram cross-entropy of the same
    held-out targets, and every per-row label (NSP, SOP, ...) above its held-out majority share
    with binomial p < 0.01."""
    from lmsuite.training import recipes, report

    code = cli.main(
        ["pretrain", f"--gin_file=experiments/{name}.gin", f"--model_dir={tmp_path}"]
        + ["--gin.train.progress_bar=False", *TWIN_FLAGS]
    )
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    got = _learned(out, "MLM")
    mlm_learnt = got["cross_entropy"] < got["unigram"] and got["accuracy"] > got["majority"]
    if name in MLM_PLATEAU and not mlm_learnt:
        with capsys.disabled():
            print(json.dumps({name: got}))
        pytest.xfail(MLM_PLATEAU[name])
    assert mlm_learnt, out
    run = json.loads((tmp_path / "run.json").read_text())
    recipe = recipes.get(run["recipe"])
    labels = _label_results(out)
    if mixtures.is_mixture(run["task"]) and recipe.objective.label_heads:
        labels = _per_task_label_results(tmp_path, run["task"], capsys)
    assert len(labels) == len(recipe.objective.label_metrics), out
    learnt = {}  # label -> above its majority share with p < 0.01
    for label in labels:
        right = round(label["accuracy"] * label["rows"])
        p_value = report.binomial_upper_tail(right, label["rows"], label["majority"])
        assert p_value == pytest.approx(label["p"], rel=0.05, abs=1e-300)
        learnt[label["name"]] = label["accuracy"] > label["majority"] and p_value < 0.01
    rtd = re.findall(
        r"held-out rtd accuracy: ([\d.]+) over ([\d,]+) tokens \(always the larger class: "
        r"([\d.]+); binomial p = ([\d.e+-]+)\)",
        out,
    )
    assert len(rtd) == ("rtd_accuracy" in recipe.objective.metrics), out
    for accuracy, tokens, majority, p in rtd:  # always "real" scores 1 - the replaced share
        n = int(tokens.replace(",", ""))
        p_value = report.binomial_upper_tail(round(float(accuracy) * n), n, float(majority))
        assert p_value == pytest.approx(float(p), rel=0.05, abs=1e-300)
        learnt["rtd"] = float(accuracy) > float(majority) and p_value < 0.01
    changes = _stage_changes(out)
    forgotten = [
        c for c in changes
        if c["metric"] in EARLIER_TASKS.get(name, {}).get(c["stage"], ()) and
        c["fall"] > FORGETTING_MARGIN
    ]  # fmt: skip
    for stage, metrics in EARLIER_TASKS.get(name, {}).items():
        assert metrics == {c["metric"] for c in changes if c["stage"] == stage}, out
    with capsys.disabled():
        print(json.dumps({name: got | {"labels": labels, "stages": changes}}))
    assert not forgotten, forgotten
    not_learnt = sorted(label for label, ok in learnt.items() if not ok)
    expected = AUXILIARY_NOT_LEARNT.get(name, {})
    if not_learnt and set(not_learnt) <= set(expected):
        pytest.xfail("; ".join(f"{label}: {expected[label]}" for label in not_learnt))
    assert not not_learnt, out


def test_the_stage_report_compares_only_what_trained_before_each_stage(tmp_path):
    """ernie2_tiny's schedule: the accuracies trained before stages 2 and 3, found from each
    task's own features, are EARLIER_TASKS; the report gives their falls and names the rest."""
    from lmsuite.cli import pretrain_report

    args = cli.parse_args(
        ["train", "--gin_file=experiments/ernie2_tiny.gin", f"--model_dir={tmp_path}"]
    )  # fmt: skip
    run = cli.load_run(args)
    trained = pretrain_report.trained_before_stages(run, run.built())
    expected = EARLIER_TASKS["ernie2_tiny"]
    assert {
        stage: {m.removeprefix("eval/").removesuffix("_accuracy").replace("_", " ") for m in ms}
        for stage, ms in trained.items()
    } == expected
    heads = ("mlm", "capitalization_labels", "token_document_labels",
             "sentence_reordering_label", "sentence_distance_label")  # fmt: skip
    records = [{"step": 0, "data/stage": 1}]
    for step, value in ((500, 0.5), (1000, 0.4), (1500, 0.45), (2000, 0.3)):
        records.append({"step": step, **{f"eval/{h}_accuracy": value for h in heads}})
        if step in (500, 1500):
            records.append({"step": step, "data/stage": 2 if step == 500 else 3})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = pretrain_report.stage_text(tmp_path, trained)
    changes = _stage_changes(out)
    assert {(c["metric"], c["stage"]) for c in changes} == {
        (metric, stage) for stage, metrics in expected.items() for metric in metrics
    }
    # lowest after: 0.3 at step 2000, against 0.5 (step 500) and 0.45 (step 1500)
    assert all(round(c["fall"], 4) == (0.2 if c["stage"] == 2 else 0.15) for c in changes), out
    assert (
        "not compared at stage 2 (step 500), their tasks had not trained yet: sentence distance "
        "label, sentence reordering label, token document labels" in out
    )


def test_label_baselines_by_hand():
    import numpy as np

    from lmsuite.training import report

    assert report.label_majority(
        [{"y": np.array([0, 1, 1])}, {"y": np.array([2, 1])}], label="y"
    ) == (0.6, 5)
    # 8 of 10 right where chance is 1/2: (45 + 10 + 1) / 1024
    assert report.binomial_upper_tail(8, 10, 0.5) == pytest.approx(56 / 1024)
    assert report.binomial_upper_tail(0, 10, 0.3) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="successes"):
        report.binomial_upper_tail(11, 10, 0.5)
    with pytest.raises(ValueError, match="carry no 'y'"):
        report.label_majority([{"z": np.array([1])}], label="y")


@pytest.mark.slow
def test_xlnet_tiny_learns_with_and_without_memory(tmp_path, capsys):
    """Held-out PLM cross-entropy below the unigram cross-entropy of the same held-out targets,
    accuracy above the majority target, with the memory carried and without it (reported)."""
    figures = {}
    for memory in (True, False):
        argv = [
            "pretrain",
            "--gin_file=experiments/xlnet_tiny.gin",
            "--gin.train.progress_bar=False",
        ]
        argv += [f"--model_dir={tmp_path / str(memory)}"]
        argv += [f"--gin.make_recipe.loss_options={{'memory': {memory}}}", *TWIN_FLAGS]
        code = cli.main(argv)
        out = capsys.readouterr().out
        assert code == 0, out[-3000:]
        figures[f"memory={memory}"] = got = _learned(out, "PLM")
        assert got["cross_entropy"] < got["unigram"] and got["accuracy"] > got["majority"], out
    with capsys.disabled():
        print(json.dumps({"xlnet_tiny": figures}))


def test_baselines_by_hand():
    import numpy as np

    from lmsuite.training import report

    held = [{"t": np.array([[5, 5, 7, 0]]), "w": np.array([[1, 1, 1, 0]])}]
    train = [{"t": np.array([[5, 7, 7, 7, 3]]), "w": np.array([[1, 1, 1, 1, 0]])}]
    got = report.baselines(held, train_batches=train, targets="t", weights="w", vocab_size=8)
    assert got.majority == pytest.approx(2 / 3)
    # add-one unigram over 8 ids from 4 train targets: p(5) = 2/12, p(7) = 4/12
    expected = -(2 * np.log(2 / 12) + np.log(4 / 12)) / 3
    assert got.unigram_cross_entropy == pytest.approx(expected)
    assert (got.held_out_targets, got.train_targets) == (3, 4)
