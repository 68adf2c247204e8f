"""`study_report`: ties by the seeds' spread, the headline claims' verdicts, the written report."""

import csv

import numpy as np
import pytest

from lmsuite.evaluation import study_report

PROBES = ("trec_questions", "vader_sentiment")
PROTOCOL = {"match": "flops", "probes": list(PROBES), "learning_rates": [1e-3, 3e-3],
            "probe_epochs": 3, "probe_batch_size": 32, "probe_max_length": 64,
            "probe_max_train": None, "bindings": []}  # fmt: skip


def _run(experiment, budget, seed, trec, vader=0.6, steps=100):
    flops = 0.0 if budget is None else budget * (1 + 0.01 * seed)
    probes = {
        name: {"test_accuracy": acc, "dev_accuracy": acc, "selected_learning_rate": 1e-3,
               "test_majority_class_share": 0.2, "seconds": 2.0}
        for name, acc in (("trec_questions", trec), ("vader_sentiment", vader))
    }  # fmt: skip
    return {"experiment": experiment, "budget": budget, "match": "flops", "seed": seed,
            "recipe": experiment.removesuffix("_tiny"), "params": 1000, "steps": steps,
            "flops": flops, "tokens": 10 * steps, "held_out_metric": "eval/mlm_loss",
            "held_out": {"eval/mlm_loss": 5.0 + seed}, "pretrain_seconds": 10.0,
            "probes": probes}  # fmt: skip


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ([0.60, 0.62, 0.61], [0.55, 0.56, 0.54], ">"),
        ([0.55, 0.56, 0.54], [0.60, 0.62, 0.61], "<"),
        ([0.60, 0.64, 0.62], [0.59, 0.61, 0.57], "tie"),  # 0.62 - 0.59 < 0.02 + 0.02
        ([0.90], [0.10], "one seed"),  # no spread to judge by: neither a difference nor a tie
        ([0.50, 0.50], [0.50], "one seed"),  # equal means, but one side has one seed
        ([0.5, 0.5], [0.4, 0.4], ">"),  # no spread at all: any difference counts
    ],
)
def test_compare_calls_a_difference_only_beyond_the_seeds_spread(a, b, expected):
    assert study_report.compare(a, b) == expected


def test_claims_are_reproduced_tied_not_reproduced_or_not_judged():
    results = []
    for seed in range(3):
        results += [
            _run("electra_tiny", 1e12, seed, trec=0.70 + 0.01 * seed),
            _run("bert_tiny", 1e12, seed, trec=0.50 + 0.01 * seed),
            _run("spanbert_tiny", 1e12, seed, trec=0.40 + 0.01 * seed),
            _run("t5_1_1_tiny", 1e12, seed, trec=0.50 + 0.05 * seed),
            _run("t5_iid_tiny", 1e12, seed, trec=0.52 + 0.05 * seed),
        ]
    lines = "\n".join(study_report.claims(results, ["trec_questions"], "flops"))
    assert "ELECTRA" in lines and "trec_questions: **reproduced** (electra_tiny 0.710" in lines
    assert "SpanBERT" in lines and "**not reproduced** (spanbert_tiny 0.410" in lines
    assert "span corruption >= i.i.d. denoising, 1e+12 flops, trec_questions: **tie**" in lines
    assert "i.i.d. denoising >= prefix LM: not judged (the study has no t5_prefix_lm_tiny)" in lines
    one_seed = "\n".join(
        study_report.claims([r for r in results if r["seed"] == 0], ["trec_questions"], "flops")
    )
    assert "trec_questions: **not judged yet (one seed)** (electra_tiny 0.700 vs" in one_seed


def test_rankings_name_the_leader_its_ties_or_that_it_ran_alone():
    results = []
    for seed in range(3):
        results += [
            _run("electra_tiny", 1e12, seed, trec=0.70 + 0.01 * seed),
            _run("bert_tiny", 1e12, seed, trec=0.68 + 0.02 * seed),  # overlaps electra's range
            _run("spanbert_tiny", 1e12, seed, trec=0.40 + 0.01 * seed),
            _run("bert_tiny", 4e12, seed, trec=0.60),  # a study stopped during its 4F runs
        ]
    lines = study_report.rankings(results, ["trec_questions"], "flops")
    assert lines == [
        "- 1e+12 flops, trec_questions: best electra_tiny (0.710 +- 0.010); tied with it: "
        "bert_tiny",
        "- 4e+12 flops, trec_questions: best bert_tiny (0.600 +- 0.000); the only objective at "
        "this budget so far",
    ]
    no_tie = [r for r in results if r["experiment"] != "bert_tiny"]
    assert study_report.rankings(no_tie, ["trec_questions"], "flops") == [
        "- 1e+12 flops, trec_questions: best electra_tiny (0.710 +- 0.010); no tie"
    ]
    # bert_tiny with one seed: its range cannot be told from electra's, nor called a tie
    one_seed_bert = [r for r in results if r["experiment"] != "bert_tiny" or r["seed"] == 0]
    assert study_report.rankings(one_seed_bert, ["trec_questions"], "flops")[0] == (
        "- 1e+12 flops, trec_questions: best electra_tiny (0.710 +- 0.010); no tie; "
        "not judged yet (one seed): bert_tiny"
    )


def test_each_objective_is_judged_against_its_own_architecture_from_scratch():
    results = []
    for seed in range(3):
        results += [
            _run("electra_tiny", None, seed, trec=0.50 + 0.01 * seed),
            _run("electra_tiny", 1e12, seed, trec=0.60 + 0.01 * seed),  # +0.10, beyond 0.02
            _run("bert_tiny", None, seed, trec=0.50 + 0.02 * seed),
            _run("bert_tiny", 1e12, seed, trec=0.49 + 0.02 * seed),  # -0.01, within 0.04
            _run("spanbert_tiny", 1e12, seed, trec=0.70),  # no scratch run: no row
        ]
    lines = study_report.versus_scratch(results, ["trec_questions"], "flops")
    assert lines == [
        "| experiment | 1e+12 flops, trec_questions |",
        "|---|---|",
        "| bert_tiny | -0.010 (tie) |",
        "| electra_tiny | +0.100 (better) |",
    ]
    one_seed = [r for r in results if r["seed"] == 0 or r["budget"] is not None]
    assert study_report.versus_scratch(one_seed, ["trec_questions"], "flops")[2:] == [
        "| bert_tiny | +0.010 (one seed) |",  # 0.51 over the 3 seeds against seed 0's 0.50
        "| electra_tiny | +0.110 (one seed) |",
    ]
    without_scratch = [r for r in results if r["budget"] is not None]
    assert study_report.versus_scratch(without_scratch, ["trec_questions"], "flops") == []


def test_rates_chosen_on_the_sweeps_edges_are_counted():
    results = [_run("bert_tiny", 1e12, seed, trec=0.5) for seed in range(4)]
    for record, rate in zip(results, [3e-3, 3e-3, 3e-3, 1e-3], strict=True):
        record["probes"]["trec_questions"]["selected_learning_rate"] = rate
    assert study_report.sweep_edges(results, ["trec_questions"], [3e-4, 1e-3, 3e-3]) == [
        "- trec_questions: the largest rate (0.003) chosen by 3 of 4 runs, the smallest "
        "(0.0003) by 0; the best rate may lie beyond the grid"
    ]
    results[0]["probes"]["trec_questions"]["selected_learning_rate"] = 1e-3
    assert study_report.sweep_edges(results, ["trec_questions"], [3e-4, 1e-3, 3e-3]) == [
        "- trec_questions: the largest rate (0.003) chosen by 2 of 4 runs, the smallest "
        "(0.0003) by 0"
    ]
    assert study_report.sweep_edges(results, ["trec_questions"], [1e-3]) == []


def test_the_report_states_means_sds_budgets_and_writes_every_file(tmp_path):
    results = [
        _run(e, b, s, trec=0.3 + 0.1 * s + (0.2 if e == "electra_tiny" else 0.0))
        for e in ("bert_tiny", "electra_tiny")
        for b in (1e12, 4e12, None)
        for s in range(3)
    ]
    command = ["lmsuite", "study", "--flops=1e12,4e12", "--out=my study"]
    path = study_report.write_report(str(tmp_path), results, protocol=PROTOCOL, command=command)
    text = open(path).read()
    assert "Produced by `lmsuite study --flops=1e12,4e12 '--out=my study'`." in text
    trec = [0.5, 0.6, 0.7]  # electra_tiny's three seeds
    mean, sd = np.mean(trec), np.std(trec, ddof=1)
    row = next(
        line for line in text.splitlines() if line.startswith("| electra_tiny | electra | 4e+12")
    )
    assert f"{mean:.3f} +- {sd:.3f}" in row
    assert "max off 2.0%" in row  # seed 2 spent 2% over the budget
    assert "mlm_loss 6.000 +- 1.000" in row
    assert "| electra_tiny | electra | none (scratch) | 3 |" in text
    for name in (study_report.PLOT_FILE, study_report.OBJECTIVES_PLOT_FILE):
        assert (tmp_path / name).stat().st_size > 10_000
    assert "## Pretraining against no pretraining" in text  # scratch runs equal to trained ones
    assert "| electra_tiny | +0.000 (tie) | +0.000 (tie) | +0.000 (tie) | +0.000 (tie) |" in text
    with open(tmp_path / study_report.CSV_FILE) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(results)
    written = sorted(float(r["trec_questions/test_accuracy"]) for r in rows)
    assert written == pytest.approx(sorted(r["probes"]["trec_questions"]["test_accuracy"]
                                           for r in results))  # fmt: skip
    assert "best electra_tiny" in text
