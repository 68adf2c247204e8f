"""The `lmsuite` command line: the only package that imports gin and argparse (gin parsing and
the configuration checks are in `config.py`; the commands here).

  lmsuite train --gin_file=F [--gin_file=G] --gin.KEY=VALUE --model_dir=DIR
                [--gin_search_paths=...] [--task_module=M ...] [--tfds_data_dir=D] [--distributed]
  lmsuite pretrain [--gin_file=experiments/E.gin] [--gin.KEY=VALUE ...] [--model_dir=DIR]
  lmsuite train|pretrain ... --train_files=GLOB [--validation_files=GLOB] [--vocab=MODEL]
  lmsuite vocab train --corpus=NAME | --text_files=GLOB --size=N [--out_dir=D]
  lmsuite compile --gin_file=F --topology=v4-32 [--mesh=data,fsdp,tensor | auto] [--json]
  lmsuite eval --model_dir=DIR [--task=T] [--split=S] [--step=N] [--max_batches=K]
  lmsuite recipes list | show NAME
  lmsuite tasks list | show NAME [--task_module=M]

Flags are spelled as in T5X. Before anything compiles, the configuration is checked and every
problem is listed at once, each with the nearest valid name: unknown configurables and parameters
(typos), `%gin.REQUIRED` macros left unset, task modules that do not import, an unknown task, a
task whose data is not prepared, a task that does not fit the recipe (features, sequence-length
keys, span lengths), a model that does not (architecture, heads, a vocabulary smaller than the
task's), a batch the data axis does not divide, a sequence longer than the position table.
Any malformed input (a flag, a gin value, a path) is refused before anything is written or
compiled: one line on stderr naming the value and what was expected (several problems: a list),
no traceback. TensorFlow's and the data libraries' start-up logs are silenced (`quiet.py`);
`--verbose` keeps them. Exit codes: 2 configuration error or bad flag, 3 NaN/Inf loss, 143
preempted (SIGTERM, checkpoint saved).
"""

import argparse
import os
import sys
from pathlib import Path

from lmsuite.cli import pretrain_report, quiet, text_task
from lmsuite.cli.config import (  # noqa: F401  (GIN_DIR, register_configurables: public API)
    CONFIG_ERROR_EXIT_CODE,
    GIN_DIR,
    ConfigError,
    _nearest,
    described,
    import_task_modules,
    load_config,
    load_run,
    model_config_from_gin,
    register_configurables,
    static_problems,
)


def run_info(args) -> dict:
    """`lmsuite info`: parameter counts, shapes and logical axes of the configured model."""
    from lmsuite.models import summary

    bindings = [b for b in args.gin_bindings]
    search_paths = [Path(p) for p in args.gin_search_paths] + [GIN_DIR]
    register_configurables()
    problems = static_problems(args.gin_file, bindings, search_paths)
    if problems:  # (a model file alone leaves the run's macros unset: only the files' problems)
        problems = [p for p in problems if "%gin.REQUIRED" not in p and "never" not in p]
    if problems:
        raise ConfigError(problems)
    try:
        config = model_config_from_gin(args.gin_file, bindings, search_paths=args.gin_search_paths)
    except ValueError as error:  # ModelConfig's own checks (gin adds where, on later lines)
        raise ConfigError([str(error).strip().splitlines()[0]]) from error
    result = summary.summarize(config)
    if args.json:
        print(summary.summary_json(result))
    else:
        print(summary.format_summary(result, title=", ".join(args.gin_file)))
    return result


def run_vocab(args) -> str:
    """`lmsuite vocab train`: a deterministic SentencePiece model for an embedded corpus or the
    user's files (`text_task.run_vocab`)."""
    return text_task.run_vocab(args)


def run_tasks(args) -> None:
    """`lmsuite tasks list` / `lmsuite tasks show NAME --n 3` (after `--task_module` imports)."""
    problems = import_task_modules(args.task_module)
    if problems:
        raise ConfigError(problems)
    from lmsuite.data import inspect as task_inspect

    if args.action == "list":
        print("\n".join(task_inspect.list_tasks()))
        return
    if not args.name:
        raise ConfigError(["`lmsuite tasks show` needs a task name; see `lmsuite tasks list`"])
    if args.n < 1:  # (show_task's n=-1 would slice off one example of the whole split)
        raise ConfigError([f"--n must be an integer >= 1, got {args.n}"])
    known = task_inspect.list_tasks()
    if args.name not in known:
        raise ConfigError([f"unknown task {args.name!r}{_nearest(args.name, known)}"])
    import seqio

    splits = list(seqio.get_mixture_or_task(args.name).splits)
    if args.split not in splits:
        raise ConfigError([f"task {args.name!r} has no split {args.split!r}; it has {splits}"])
    print(task_inspect.show_task(args.name, n=args.n, split=args.split, seed=args.seed))


def run_recipes(args) -> None:
    """`lmsuite recipes list` / `lmsuite recipes show NAME`."""
    from lmsuite.training import recipe_table

    if args.action == "list":
        print(recipe_table.format_list())
        return
    if not args.name:
        raise ConfigError(
            ["`lmsuite recipes show` needs a recipe name; see `lmsuite recipes list`"]
        )
    from lmsuite.training import recipes

    if args.name not in recipes.RECIPES:
        raise ConfigError([f"unknown recipe {args.name!r}{_nearest(args.name, recipes.RECIPES)}"])
    print(recipe_table.format_recipe(recipes.RECIPES[args.name]))


# ---------------------------------------------------------------------------- commands
def _add_gin_flags(
    parser: argparse.ArgumentParser, *, default_files=(), model_dir_required: bool = True
) -> None:
    parser.add_argument(
        "--gin_file",
        action="append",
        default=None,
        help="gin file (repeatable; searched in --gin_search_paths and gin/)",
    )
    parser.add_argument(
        "--gin_search_paths",
        type=lambda s: s.split(","),
        default=[],
        help="comma-separated directories to search for gin files",
    )
    parser.add_argument(
        "--model_dir",
        required=model_dir_required,
        default=None,
        help="checkpoints, config.gin, metrics.jsonl and TensorBoard logs",
    )
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="call jax.distributed.initialize() first (multi-host: every host runs the command; "
        "on TPU VMs it finds its peers itself)",
    )
    parser.add_argument(
        "--coordinator_address",
        default=None,
        help="with --distributed off a TPU VM: host:port of process 0 (e.g. localhost:1234)",
    )
    parser.add_argument("--num_processes", type=int, default=None, help="with --distributed")
    parser.add_argument("--process_id", type=int, default=None, help="with --distributed")
    _add_task_module_flag(parser)
    parser.add_argument(
        "--tfds_data_dir",
        default=None,
        help="where TFDS datasets are prepared (local or gs://; default $TFDS_DATA_DIR or "
        "~/tensorflow_datasets), for the wikipedia_* and c4_* tasks",
    )
    parser.set_defaults(default_gin_files=list(default_files))


def _add_task_module_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--task_module",
        action="append",
        default=[],
        help="a Python module to import before tasks are looked up, registering your own SeqIO "
        "tasks (repeatable; a gin `import my_pkg.tasks` line does the same)",
    )


GIN_EPILOG = """\
gin bindings:
  --gin.KEY=VALUE       bind a gin parameter or macro, as in T5X (repeatable), e.g.
                        --gin.TRAIN_STEPS=100  --gin.ModelConfig.d_model=128
                        --gin.RECIPE="'t5_span_corruption'"  (strings keep their quotes)
recipes: `lmsuite recipes list`; tasks: `lmsuite tasks list`.
"""


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line on stderr, exit status 2, like `ConfigError`'s
    (argparse's own prints the whole usage first). Subcommand parsers are of this class too."""

    def error(self, message: str):
        self.exit(
            CONFIG_ERROR_EXIT_CODE, f"{self.prog}: error: {message} (see {self.prog} --help)\n"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="lmsuite",
        description="Pretrain, evaluate, fine-tune and compare BERT-family language models "
        "(JAX/Flax). `lmsuite COMMAND --help` shows a command's flags.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    formatter = argparse.RawDescriptionHelpFormatter
    train = commands.add_parser(
        "train",
        **described("train from gin files (T5X flags)"),
        epilog=GIN_EPILOG,
        formatter_class=formatter,
    )
    _add_gin_flags(train)
    text_task.add_train_flags(train)
    train.set_defaults(handler=run_train)
    pretrain = commands.add_parser(
        "pretrain",
        **described(
            "pretrain on CPU: experiments/default.gin (a small BERT) or another experiment"
        ),
        epilog=GIN_EPILOG,
        formatter_class=formatter,
    )
    _add_gin_flags(pretrain, default_files=["experiments/default.gin"], model_dir_required=False)
    text_task.add_train_flags(pretrain)
    pretrain.set_defaults(handler=run_pretrain)
    info = commands.add_parser(
        "info", **described("parameter counts (total, embedding, per module), shapes, logical axes")
    )
    info.add_argument("--gin_file", action="append", required=True, help="model gin file(s)")
    info.add_argument("--gin_search_paths", type=lambda s: s.split(","), default=[])
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    info.set_defaults(handler=run_info)

    vocab = commands.add_parser("vocab", **described("train a SentencePiece vocabulary"))
    vocab.add_argument("action", choices=["train"])
    vocab.add_argument("--corpus", default=None, help="an embedded corpus, e.g. wiki_sample")
    text_task.add_vocab_flags(vocab)
    vocab.add_argument("--size", type=int, required=True, help="pieces, specials included")
    vocab.add_argument("--out_dir", default=None, help="default: the lmsuite cache")
    vocab.add_argument("--seed", type=int, default=0)
    vocab.set_defaults(handler=run_vocab)

    tasks = commands.add_parser(
        "tasks", **described("list registered tasks or show decoded examples")
    )
    tasks.add_argument("action", choices=["list", "show"])
    tasks.add_argument("name", nargs="?", default=None)
    tasks.add_argument("--n", type=int, default=3, help="examples to show")
    tasks.add_argument("--split", default="validation")
    tasks.add_argument("--seed", type=int, default=0)
    _add_task_module_flag(tasks)
    tasks.set_defaults(handler=run_tasks)

    recipe_parser = commands.add_parser(
        "recipes",
        **described("list the recipes (task objective, converter, loss, model) or show one"),
    )
    recipe_parser.add_argument("action", choices=["list", "show"])
    recipe_parser.add_argument("name", nargs="?", default=None)
    recipe_parser.set_defaults(handler=run_recipes)
    from lmsuite.cli import compile as compile_command

    compile_command.add_parser(commands, _add_gin_flags)
    from lmsuite.cli import finetune as finetune_command

    finetune_command.add_parser(commands)
    from lmsuite.cli import eval as eval_command

    eval_command.add_parser(commands)
    from lmsuite.cli import study as study_command

    study_command.add_parser(commands)
    verbose_help = "also print TensorFlow's, absl's and XLA's start-up logs (lmsuite/cli/quiet.py)"
    parser.add_argument("--verbose", action="store_true", help=verbose_help)
    for command in commands.choices.values():  # `lmsuite train ... --verbose` too
        command.add_argument(
            "--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose_help
        )
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """argparse plus T5X's dynamic `--gin.KEY=VALUE` flags."""
    argv = list(sys.argv[1:] if argv is None else argv)
    bindings = [a[len("--gin.") :] for a in argv if a.startswith("--gin.")]
    args = build_parser().parse_args([a for a in argv if not a.startswith("--gin.")])
    args.gin_bindings = [b.replace("=", " = ", 1) for b in bindings]
    if hasattr(args, "default_gin_files") and args.gin_file is None:
        args.gin_file = args.default_gin_files
    if args.command == "pretrain" and args.model_dir is None:  # runs/<experiment>
        args.model_dir = f"runs/{Path(args.gin_file[0]).stem}"
    return args


def run_train(args):
    run, result = _train(args)
    print(pretrain_report.summary_text(run, result))
    return result


def initialize_distributed(args) -> None:
    """jax.distributed.initialize(): on TPU VMs from the environment; elsewhere from the
    coordinator flags, with gloo for the CPU's cross-process collectives."""
    import jax

    explicit = (args.coordinator_address, args.num_processes, args.process_id)
    if any(v is not None for v in explicit) and any(v is None for v in explicit):
        raise ConfigError(
            ["--coordinator_address, --num_processes and --process_id go together; got "
             f"{args.coordinator_address!r}, {args.num_processes!r}, {args.process_id!r}"]
        )  # fmt: skip
    if args.num_processes is not None and not 0 <= args.process_id < args.num_processes:
        raise ConfigError([f"--process_id={args.process_id} must be in [0, {args.num_processes})"])
    if os.environ.get("JAX_PLATFORMS") == "cpu":  # backends start at initialize(): no probing
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if args.coordinator_address is None:
        jax.distributed.initialize()
    else:
        jax.distributed.initialize(
            coordinator_address=args.coordinator_address,
            num_processes=args.num_processes,
            process_id=args.process_id,
        )


RUN_FILE = "run.json"  # = lmsuite.evaluation.run_config.RUN_FILE (evaluation cannot import cli)


def _train(args):
    """(the run's `TrainConfig`, its `RunResult`): `lmsuite.train` of the gin config."""
    import lmsuite
    from lmsuite.training.train_config import InvalidRunError

    if args.distributed:
        initialize_distributed(args)

    text_task.prepare_run(args)  # --train_files: the recipe's task over them becomes TASK
    run = load_run(args)  # checked once, here, listed with gin's problems
    try:
        return run, lmsuite.train(run)  # writes run.json and config.gin, then trains
    except InvalidRunError as error:  # a --model_dir holding another run (nothing was written)
        raise ConfigError(error.problems) from error


UNIGRAM_BATCHES = 1000  # train batches the unigram baseline counts at most


def run_pretrain(args):
    from lmsuite.training import metrics, report

    run, result = _train(args)
    print(pretrain_report.summary_text(run, result))
    built = run.built()
    # The batches the run's evaluation read, kept after the first read: the baselines and each
    # label line read them all (ernie2_tiny's 40 batches took about 14 s per read).
    held_out = run.data.eval_dataset(built).cache()
    targets, weights = built.objective.prediction_features
    baselines = report.baselines(
        held_out.as_numpy_iterator(),
        # The whole train split of the embedded corpora; a prefix of a production corpus's.
        # (a staged run's too: its stages sample this split; one pass reads it in order)
        train_batches=run.data.replace(stages=())
        .train_dataset(built, seed=run.trainer.seed, shuffle=False, repeat=False)
        .take(UNIGRAM_BATCHES)
        .as_numpy_iterator(),
        targets=targets,
        weights=weights,
        vocab_size=run.model.vocab_size,
    )
    from lmsuite.training.checkpointing import absolute

    model_dir = absolute(args.model_dir)
    png = model_dir / "loss_curve.png"
    report.plot_loss_curve(
        metrics.read_jsonl(model_dir / "metrics.jsonl"), png, baseline=baselines.majority
    )
    print(f"  loss curve:   {png}")
    if run.data.stages:
        trained = pretrain_report.trained_before_stages(run, built)
        print(pretrain_report.stage_text(model_dir, trained))
    held = result.eval_metrics
    accuracy_key, entropy_key = (f"eval/{k}" for k in built.objective.learning_metrics)
    what = built.objective.prediction_name
    if accuracy_key in held and baselines.majority is not None:
        print(
            f"held-out {what} accuracy: {held[accuracy_key]:.4f} (always the most frequent "
            f"target: {baselines.majority:.4f})"
        )
    if entropy_key in held and baselines.unigram_cross_entropy is not None:
        print(
            f"held-out {what} cross-entropy: {held[entropy_key]:.4f} nats (unigram of "
            f"{baselines.train_targets:,} train-split targets: "
            f"{baselines.unigram_cross_entropy:.4f})"
        )
    for line in pretrain_report.label_lines(built.objective, held, held_out):
        print(line)
    fill_mask_lines = []
    if result.checkpoints:
        trained = {"model_config": run.model, "task": run.data.task}
        fill_mask_lines = pretrain_report.fill_mask_text(trained, str(model_dir))
    if fill_mask_lines:
        print("\n".join(fill_mask_lines))
    return result


# Flags naming a local or gs:// path: `~` and relative paths are resolved once, here, so every
# command and what it records (run.json, messages) sees absolute paths. Directories that must
# not be regular files are checked too.
_DIRECTORY_FLAGS = ("model_dir", "hf_dir", "out_dir", "output_dir", "tfds_data_dir")
_FILE_FLAGS = ("train_file", "validation_file")


def resolve_paths(args: argparse.Namespace) -> None:
    """Makes the path flags of `args` absolute (`~` expanded; gs:// paths kept).

    Raises:
      ConfigError: a directory flag that names an existing regular file.
    """
    from lmsuite.training import checkpointing

    problems = []
    for flag in _DIRECTORY_FLAGS + _FILE_FLAGS:
        if getattr(args, flag, None) == "":  # `--model_dir=`: not the working directory
            what = "directory" if flag in _DIRECTORY_FLAGS else "file"
            problems.append(f"--{flag} must name a {what}, got ''")
    for flag in _DIRECTORY_FLAGS:
        value = getattr(args, flag, None)
        if value and flag != "model_dir":  # (a run directory: run_directory says what it holds)
            resolved = str(checkpointing.absolute(value))
            if "://" not in resolved and os.path.isfile(resolved):
                problems.append(f"--{flag} {value!r} is a file ({resolved}); expected a directory")
            setattr(args, flag, resolved)
        elif value:
            try:
                setattr(args, flag, checkpointing.run_directory(value, flag=f"--{flag}"))
            except ValueError as error:
                problems.append(str(error))
    for flag in _FILE_FLAGS:
        value = getattr(args, flag, None)
        if value:
            setattr(args, flag, str(checkpointing.absolute(value)))
    if getattr(args, "gin_search_paths", None):
        args.gin_search_paths = [str(checkpointing.absolute(p)) for p in args.gin_search_paths]
        problems += [
            f"--gin_search_paths: {p!r} is not a directory"
            for p in args.gin_search_paths
            if "://" not in p and not os.path.isdir(p)
        ]
    if getattr(args, "gin_file", None):
        args.gin_file = [os.path.expanduser(f) for f in args.gin_file]
    if problems:
        raise ConfigError(problems)


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the process's own command line: it may be relaunched
        from lmsuite.training import host_malloc

        host_malloc.relaunch_with_settings()
    args = parse_args(argv)
    # As typed, for what a command writes about itself (the study's report names it).
    args.command_line = ["lmsuite", *(sys.argv[1:] if argv is None else argv)]
    quiet.quiet_start(verbose=args.verbose)  # before anything imports TensorFlow
    from lmsuite.training import loop

    try:
        resolve_paths(args)
        args.handler(args)
    except ConfigError as error:
        print(error.report(), file=sys.stderr)
        return CONFIG_ERROR_EXIT_CODE
    except loop.NonFiniteLossError as error:
        print(f"lmsuite: {error}", file=sys.stderr)
        return loop.DIVERGED_EXIT_CODE
    except loop.Preempted as error:
        print(f"lmsuite: {error}", file=sys.stderr)
        return loop.PREEMPTED_EXIT_CODE
    except loop.LeaseHeldError as error:  # refused before anything was written
        print(f"lmsuite: {error}", file=sys.stderr)
        return CONFIG_ERROR_EXIT_CODE
    except loop.CheckpointWriteError as error:
        print(f"lmsuite: {error}", file=sys.stderr, flush=True)
        if argv is None:
            # The failed save's pending TensorStore writes end while the interpreter shuts
            # down and print a traceback each into the closed event loop (when they end
            # earlier, `quiet` drops them); this line has said what happened.
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        return 1
    return 0
