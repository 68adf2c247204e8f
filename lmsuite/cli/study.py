"""`lmsuite study`: every pretraining objective at equal compute, on the same data and probes.

lmsuite study --experiments=bert_tiny,electra_tiny,... --flops=F[,4F] --seeds=3 --out=DIR
              [--match=flops|tokens] [--probes=trec_questions,vader_sentiment]
              [--probe_learning_rates=3e-4,1e-3,3e-3] [--gin.KEY=VALUE ...]

Each experiment (a gin file of lmsuite/gin/experiments) pretrains, per budget and seed, until
it has spent the budget: its steps are the budget over XLA's FLOP count of its own train step
(`training.step_cost`: ELECTRA's generator and XLNet's two streams are charged), or, with
`--match=tokens`, over the input tokens one step reads. The learning-rate warmup keeps the
experiment's own share of the run. Every run is then fine-tuned on the same probes with one
recipe (`evaluation.probe_sweep`: a learning-rate sweep chosen on a dev split, the held-out
split reported), and so is each experiment's architecture from random initialisation, the
baseline pretraining has to beat. Experiments that share an architecture and vocabulary
(t5_1_1/t5_iid/t5_prefix_lm, bart/mass) share that baseline: it depends on nothing else, so
the first one's is reused (`same_as` in the record) rather than trained again. `--gin.KEY=VALUE`
binds every run alike (e.g. one model size for all).

DIR keeps everything (`study_records`): study.json (the protocol; a resumed study must keep
it), and per run runs/EXPERIMENT/BUDGET/seedN/ with pretrain/ (the run directory: config.gin,
metrics.jsonl, checkpoints), pretrain_segments.json (when each process pretrained it: the run's
wall time), probes/ (each rate's metrics.json) and result.json, written last. A killed study
run again with the same flags skips every run that has its result.json, resumes a pretraining
from its newest checkpoint and a sweep from its next rate; adding experiments, budgets or seeds
extends it. The report (report.md, results.csv and two plots) is rewritten after
every run (`evaluation.study_report`).
"""

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from statistics import fmean

from lmsuite.cli import study_records as records
from lmsuite.cli.config import ConfigError, described

DEFAULT_EXPERIMENTS = (
    "bert_tiny,roberta_tiny,spanbert_tiny,albert_tiny,electra_tiny,xlnet_tiny,unilm_tiny,"
    "structbert_tiny,deberta_tiny,t5_1_1_tiny,t5_iid_tiny,t5_prefix_lm_tiny,bart_tiny,mass_tiny"
)
DEFAULT_PROBES = "trec_questions,vader_sentiment"
DEFAULT_RATES = "3e-4,1e-3,3e-3"  # tiny models fine-tune at larger rates than BERT's 2e-5
MATCHES = ("flops", "tokens")
MAX_BUDGET_ERROR = 0.05  # a run may spend its budget to within 5% (whole steps)


@dataclasses.dataclass(frozen=True)
class Protocol:
    """What makes two runs comparable: a resumed study must keep all of it (the grid of
    experiments, budgets and seeds may grow)."""

    match: str
    probes: tuple[str, ...]
    learning_rates: tuple[float, ...]
    probe_epochs: int
    probe_batch_size: int
    probe_max_length: int
    probe_max_train: int | None
    bindings: tuple[str, ...]


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "study",
        **described(
            "pretrain every objective at equal compute (or tokens), fine-tune each on the same "
            "probes, and report accuracy against FLOPs with ties stated"
        ),
    )
    parser.add_argument("--experiments", default=DEFAULT_EXPERIMENTS, help="comma-separated")
    parser.add_argument(
        "--flops",
        default=None,
        help="comma-separated training budgets in FLOPs, e.g. 2.5e12,1e13 (or --tokens)",
    )
    parser.add_argument("--tokens", default=None, help="budgets in input tokens (--match=tokens)")
    parser.add_argument("--match", choices=MATCHES, default=None, help="default: the budget given")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", dest="out_dir", required=True, help="the study directory")
    parser.add_argument("--probes", default=DEFAULT_PROBES)
    parser.add_argument("--probe_learning_rates", default=DEFAULT_RATES)
    parser.add_argument("--probe_epochs", type=int, default=3)
    parser.add_argument("--probe_batch_size", type=int, default=32)
    parser.add_argument("--probe_max_length", type=int, default=64)
    parser.add_argument(
        "--probe_max_train", type=int, default=None, help="fine-tune on at most N examples (toy)"
    )
    parser.add_argument("--no_scratch", action="store_true", help="no from-scratch baselines")
    parser.add_argument("--no_progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--export",
        default=None,
        metavar="DEST",
        help="copy the finished runs' records and the report of --out to DEST (no checkpoints, "
        "TensorBoard logs or training curves) and stop: DEST, run with the same flags, reads "
        "them back and trains only what is left",
    )
    parser.set_defaults(handler=run_study)


def _floats(flag: str, text: str, problems: list[str]) -> tuple[float, ...]:
    values = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            value = float(part)
        except ValueError:
            problems.append(f"--{flag}: {part!r} is not a number")
            continue
        if not (value > 0 and value != float("inf")):
            problems.append(f"--{flag}: {part!r} must be a finite number > 0")
        values.append(value)
    if not values and text is not None:
        problems.append(f"--{flag} names no value, got {text!r}")
    return tuple(values)


def parse_settings(args) -> tuple[Protocol, tuple[str, ...], tuple[float, ...], int]:
    """(protocol, experiments, budgets, seeds) of the flags, every problem listed at once.

    Raises:
      ConfigError: unknown experiments or probes, bad numbers, both or neither budget flag.
    """
    from lmsuite.cli.config import GIN_DIR
    from lmsuite.evaluation import finetune_data

    problems: list[str] = []
    if (args.flops is None) == (args.tokens is None):
        problems.append("give the budgets with exactly one of --flops and --tokens")
    budget_flag = "flops" if args.flops is not None else "tokens"
    match = args.match or budget_flag
    if args.match is not None and args.match != budget_flag:
        problems.append(f"--match={args.match} needs --{args.match}, got --{budget_flag}")
    budgets = _floats(budget_flag, getattr(args, budget_flag) or "", problems)
    experiments = tuple(filter(None, (e.strip() for e in args.experiments.split(","))))
    known = sorted(p.stem for p in (GIN_DIR / "experiments").glob("*.gin"))
    for name in experiments:
        if name not in known:
            problems.append(f"--experiments: unknown experiment {name!r}; expected one of {known}")
    if len(set(experiments)) != len(experiments):
        problems.append(f"--experiments names one twice: {list(experiments)}")
    probes = tuple(filter(None, (p.strip() for p in args.probes.split(","))))
    for name in probes:
        if name not in finetune_data.PROBES:
            problems.append(f"--probes: unknown probe {name!r}; expected {finetune_data.PROBES}")
    rates = _floats("probe_learning_rates", args.probe_learning_rates, problems)
    for flag in ("seeds", "probe_epochs", "probe_batch_size", "probe_max_length"):
        if getattr(args, flag) < 1:
            problems.append(f"--{flag} must be an integer >= 1, got {getattr(args, flag)}")
    if args.probe_max_train is not None and args.probe_max_train < 1:
        problems.append(f"--probe_max_train must be >= 1, got {args.probe_max_train}")
    if problems:
        raise ConfigError(problems)
    protocol = Protocol(
        match=match,
        probes=probes,
        learning_rates=rates,
        probe_epochs=args.probe_epochs,
        probe_batch_size=args.probe_batch_size,
        probe_max_length=args.probe_max_length,
        probe_max_train=args.probe_max_train,
        bindings=tuple(args.gin_bindings),
    )
    return protocol, experiments, budgets, args.seeds


def check_protocol(out_dir: str, protocol: Protocol, *, write: bool = True) -> None:
    """Checks that the study already in `out_dir` (if any) has `protocol`; with `write`, writes
    DIR/study.json for a new one.

    Raises:
      ConfigError: naming each setting that differs from the study in `out_dir`.
    """
    path = os.path.join(out_dir, records.STUDY_FILE)
    ours = json.loads(json.dumps(dataclasses.asdict(protocol)))  # tuples as JSON lists
    if os.path.exists(path):
        with open(path) as f:
            theirs = json.load(f)
        differ = [
            f"{key}: the study in {out_dir} has {theirs.get(key)!r}, the flags give {value!r}"
            for key, value in ours.items()
            if theirs.get(key) != value
        ]
        if differ:
            raise ConfigError(
                differ + ["resume with the same settings, or give another --out"]
            )  # fmt: skip
        return
    if write:
        os.makedirs(out_dir, exist_ok=True)
        records.write_json(path, ours)


def _experiment_run(experiment: str, model_dir: str, bindings: Sequence[str]):
    from lmsuite.cli.gin_run import run_from_gin

    return run_from_gin(f"experiments/{experiment}.gin", model_dir=model_dir, bindings=bindings)


def plan_steps(run, cost, *, budget: float, match: str) -> dict:
    """The steps (and warmup) that spend `budget` with this run's step `cost`.

    Raises:
      ConfigError: a continual schedule (stages at fixed steps), or a budget that whole steps
        cannot meet within MAX_BUDGET_ERROR (too small for this experiment's step).
    """
    if run.data.stages:
        raise ConfigError(
            ["a continual schedule (train.stages) starts its stages at fixed steps; the study "
             "cannot rescale it yet"]
        )  # fmt: skip
    per_step = cost.flops if match == "flops" else cost.tokens
    steps = max(1, round(budget / per_step))
    error = abs(steps * per_step - budget) / budget
    if error > MAX_BUDGET_ERROR:
        raise ConfigError(
            [f"a budget of {budget:.4g} {match} is {budget / per_step:.2f} steps of "
             f"{per_step:.4g} {match}: whole steps miss it by {100 * error:.1f}% (at most "
             f"{100 * MAX_BUDGET_ERROR:.0f}%); give a budget of at least "
             f"{per_step / MAX_BUDGET_ERROR / 2:.3g}"]
        )  # fmt: skip
    schedule = run.optimizer.learning_rate
    share = schedule.warmup_steps / run.trainer.train_steps if run.trainer.train_steps else 0
    return {
        "steps": steps,
        "warmup_steps": min(steps - 1, round(share * steps)) if steps > 1 else 0,
        "flops": steps * cost.flops,
        "tokens": steps * cost.tokens,
    }


def plan_study(experiments, budgets, protocol) -> dict:
    """{experiment: {"cost": StepCost, "plans": {budget: plan_steps(...)}}} for every run,
    before any trains; printed as a table.

    Raises:
      ConfigError: every experiment whose config or budgets do not work, at once.
    """
    from lmsuite.training.step_cost import step_cost

    problems, out = [], {}
    for experiment in experiments:
        try:
            run = _experiment_run(experiment, f"plan/{experiment}", protocol.bindings)
            if run.data.stages:  # refused by plan_steps; known before the step is lowered
                plan_steps(run, None, budget=budgets[0], match=protocol.match)
            cost = step_cost(run)
            plans = {b: plan_steps(run, cost, budget=b, match=protocol.match) for b in budgets}
        except ValueError as error:  # ConfigError too: each problem named with the experiment
            lines = getattr(error, "problems", None) or [str(error).strip().splitlines()[0]]
            problems += [f"{experiment}: {line.strip()}" for line in lines]
            continue
        out[experiment] = {"cost": cost, "plans": plans}
    if problems:
        raise ConfigError(problems)
    head = f"{'experiment':<20} {'params':>10} {'FLOPs/step':>11} {'tokens/step':>11}"
    print(head + "".join(f" {'steps@' + records.budget_label(b):>14}" for b in budgets))
    for experiment, planned in out.items():
        cost = planned["cost"]
        print(
            f"{experiment:<20} {cost.params:>10,} {cost.flops:>11.3g} {cost.tokens:>11,}"
            + "".join(f" {planned['plans'][b]['steps']:>14,}" for b in budgets)
        )
    return out


def pretrain(experiment: str, seed: int, run_dir: str, planned: dict, budget: float, protocol,
             progress: bool) -> dict:  # fmt: skip
    """Pretrains one run of the study (resuming its checkpoints) and returns its record."""
    import lmsuite
    from lmsuite.models import families
    from lmsuite.training import metrics

    model_dir = os.path.join(run_dir, "pretrain")
    cost, plan = planned["cost"], planned["plans"][budget]
    steps = plan["steps"]
    bindings = list(protocol.bindings) + [
        f"train.seed = {seed}",
        f"TRAIN_STEPS = {steps}",
        f"WARMUP_STEPS = {plan['warmup_steps']}",
        f"CHECKPOINT_EVERY = {max(1, steps // 4)}",  # a killed study loses at most a quarter
        f"train.eval_every = {steps}",  # the held-out metric at the end only
        f"train.progress_bar = {progress}",
    ]
    run = _experiment_run(experiment, model_dir, bindings)
    segments = records.begin_segment(run_dir, os.path.join(model_dir, "metrics.jsonl"))
    lmsuite.train(run)
    seconds = records.end_segment(run_dir, segments)
    history = metrics.read_jsonl(os.path.join(model_dir, "metrics.jsonl"))
    held_out = {}
    for record in history:  # the last evaluation (a finished run resumed evaluates no more)
        if any(k.startswith("eval/") for k in record):
            held_out = {k: v for k, v in record.items() if k.startswith("eval/")}
    built = run.built()
    return {
        "recipe": run.recipe.recipe.name,
        "architecture": families.family(run.model).name,
        "params": cost.params,
        "flops_per_step": cost.flops,
        "tokens_per_step": cost.tokens,
        **plan,
        "held_out": held_out,
        "held_out_metric": f"eval/{built.objective.learning_metrics[1]}",
        "pretrain_seconds": seconds,
    }


def run_one(
    experiment: str,
    budget: float | None,
    seed: int,
    out_dir: str,
    protocol,
    progress: bool,
    planned: dict,
    scratch_from: float | None = None,
) -> dict:
    """One run of the study (budget None: the from-scratch baseline, with the config of the
    `scratch_from` budget's run), its result.json written last; a run that has one is read
    back, not redone."""
    from lmsuite.evaluation import probe_sweep
    from lmsuite.evaluation.load import load_run

    run_dir = records.run_dir(out_dir, experiment, budget, seed)
    path = os.path.join(run_dir, records.RESULT_FILE)
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    record = {"experiment": experiment, "budget": budget, "match": protocol.match, "seed": seed}
    if budget is None:
        record.update(records.scratch_record(planned["cost"]))
        source = records.run_dir(out_dir, experiment, scratch_from, seed)
        with open(os.path.join(source, records.RESULT_FILE)) as f:  # (run before the baseline)
            first = json.load(f)
        record.update(recipe=first["recipe"], architecture=first["architecture"])
        # Its architecture and vocabulary only: no checkpoint is read, so a study whose
        # checkpoints were deleted (or never copied along with its records) still runs it.
        source = load_run(os.path.join(source, "pretrain"), weights=False)
        record["scratch_key"] = records.scratch_key(source)
        same = records.find_scratch(out_dir, seed, record["scratch_key"], besides=experiment)
        if same is not None:
            print(
                f"    the same architecture and vocabulary as {same['experiment']}: its "
                f"from-scratch baseline (seed {seed}) is this one's too",
                flush=True,
            )
            record.update(probes=same["probes"], same_as=same["experiment"])
            os.makedirs(run_dir, exist_ok=True)
            records.write_json(path, record)
            return record
    else:
        record.update(pretrain(experiment, seed, run_dir, planned, budget, protocol, progress))
        source = os.path.join(run_dir, "pretrain")
    probes = {}
    for probe in protocol.probes:
        probes[probe] = probe_sweep.sweep(
            source,
            probe,
            out_dir=os.path.join(run_dir, "probes"),
            learning_rates=protocol.learning_rates,
            seed=seed,
            epochs=protocol.probe_epochs,
            batch_size=protocol.probe_batch_size,
            max_length=protocol.probe_max_length,
            max_train=protocol.probe_max_train,
            from_scratch=budget is None,
        )
    record["probes"] = probes
    records.write_json(path, record)
    return record


def seconds_left(rest: Sequence[tuple], spent: dict[tuple, list[float]]) -> float | None:
    """The time the runs `rest` (experiment, budget, seed) will take, from the runs done so far
    (`spent`: (experiment, budget) -> seconds): each run as the same experiment and budget's
    mean, else its budget's, else all runs'. A 1e13 run takes several times a 2.5e12 one and a
    baseline a fraction of either, so one mean over all of them misleads. None before any run
    (or with nothing left)."""
    if not rest or not spent:
        return None
    by_budget: dict = {}
    for (_, budget), seconds in spent.items():
        by_budget.setdefault(budget, []).extend(seconds)
    overall = fmean(t for seconds in spent.values() for t in seconds)
    total = 0.0
    for experiment, budget, _ in rest:
        same = spent.get((experiment, budget)) or by_budget.get(budget)
        total += fmean(same) if same else overall
    return total


def run_study(args) -> list[dict]:
    from lmsuite.evaluation import study_report

    if args.export:
        runs = records.export_records(args.out_dir, args.export)
        print(f"exported the records of {runs} finished runs to {args.export}")
        return []
    protocol, experiments, budgets, seeds = parse_settings(args)
    check_protocol(args.out_dir, protocol, write=False)  # a mismatch is named at once
    planned = plan_study(experiments, budgets, protocol)
    check_protocol(args.out_dir, protocol)  # written once every run is planned
    # Seed by seed, so that a study stopped early has every objective at every budget.
    per_seed = list(budgets) + ([] if args.no_scratch else [None])
    grid = [(e, b, s) for s in range(seeds) for b in per_seed for e in experiments]
    results, spent = [], {}  # spent: (experiment, budget) -> seconds of the runs done here
    for i, (experiment, budget, seed) in enumerate(grid, 1):
        what = "from scratch" if budget is None else f"{budget:.4g} {protocol.match}"
        print(f"[{i}/{len(grid)}] {experiment}, {what}, seed {seed}", flush=True)
        started = time.perf_counter()
        record = run_one(
            experiment, budget, seed, args.out_dir, protocol, progress=not args.no_progress,
            planned=planned[experiment], scratch_from=budgets[0],
        )  # fmt: skip
        results.append(record)
        seconds = time.perf_counter() - started
        if seconds > 1:  # trained here, not read back
            spent.setdefault((experiment, budget), []).append(seconds)
        accuracies = ", ".join(
            f"{p} {r['test_accuracy']:.4f}" for p, r in record["probes"].items()
        )  # fmt: skip
        left = seconds_left(grid[i:], spent)
        eta = f"; about {left / 60:.0f} min left" if left else ""
        print(f"    {accuracies} ({seconds:.0f} s{eta})", flush=True)
        study_report.write_report(
            args.out_dir, results, protocol=dataclasses.asdict(protocol),
            command=args.command_line,
        )  # fmt: skip
    print(f"report: {os.path.join(args.out_dir, study_report.REPORT_FILE)}")
    return results
