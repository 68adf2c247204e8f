"""`lmsuite eval --model_dir=D [--task=T] [--split=validation] [--step=N] [--batch_size=B]
[--max_batches=K] [--sequence_length=input_ids:64,masked_ids:10]`: held-out metrics of a
checkpoint (`lmsuite.evaluation.evaluate`), printed and written under D/eval/. A run's mixture
or one of its tasks; each classification head's accuracy is printed against always its most
frequent held-out label, with the binomial p. The loss is the run's own: its packing, loss
options and task weights come from run.json (printed when there are any).

A run without a committed checkpoint, a step that is not committed, an unknown task or split are
configuration errors (exit code 2), each message naming what exists.
"""

import json

from lmsuite.cli.config import ConfigError, described


def _lengths(text: str) -> dict[str, int]:
    """ "inputs:64,targets:16" -> {"inputs": 64, "targets": 16} (a JSON object works too)."""
    try:
        if text.lstrip().startswith("{"):
            return {k: int(v) for k, v in json.loads(text).items()}
        pairs = [item.split(":") for item in text.split(",") if item]
        return {key.strip(): int(value) for key, value in pairs}
    except ValueError as error:
        raise ConfigError(
            [f"--sequence_length={text!r}: expected KEY:LENGTH,... or a JSON object"]
        ) from error


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "eval", **described("held-out loss, accuracy and perplexity of a run's checkpoint")
    )
    parser.add_argument("--model_dir", required=True, help="an `lmsuite train` run directory")
    parser.add_argument("--task", default=None, help="a registered task (default: the run's)")
    parser.add_argument("--split", default="validation")
    parser.add_argument("--step", type=int, default=None, help="default: the newest committed")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--max_batches", type=int, default=None, help="default: the whole split")
    parser.add_argument(
        "--sequence_length", type=str, default=None, help="default: the run's (run.json)"
    )
    parser.add_argument(
        "--task_module",
        action="append",
        default=[],
        help="a Python module to import first, registering your own SeqIO tasks (repeatable)",
    )
    parser.set_defaults(handler=run_eval)


def run_eval(args):
    from lmsuite.cli.config import import_task_modules
    from lmsuite.evaluation import evaluate
    from lmsuite.training import report

    problems = import_task_modules(args.task_module)
    for flag, least in (("step", 0), ("batch_size", 1), ("max_batches", 1)):
        value = getattr(args, flag)
        if value is not None and value < least:
            problems.append(f"--{flag} must be an integer >= {least}, got {value}")
    if problems:
        raise ConfigError(problems)
    request = dict(
        model_dir=args.model_dir,
        task=args.task,
        split=args.split,
        step=args.step,
        batch_size=args.batch_size,
        max_batches=args.max_batches,
        sequence_length=None if args.sequence_length is None else _lengths(args.sequence_length),
    )
    try:
        resolved = evaluate.resolve(**request)  # the request's errors; later ones are bugs
    except ValueError as error:
        raise ConfigError([str(error)]) from error
    result = evaluate.evaluate_request(resolved)
    print(f"lmsuite eval: {result.task} {result.split} at step {result.step} "
          f"({result.num_examples} examples, {result.path})")  # fmt: skip
    options = result.recipe_options
    if options.get("loss_options") or options.get("task_weights"):
        print(f"  the run's loss options: {options.get('loss_options', {})}, "
              f"task weights: {options.get('task_weights', {})}")  # fmt: skip
    for note in result.notes:
        print(f"  note: {note}")
    for key, value in result.metrics.items():
        print(f"  {key}: {value:.6g}")
    for label, count in result.labels.items():
        accuracy = result.metrics.get(f"eval/{count.metric}")
        if accuracy is not None and 0.0 < count.majority < 1.0:
            unit = "tokens" if count.per_token else "rows"
            line = report.label_line(
                count.metric, label, accuracy, rows=count.labelled, majority=count.majority,
                unit=unit,
            )  # fmt: skip
            print(f"  {line}")
    print(f"  json:         {result.json_path}")
    print(f"  tensorboard:  tensorboard --logdir {result.tensorboard_dir}")
    return result
