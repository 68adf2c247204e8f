"""The report of an `lmsuite study`: a table (mean +- sd over seeds per experiment and budget),
the literature's headline comparisons judged with ties stated, each objective against its own
architecture without pretraining (the baseline pretraining has to beat), and two plots: probe
accuracy against training FLOPs, and every objective side by side per budget.

Ties: two objectives differ only when their seeds' ranges of mean +- sd do not overlap
(|mean_a - mean_b| > sd_a + sd_b); otherwise the difference is within the seeds' spread and
reported as a tie. With fewer than MIN_SEEDS seeds on either side there is no spread to
judge by: the comparison reads "not judged yet (one seed)", neither a difference nor a tie.

  write_report("studies/small", results, protocol={...})  # report.md, results.csv, *.png
"""

import csv
import os
import shlex
from collections.abc import Sequence

import numpy as np

REPORT_FILE = "report.md"
CSV_FILE = "results.csv"
PLOT_FILE = "accuracy_vs_flops.png"
OBJECTIVES_PLOT_FILE = "accuracy_by_objective.png"
FILES = (REPORT_FILE, CSV_FILE, PLOT_FILE, OBJECTIVES_PLOT_FILE)  # what write_report writes
MIN_SEEDS = 2  # seeds a side needs before its spread can judge a difference
UNJUDGED = "one seed"  # compare's verdict with fewer than MIN_SEEDS seeds on a side
VERDICT_WORDS = {">": "better", "<": "worse", "tie": "tie", UNJUDGED: UNJUDGED}
CLAIM_WORDS = {">": "reproduced", "<": "not reproduced", "tie": "tie",
               UNJUDGED: "not judged yet (one seed)"}  # fmt: skip

# The papers' headline directions: (claim, the experiments that should be at least as good,
# the experiments they are compared with); the first experiment of each list that the study
# ran is used. Both sides must be in the study for a claim to be judged.
CLAIMS = (
    ("ELECTRA: replaced-token detection >= masked LM at equal compute", ("electra_tiny",),
     ("roberta_tiny", "bert_tiny")),
    ("T5: span corruption >= i.i.d. denoising", ("t5_1_1_tiny",), ("t5_iid_tiny",)),
    ("T5: i.i.d. denoising >= prefix LM", ("t5_iid_tiny",), ("t5_prefix_lm_tiny",)),
    ("SpanBERT: span masking (+ boundary objective) >= token masking", ("spanbert_tiny",),
     ("roberta_tiny", "bert_tiny")),
)  # fmt: skip


def summarize(values: Sequence[float]) -> tuple[float, float, int]:
    """(mean, sample sd (0 for one value), n)."""
    array = np.asarray(values, float)
    sd = float(array.std(ddof=1)) if len(array) > 1 else 0.0
    return float(array.mean()), sd, len(array)


def compare(a: Sequence[float], b: Sequence[float]) -> str:
    """ ">" when a's mean is above b's beyond the seeds' spread, "<" below it, "tie" within it,
    UNJUDGED with fewer than MIN_SEEDS seeds on either side (no spread to judge by).

    Example: a = [0.60, 0.62, 0.61], b = [0.55, 0.56, 0.54] -> ">" (0.61 - 0.55 > 0.01 + 0.01).
    """
    (mean_a, sd_a, n_a), (mean_b, sd_b, n_b) = summarize(a), summarize(b)
    if min(n_a, n_b) < MIN_SEEDS:
        return UNJUDGED
    if abs(mean_a - mean_b) <= sd_a + sd_b:
        return "tie"
    return ">" if mean_a > mean_b else "<"


def group(results: Sequence[dict]) -> dict[tuple[str, float | None], list[dict]]:
    """{(experiment, budget): its runs}, budgets in the order given (None: from scratch)."""
    out: dict[tuple[str, float | None], list[dict]] = {}
    for record in results:
        out.setdefault((record["experiment"], record["budget"]), []).append(record)
    return out


def _accuracies(runs: list[dict], probe: str) -> list[float]:
    return [r["probes"][probe]["test_accuracy"] for r in runs if probe in r.get("probes", {})]


def _cell(values: Sequence[float], digits: int = 3) -> str:
    if not values:
        return ""
    mean, sd, n = summarize(values)
    return f"{mean:.{digits}f}" + (f" +- {sd:.{digits}f}" if n > 1 else "")


def _budget_text(budget: float | None, match: str) -> str:
    return "none (scratch)" if budget is None else f"{budget:.3g} {match}"


def table(results: Sequence[dict], probes: Sequence[str], match: str) -> list[str]:
    """The Markdown table: one row per (experiment, budget)."""
    head = ["experiment", "objective", "budget", "seeds", "params", "steps", "FLOPs spent",
            "held-out pretraining", *[f"{p} (test acc.)" for p in probes], "wall (s)"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (experiment, budget), runs in sorted(
        group(results).items(), key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1])
    ):
        spent = [r["flops"] for r in runs]
        if budget is None:
            flops_text = "0"
        else:
            worst = max(abs(f - budget) / budget for f in spent) if match == "flops" else None
            flops_text = f"{np.mean(spent):.3g}" + (
                f" (max off {100 * worst:.1f}%)" if worst is not None else ""
            )
        metric = runs[0].get("held_out_metric")
        held = [r["held_out"][metric] for r in runs if metric and metric in r.get("held_out", {})]
        held_text = f"{metric.removeprefix('eval/')} {_cell(held)}" if held else ""
        seconds = [r.get("pretrain_seconds", 0.0) + sum(
            p.get("seconds", 0.0) for p in r["probes"].values()) for r in runs]  # fmt: skip
        row = [experiment, runs[0]["recipe"], _budget_text(budget, match), str(len(runs)),
               f"{runs[0]['params']:,}", str(runs[0]["steps"]), flops_text, held_text,
               *[_cell(_accuracies(runs, p)) for p in probes],
               f"{np.mean(seconds):.0f}"]  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    return lines


def claims(results: Sequence[dict], probes: Sequence[str], match: str) -> list[str]:
    """Each headline claim at each budget and probe: reproduced, tie, not reproduced, or not
    judged yet while either side has fewer than two seeds."""
    grouped = group(results)
    experiments = {e for e, _ in grouped}
    budgets = sorted({b for _, b in grouped if b is not None})
    lines = []
    for claim, winners, losers in CLAIMS:
        a = next((e for e in winners if e in experiments), None)
        b = next((e for e in losers if e in experiments), None)
        if a is None or b is None:
            missing = " or ".join(winners if a is None else losers)
            lines.append(f"- {claim}: not judged (the study has no {missing})")
            continue
        for budget in budgets:
            for probe in probes:
                va = _accuracies(grouped.get((a, budget), []), probe)
                vb = _accuracies(grouped.get((b, budget), []), probe)
                if not va or not vb:
                    continue
                verdict = CLAIM_WORDS[compare(va, vb)]
                lines.append(
                    f"- {claim}, {_budget_text(budget, match)}, {probe}: **{verdict}** "
                    f"({a} {_cell(va)} vs {b} {_cell(vb)})"
                )
    return lines


def rankings(results: Sequence[dict], probes: Sequence[str], match: str) -> list[str]:
    """Per budget and probe: the leader, every objective tied with it, and those that cannot
    be judged against it yet (fewer than MIN_SEEDS seeds on either side)."""
    grouped = group(results)
    lines = []
    for budget in sorted({b for _, b in grouped if b is not None}):
        for probe in probes:
            scores = {
                e: _accuracies(runs, probe) for (e, b), runs in grouped.items() if b == budget
            }
            scores = {e: v for e, v in scores.items() if v}
            if not scores:
                continue
            leader = max(scores, key=lambda e: np.mean(scores[e]))
            verdicts = {e: compare(scores[leader], scores[e]) for e in scores if e != leader}
            tied = sorted(e for e, v in verdicts.items() if v == "tie")
            unjudged = sorted(e for e, v in verdicts.items() if v == UNJUDGED)
            if not verdicts:  # a study still running may have one objective at a budget
                rest = "the only objective at this budget so far"
            else:
                rest = f"tied with it: {', '.join(tied)}" if tied else "no tie"
                if unjudged:
                    rest += f"; not judged yet (one seed): {', '.join(unjudged)}"
            lines.append(
                f"- {_budget_text(budget, match)}, {probe}: best {leader} "
                f"({_cell(scores[leader])}); {rest}"
            )
    return lines


def versus_scratch(results: Sequence[dict], probes: Sequence[str], match: str) -> list[str]:
    """A Markdown table: per experiment, budget and probe, the mean accuracy gained over the
    same architecture fine-tuned from random initialisation, and whether that gain is beyond the
    seeds' spread (`compare`; "one seed" while either side has fewer than two). Empty when the
    study has no from-scratch runs."""
    grouped = group(results)
    budgets = sorted({b for _, b in grouped if b is not None})
    experiments = sorted({e for e, b in grouped if b is None})
    if not budgets or not experiments:
        return []
    head = ["experiment"] + [f"{_budget_text(b, match)}, {p}" for b in budgets for p in probes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for experiment in experiments:
        row = [experiment]
        for budget in budgets:
            for probe in probes:
                trained = _accuracies(grouped.get((experiment, budget), []), probe)
                scratch = _accuracies(grouped[(experiment, None)], probe)
                if not trained or not scratch:
                    row.append("")
                    continue
                gain = np.mean(trained) - np.mean(scratch)
                row.append(f"{gain:+.3f} ({VERDICT_WORDS[compare(trained, scratch)]})")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def sweep_edges(
    results: Sequence[dict], probes: Sequence[str], learning_rates: Sequence[float]
) -> list[str]:
    """Per probe, how many runs chose the smallest or the largest learning rate of the sweep: a
    choice on the grid's edge may have cut off a better rate beyond it (widen the grid)."""
    if len(learning_rates) < 2:
        return []
    low, high = min(learning_rates), max(learning_rates)
    lines = []
    for probe in probes:
        chosen = [
            r["probes"][probe]["selected_learning_rate"] for r in results if probe in r["probes"]
        ]
        if not chosen:
            continue
        at_low = sum(np.isclose(c, low) for c in chosen)
        at_high = sum(np.isclose(c, high) for c in chosen)
        warning = (
            "; the best rate may lie beyond the grid" if at_low + at_high > len(chosen) / 2 else ""
        )
        lines.append(
            f"- {probe}: the largest rate ({high:g}) chosen by {at_high} of {len(chosen)} runs, "
            f"the smallest ({low:g}) by {at_low}{warning}"
        )
    return lines


def write_csv(path: str, results: Sequence[dict], probes: Sequence[str]) -> None:
    """One row per run: what it spent and each probe's selected rate and accuracies."""
    fields = ["experiment", "recipe", "budget", "match", "seed", "params", "steps",
              "flops", "tokens", "held_out_metric", "held_out", "pretrain_seconds"]  # fmt: skip
    for probe in probes:
        fields += [f"{probe}/learning_rate", f"{probe}/dev_accuracy", f"{probe}/test_accuracy"]
    tmp = f"{path}.tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for r in results:
            metric = r.get("held_out_metric")
            row = {k: r.get(k, "") for k in fields}
            row["held_out"] = r.get("held_out", {}).get(metric, "") if metric else ""
            for probe in probes:
                p = r["probes"].get(probe, {})
                row[f"{probe}/learning_rate"] = p.get("selected_learning_rate", "")
                row[f"{probe}/dev_accuracy"] = p.get("dev_accuracy", "")
                row[f"{probe}/test_accuracy"] = p.get("test_accuracy", "")
            writer.writerow(row)
    os.replace(tmp, path)


def plot(path: str, results: Sequence[dict], probes: Sequence[str]) -> None:
    """Probe test accuracy (mean +- sd over seeds) against training FLOPs, a line per
    experiment and a panel per probe; each experiment's from-scratch accuracy is its line's
    hollow marker at the left edge, the majority class a dotted line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grouped = group(results)
    experiments = sorted({e for e, _ in grouped})
    trained = [b for _, b in grouped if b is not None]
    fig, axes = plt.subplots(1, len(probes), figsize=(6.5 * len(probes), 4.8), squeeze=False)
    colors = plt.get_cmap("tab20")(np.linspace(0, 1, max(len(experiments), 2)))
    left = min((r["flops"] for r in results if r["flops"] > 0), default=1.0) / 2
    for ax, probe in zip(axes[0], probes, strict=True):
        for color, experiment in zip(colors, experiments, strict=False):
            points = []
            for (e, budget), runs in grouped.items():
                values = _accuracies(runs, probe)
                if e != experiment or budget is None or not values:
                    continue
                mean, sd, _ = summarize(values)
                points.append((float(np.mean([r["flops"] for r in runs])), mean, sd))
            points.sort()
            if points:
                x, y, err = zip(*points, strict=True)
                ax.errorbar(x, y, yerr=err, marker="o", capsize=3, color=color, label=experiment)
            scratch = _accuracies(grouped.get((experiment, None), []), probe)
            if scratch:
                ax.plot([left], [np.mean(scratch)], marker="o", mfc="none", color=color)
        majority = [r["probes"][probe]["test_majority_class_share"] for r in results
                    if probe in r["probes"]]  # fmt: skip
        if majority:
            ax.axhline(majority[0], linestyle=":", color="grey", label="majority class")
        if trained:
            ax.set_xscale("log")
        ax.set_xlabel("training FLOPs (XLA's count of the step x steps; hollow: no pretraining)")
        ax.set_ylabel(f"{probe} test accuracy")
        ax.set_title(probe)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    tmp = f"{path}.tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def plot_objectives(path: str, results: Sequence[dict], probes: Sequence[str], match: str) -> None:
    """Every objective side by side: a panel per probe, a row per experiment (sorted by its mean
    accuracy at the largest budget), each budget's mean +- sd over seeds as a filled marker and
    the same architecture without pretraining as a hollow one, so that a reader sees at a glance
    which objectives beat their own baseline and which overlap each other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grouped = group(results)
    budgets = sorted({b for _, b in grouped if b is not None})
    experiments = sorted({e for e, _ in grouped})
    last = budgets[-1] if budgets else None

    def mean_at(experiment: str, budget: float | None, probe: str) -> float:
        values = _accuracies(grouped.get((experiment, budget), []), probe)
        return float(np.mean(values)) if values else -1.0

    height = 1.2 + 0.32 * len(experiments)
    fig, axes = plt.subplots(1, len(probes), figsize=(6.0 * len(probes), height), squeeze=False)
    colors = plt.get_cmap("viridis")(np.linspace(0.15, 0.85, max(len(budgets), 1)))
    offsets = np.linspace(-0.2, 0.2, len(budgets) + 1)
    for ax, probe in zip(axes[0], probes, strict=True):
        order = sorted(experiments, key=lambda e: mean_at(e, last, probe))
        for row, experiment in enumerate(order):
            scratch = _accuracies(grouped.get((experiment, None), []), probe)
            if scratch:
                mean, sd, _ = summarize(scratch)
                ax.errorbar([mean], [row + offsets[0]], xerr=[sd], marker="o", mfc="white",
                            color="grey", capsize=2,
                            label="no pretraining" if row == 0 else None)  # fmt: skip
            for offset, color, budget in zip(offsets[1:], colors, budgets, strict=True):
                values = _accuracies(grouped.get((experiment, budget), []), probe)
                if not values:
                    continue
                mean, sd, _ = summarize(values)
                ax.errorbar([mean], [row + offset], xerr=[sd], marker="o", color=color,
                            capsize=2,
                            label=_budget_text(budget, match) if row == 0 else None)  # fmt: skip
        ax.set_yticks(range(len(order)), order, fontsize=8)
        ax.set_ylim(-0.6, len(order) - 0.4)
        ax.set_xlabel(f"{probe} test accuracy (mean +- sd over seeds)")
        ax.set_title(probe)
        ax.grid(axis="x", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:  # below the panels, where it hides no marker
        fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.tight_layout(rect=(0, 0.5 / height, 1, 1))
    tmp = f"{path}.tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def write_report(
    out_dir: str, results: Sequence[dict], *, protocol: dict, command: Sequence[str] | None = None
) -> str:
    """Writes report.md, results.csv and the plot into `out_dir`; returns report.md's path.
    `command`: the command line that ran the study (its latest invocation, for a resumed one),
    shown at the top so that the report says how to produce it again."""
    probes = list(protocol["probes"])
    match = protocol["match"]
    write_csv(os.path.join(out_dir, CSV_FILE), results, probes)
    plot(os.path.join(out_dir, PLOT_FILE), results, probes)
    plot_objectives(os.path.join(out_dir, OBJECTIVES_PLOT_FILE), results, probes, match)
    scratch_lines = versus_scratch(results, probes, match)
    edges = sweep_edges(results, probes, protocol["learning_rates"])
    rates = ", ".join(f"{r:g}" for r in protocol["learning_rates"])
    lines = ["# lmsuite study", ""]
    if command:
        lines += [f"Produced by `{shlex.join(command)}`.", ""]
    lines += [
        f"Budgets matched in **{match}** (XLA's count of each experiment's own train step times "
        f"its steps). Probes: {', '.join(probes)}, fine-tuned for "
        f"{protocol['probe_epochs']} epoch(s) at batch {protocol['probe_batch_size']}, "
        f"{protocol['probe_max_length']} tokens, learning rate chosen from {rates} on a dev "
        "split of each probe's train split (the same rows for every run), accuracy reported "
        "on the probe's held-out split."
        + (
            f" At most {protocol['probe_max_train']} fine-tuning examples per probe."
            if protocol.get("probe_max_train")
            else ""
        ),
        "Bindings for every run: "
        + (", ".join(f"`{b}`" for b in protocol["bindings"]) or "none (the experiments' own)")
        + ".",
        "",
        "Differences within the seeds' spread (mean +- sd ranges that overlap) are ties; with "
        f"fewer than {MIN_SEEDS} seeds on either side a difference is not judged yet "
        f'("{UNJUDGED}").',
        "",
        *table(results, probes, match),
        "",
        "Wall is each run's pretraining and probing time over every process that worked on it "
        "(a stopped pretraining counts until its last metric), the mean over seeds.",
        "",
        *(["Learning rates chosen on the sweep's edges:", "", *edges, ""] if edges else []),
        "## The papers' headline directions",
        "",
        *(claims(results, probes, match) or ["- none of the compared pairs is in the study"]),
        "",
        "## Best objective per budget and probe",
        "",
        *rankings(results, probes, match),
        "",
        "## Pretraining against no pretraining",
        "",
        *(
            [
                "Each cell: the mean test accuracy gained over the same architecture fine-tuned "
                "from random initialisation, and whether it is beyond the seeds' spread.",
                "",
                *scratch_lines,
            ]
            if scratch_lines
            else ["- the study has no from-scratch runs (`--no_scratch`)"]
        ),
        "",
        f"![every objective side by side]({OBJECTIVES_PLOT_FILE})",
        "",
        f"![probe accuracy against training FLOPs]({PLOT_FILE})",
        "",
    ]
    path = os.path.join(out_dir, REPORT_FILE)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines))
    os.replace(tmp, path)
    return path
