"""The encoder `*_tiny` experiments side by side: held-out MLM cross-entropy against the unigram
baseline of the same targets, per-row label accuracies against their majority share, and one plot
of the training curves.

  python benchmarks/encoder_learning.py --runs_dir=/tmp/encoder_runs [--train] [--only=bert_tiny]

With `--train`, each experiment missing from `runs_dir` runs first (`lmsuite pretrain`, a few
minutes each on 2 cores); the printed lines of each run are kept in `runs_dir/NAME.log`, which is
what the table is read from. Writes `runs_dir/encoder_learning.png` and prints a markdown table
(docs/research/encoder_twins.md's and benchmarks/RESULTS.md's).
"""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

EXPERIMENTS = (
    "bert_tiny",
    "roberta_tiny",
    "spanbert_tiny",
    "albert_tiny",
    "ernie_zh_tiny",
    "deberta_tiny",
    "structbert_tiny",
    "electra_tiny",
    "unilm_tiny",
    "tupe_tiny",
    "unilm2_tiny",
)
_MLM = re.compile(r"held-out MLM cross-entropy: ([\d.]+) nats \(unigram .*: ([\d.]+)\)")
_ACC = re.compile(r"held-out MLM accuracy: ([\d.]+) \(always .*: ([\d.]+)\)")
# Per-row labels ("over N rows (always the most frequent label") and ELECTRA's RTD ("over N
# tokens (always the larger class").
_LABEL = re.compile(
    r"held-out ([a-z ]+) accuracy: ([\d.]+) over ([\d,]+) (?:rows|tokens) \(always the "
    r"(?:most frequent \w+|larger class): ([\d.]+); binomial p = ([\d.e+-]+)\)"
)


def train(name: str, runs_dir: Path) -> None:
    run = runs_dir / name
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    argv = [sys.executable, "-m", "lmsuite", "pretrain", f"--gin_file=experiments/{name}.gin"]
    argv += [f"--model_dir={run}", "--gin.train.progress_bar=False"]
    print(f"training {name} ...", flush=True)
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    (runs_dir / f"{name}.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"{name}: exit {done.returncode}; see {runs_dir / f'{name}.log'}")


def summary(name: str, runs_dir: Path) -> dict | None:
    log = runs_dir / f"{name}.log"
    if not log.exists():
        return None
    text = log.read_text()
    mlm, acc = _MLM.search(text), _ACC.search(text)
    if not mlm or not acc:
        return None
    labels = [
        dict(
            name=m[0],
            accuracy=float(m[1]),
            rows=int(m[2].replace(",", "")),
            majority=float(m[3]),
            p=float(m[4]),
        )  # fmt: skip
        for m in _LABEL.findall(text)
    ]
    records = [json.loads(line) for line in (runs_dir / name / "metrics.jsonl").open()]
    return dict(
        name=name,
        cross_entropy=float(mlm[1]),
        unigram=float(mlm[2]),
        accuracy=float(acc[1]),
        majority=float(acc[2]),
        labels=labels,
        steps=max(r["step"] for r in records),
        records=records,
    )


def table(rows: list[dict]) -> str:
    out = [
        "| experiment | steps | held-out MLM CE (unigram) | MLM accuracy (majority) | "
        "per-row labels: accuracy (majority, rows, binomial p) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        labels = "; ".join(
            f"{lab['name']} {lab['accuracy']:.3f} ({lab['majority']:.3f}, {lab['rows']}, "
            f"{lab['p']:.1e})"
            for lab in r["labels"]
        )
        out.append(
            f"| {r['name']} | {r['steps']:,} | {r['cross_entropy']:.3f} ({r['unigram']:.3f}) | "
            f"{r['accuracy']:.3f} ({r['majority']:.3f}) | {labels or '-'} |"
        )
    return "\n".join(out)


def plot(rows: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mlm_ax, label_ax) = plt.subplots(1, 2, figsize=(13, 4.5))
    for r in rows:
        train_points = [(x["step"], x["mlm_loss"]) for x in r["records"] if "mlm_loss" in x]
        eval_points = [
            (x["step"], x["eval/mlm_loss"]) for x in r["records"] if "eval/mlm_loss" in x
        ]
        if train_points:
            (line,) = mlm_ax.plot(*zip(*train_points, strict=True), lw=1, label=r["name"])
            if eval_points:
                mlm_ax.plot(*zip(*eval_points, strict=True), "o", color=line.get_color())
        for key in sorted({k for x in r["records"] for k in x if k.startswith("eval/")}):
            if key.endswith("_accuracy") and not key.startswith("eval/mlm"):
                points = [(x["step"], x[key]) for x in r["records"] if key in x]
                label_ax.plot(*zip(*points, strict=True), "o-", label=f"{r['name']} {key[5:]}")
    mlm_ax.set(xlabel="step", ylabel="MLM cross-entropy (nats)", title="train (lines), "
               "held-out (dots)")  # fmt: skip
    mlm_ax.legend(fontsize=8)
    label_ax.set(xlabel="step", ylabel="held-out accuracy", title="per-row and token labels")
    if label_ax.lines:
        label_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs_dir", type=Path, required=True)
    parser.add_argument("--train", action="store_true", help="run the missing experiments")
    parser.add_argument("--only", action="append", help="experiments to include (default: all)")
    args = parser.parse_args()
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    names = args.only or EXPERIMENTS
    unknown = sorted(set(names) - set(EXPERIMENTS))
    if unknown:
        raise SystemExit(f"unknown experiments {unknown}; expected some of {list(EXPERIMENTS)}")
    rows = []
    for name in names:
        if summary(name, args.runs_dir) is None and args.train:
            train(name, args.runs_dir)
        if (row := summary(name, args.runs_dir)) is None:
            print(f"{name}: no finished run in {args.runs_dir} (pass --train)", file=sys.stderr)
            continue
        rows.append(row)
    if not rows:
        raise SystemExit("nothing to report")
    png = args.runs_dir / "encoder_learning.png"
    plot(rows, png)
    print(table(rows))
    print(f"\nplot: {png}")


if __name__ == "__main__":
    main()
