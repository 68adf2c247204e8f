"""The `lmsuite` command line: the only module that imports gin and argparse.

  lmsuite train --gin_file=F [--gin_file=G] --gin.KEY=VALUE --model_dir=DIR
                [--gin_search_paths=...] [--distributed]
  lmsuite pretrain [--gin.KEY=VALUE ...] [--model_dir=DIR]    (`make pretrain`)

Flags are spelled as in T5X. Before anything compiles, the configuration is checked and every
problem is listed at once, each with the nearest valid name: unknown configurables and parameters
(typos), `%gin.REQUIRED` macros left unset, an unknown task, a batch the data axis does not
divide, a sequence longer than the position table. Exit codes: 2 configuration error, 3 NaN/Inf
loss, 143 preempted (SIGTERM, checkpoint saved).
"""

import argparse
import difflib
import inspect
import logging
import os
import sys
from pathlib import Path

import gin.config_parser as gin_parser

import gin

# TensorFlow (behind SeqIO) logs start-up chatter at INFO; a command line wants warnings only.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

GIN_DIR = Path(__file__).resolve().parent.parent / "gin"


class _QuietSearchMisses(logging.Filter):
    """gin logs an ERROR for every search path an include misses before one hits; drop those."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Path not found:")


logging.getLogger().addFilter(_QuietSearchMisses())
CONFIG_ERROR_EXIT_CODE = 2


class ConfigError(ValueError):
    """Every problem found in a configuration, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(f"  - {p}" for p in problems))


# ------------------------------------------------------------------------- registration
def _collect_train_args(**kwargs):
    """Gin's `train`: returns its bound arguments so they can be checked before training."""
    return kwargs


def register_configurables() -> None:
    """Makes the library functions configurable under stable gin names (idempotent)."""
    import seqio

    from lmsuite.data.feature_converters import EncoderMlmFeatureConverter
    from lmsuite.models import ModelConfig
    from lmsuite.objectives import make_objective
    from lmsuite.training import optimizers, schedules

    entries = [
        (ModelConfig, "ModelConfig", "lmsuite.models"),
        (_collect_train_args, "train", "lmsuite.training"),
        (optimizers.make_optimizer, "make_optimizer", "lmsuite.training"),
        (schedules.make_schedule, "make_schedule", "lmsuite.training"),
        (make_objective, "make_objective", "lmsuite.objectives"),
        (EncoderMlmFeatureConverter, "EncoderMlmFeatureConverter", "lmsuite.data"),
        (seqio.LMFeatureConverter, "LMFeatureConverter", "seqio"),
        (seqio.PrefixLMFeatureConverter, "PrefixLMFeatureConverter", "seqio"),
        (seqio.EncDecFeatureConverter, "EncDecFeatureConverter", "seqio"),
    ]
    for fn, name, module in entries:
        if gin.config._REGISTRY.get_match(f"{module}.{name}") is None:
            gin.external_configurable(fn, name=name, module=module)


def _signature_params(selector: str) -> list[str] | None:
    """Parameter names of a configurable; None if it takes **kwargs we cannot check."""
    from lmsuite.training import loop

    configurable = gin.config._REGISTRY.get_match(selector)
    fn = loop.train if configurable.name == "train" else configurable.wrapped
    if inspect.isclass(fn):
        fn = fn.__init__
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()) and fn is not loop.train:
        return None
    return [n for n in params if n not in ("self", "model_dir")]


# ------------------------------------------------------------------------------- checks
class _Delegate(gin_parser.ParserDelegate):
    def configurable_reference(self, name, evaluate):
        return ("@", name)

    def macro(self, name):
        return ("%", name)


def _references(value):
    if isinstance(value, tuple) and len(value) == 2 and value[0] in ("@", "%"):
        yield value
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _references(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _references(v)


def _nearest(name: str, options) -> str:
    close = difflib.get_close_matches(name, sorted(set(options)), n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


def _find_file(name: str, search_paths: list[Path]) -> Path | None:
    for base in [Path("."), *search_paths]:
        if (base / name).is_file():
            return base / name
    return None


def static_problems(
    gin_files: list[str], bindings: list[str], search_paths: list[Path]
) -> list[str]:
    """Unknown files, configurables, parameters and unset `%gin.REQUIRED` macros, all at once."""
    problems: list[str] = []
    macros: dict[str, tuple[bool, str]] = {}  # name -> (is_required, where)
    used_macros: dict[str, str] = {}
    registry = gin.config._REGISTRY
    known = [c.name for _, c in registry.items()] + [s for s, _ in registry.items()]

    def scan(text: str, where: str, depth: int = 0):
        for statement in gin_parser.ConfigParser(text, _Delegate()):
            loc = f"{where}:{statement.location.line_num}"
            if isinstance(statement, gin_parser.IncludeStatement):
                path = _find_file(statement.filename, search_paths)
                if path is None:
                    problems.append(
                        f"{loc}: include {statement.filename!r} not found in "
                        f"{[str(p) for p in search_paths]}"
                    )
                elif depth < 20:
                    scan(path.read_text(), str(path), depth + 1)
                continue
            if not isinstance(statement, gin_parser.BindingStatement):
                continue
            if not statement.arg_name:  # a macro definition
                macros[statement.selector] = (statement.value == ("%", "gin.REQUIRED"), loc)
            else:
                if registry.get_match(statement.selector) is None:
                    problems.append(
                        f"{loc}: unknown configurable {statement.selector!r}"
                        f"{_nearest(statement.selector, known)}"
                    )
                else:
                    params = _signature_params(statement.selector)
                    if params is not None and statement.arg_name not in params:
                        problems.append(
                            f"{loc}: {statement.selector} has no parameter "
                            f"{statement.arg_name!r}{_nearest(statement.arg_name, params)}"
                        )
            for kind, name in _references(statement.value):
                if kind == "%" and name != "gin.REQUIRED":
                    used_macros.setdefault(name, loc)
                elif kind == "@" and registry.get_match(name) is None:
                    problems.append(f"{loc}: unknown configurable @{name}{_nearest(name, known)}")

    for name in gin_files:
        path = _find_file(name, search_paths)
        if path is None:
            problems.append(f"gin file {name!r} not found in . or {[str(p) for p in search_paths]}")
        else:
            scan(path.read_text(), str(path))
    for i, binding in enumerate(bindings):
        scan(binding, f"--gin binding {i + 1} ({binding!r})")
    for name, (required, where) in macros.items():
        if required:
            problems.append(
                f"macro {name} is %gin.REQUIRED ({where}) but never set; pass --gin.{name}=VALUE"
            )
    for name, (_, where) in macros.items():
        if where.startswith("--gin binding") and name not in used_macros:
            problems.append(
                f"{where}: macro {name} is set but never used{_nearest(name, used_macros)}"
            )
    for name, where in used_macros.items():
        if name not in macros:
            problems.append(
                f"{where}: macro %{name} is used but never defined{_nearest(name, macros)}"
            )
    return problems


def semantic_problems(kwargs: dict) -> list[str]:
    """Checks that need the evaluated values: task, batch vs mesh, sequence vs positions."""
    import jax
    import seqio

    import lmsuite.data.tasks  # noqa: F401  (registers the tasks)

    problems = []
    task = kwargs.get("task")
    names = seqio.TaskRegistry.names() | seqio.MixtureRegistry.names()
    if task is not None and task not in names:
        problems.append(f"unknown task {task!r}{_nearest(task, names)}")
    batch_size = kwargs.get("batch_size")
    data, fsdp, tensor = kwargs.get("mesh_shape", (-1, 1, 1))
    devices = jax.device_count()
    if data == -1 and devices % max(fsdp * tensor, 1) == 0:
        data = devices // (fsdp * tensor)
    if batch_size is not None and data > 0 and batch_size % (data * fsdp):
        problems.append(
            f"batch_size {batch_size} is not divisible by the batch axes data*fsdp = "
            f"{data}*{fsdp} = {data * fsdp} (mesh_shape {tuple(kwargs.get('mesh_shape', ()))})"
        )
    micro = kwargs.get("num_microbatches", 1)
    if batch_size is not None and batch_size % micro:
        problems.append(f"batch_size {batch_size} is not divisible by num_microbatches {micro}")
    config = kwargs.get("model_config")
    lengths = kwargs.get("sequence_length") or {}
    if config is not None:
        for feature in ("input_ids", "targets", "inputs"):
            if feature in lengths and lengths[feature] > config.max_positions:
                problems.append(
                    f"sequence_length[{feature!r}] = {lengths[feature]} is longer than the "
                    f"position table (ModelConfig max_positions = {config.max_positions})"
                )
    return problems


def _guard_gin_package_lookup() -> None:
    """Makes gin's Python-package config lookup answer "not found" instead of crashing.

    gin-config 0.5.0 also looks `include 'runs/pretrain.gin'` up as package `runs`; a plain
    directory of that name on sys.path (the working directory, e.g. `make pretrain`'s own
    `runs/default` model dir) is a namespace package without an origin, and gin's check raises
    TypeError instead of returning False. Reported by the second `make pretrain`.
    """
    readers = gin.config._FILE_READERS
    for index, (reader, exists) in enumerate(readers):
        if exists is os.path.isfile or getattr(exists, "_lmsuite_guarded", False):
            continue

        def guarded(path, _exists=exists):
            try:
                return _exists(path)
            except TypeError:
                return False

        guarded._lmsuite_guarded = True
        readers[index] = (reader, guarded)


def _add_search_paths(paths: list[Path]) -> None:
    """Adds the gin search paths (after the working directory, which gin always tries first)."""
    _guard_gin_package_lookup()
    for path in paths:
        if str(path) not in gin.config._LOCATION_PREFIXES:
            gin.add_config_file_search_path(str(path))


def load_config(args) -> dict:
    """Parses gin files and bindings, checks them, and returns `train`'s arguments."""
    register_configurables()
    search_paths = [Path(p) for p in args.gin_search_paths] + [GIN_DIR]
    problems = static_problems(args.gin_file, args.gin_bindings, search_paths)
    if problems:
        raise ConfigError(problems)
    gin.clear_config()
    _add_search_paths(search_paths)
    gin.parse_config_files_and_bindings(args.gin_file, args.gin_bindings, finalize_config=False)
    try:
        kwargs = gin.get_configurable("lmsuite.training.train")()
    except (ValueError, TypeError) as error:
        raise ConfigError([str(error).splitlines()[0]]) from error
    problems = semantic_problems(kwargs)
    if problems:
        raise ConfigError(problems)
    return kwargs


def model_config_from_gin(
    gin_files: list[str], bindings: list[str] = (), *, search_paths: list[str] = ()
):
    """The ModelConfig that model gin files (e.g. `models/bert_base.gin`) describe."""
    from lmsuite.models import ModelConfig

    if gin.config._REGISTRY.get_match("lmsuite.models.ModelConfig") is None:
        gin.external_configurable(ModelConfig, name="ModelConfig", module="lmsuite.models")
    gin.clear_config()
    _add_search_paths([*map(Path, search_paths), GIN_DIR])
    files = [str(Path(f).absolute()) if Path(f).is_file() else f for f in gin_files]
    gin.parse_config_files_and_bindings(files, list(bindings), finalize_config=False)
    return gin.get_configurable("lmsuite.models.ModelConfig")()


def run_info(args) -> dict:
    """`lmsuite info`: parameter counts, shapes and logical axes of the configured model."""
    from lmsuite.models import summary

    bindings = [b for b in args.gin_bindings]
    config = model_config_from_gin(args.gin_file, bindings, search_paths=args.gin_search_paths)
    result = summary.summarize(config)
    if args.json:
        print(summary.summary_json(result))
    else:
        print(summary.format_summary(result, title=", ".join(args.gin_file)))
    return result


def run_vocab(args) -> str:
    """`lmsuite vocab train`: a deterministic SentencePiece model for an embedded corpus."""
    from lmsuite.data import vocab

    path = vocab.train_vocab(
        corpus=args.corpus, size=args.size, out_dir=args.out_dir, seed=args.seed
    )
    print(path)
    return str(path)


def run_tasks(args) -> None:
    """`lmsuite tasks list` / `lmsuite tasks show NAME --n 3`."""
    from lmsuite.data import inspect as task_inspect

    if args.action == "list":
        print("\n".join(task_inspect.list_tasks()))
        return
    if not args.name:
        raise ConfigError(["`lmsuite tasks show` needs a task name; see `lmsuite tasks list`"])
    known = task_inspect.list_tasks()
    if args.name not in known:
        raise ConfigError([f"unknown task {args.name!r}{_nearest(args.name, known)}"])
    print(task_inspect.show_task(args.name, n=args.n, split=args.split, seed=args.seed))


# ---------------------------------------------------------------------------- commands
def _add_gin_flags(parser: argparse.ArgumentParser, *, default_files=(), model_dir=None) -> None:
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
        required=model_dir is None,
        default=model_dir,
        help="checkpoints, config.gin, metrics.jsonl and TensorBoard logs",
    )
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="call jax.distributed.initialize() first (multi-host: every host runs the command)",
    )
    parser.set_defaults(default_gin_files=list(default_files))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lmsuite", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train from gin files (T5X flags)")
    _add_gin_flags(train)
    train.set_defaults(handler=run_train)
    pretrain = commands.add_parser(
        "pretrain", help="pretrain the small BERT of gin/experiments/default.gin on CPU"
    )
    _add_gin_flags(pretrain, default_files=["experiments/default.gin"], model_dir="runs/default")
    pretrain.set_defaults(handler=run_pretrain)
    info = commands.add_parser(
        "info", help="parameter counts (total, embedding, per module), shapes, logical axes"
    )
    info.add_argument("--gin_file", action="append", required=True, help="model gin file(s)")
    info.add_argument("--gin_search_paths", type=lambda s: s.split(","), default=[])
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    info.set_defaults(handler=run_info)

    vocab = commands.add_parser("vocab", help="train a SentencePiece vocabulary")
    vocab.add_argument("action", choices=["train"])
    vocab.add_argument("--corpus", required=True, help="an embedded corpus, e.g. wiki_sample")
    vocab.add_argument("--size", type=int, required=True, help="pieces, specials included")
    vocab.add_argument("--out_dir", default=None, help="default: the lmsuite cache")
    vocab.add_argument("--seed", type=int, default=0)
    vocab.set_defaults(handler=run_vocab)

    tasks = commands.add_parser("tasks", help="list registered tasks or show decoded examples")
    tasks.add_argument("action", choices=["list", "show"])
    tasks.add_argument("name", nargs="?", default=None)
    tasks.add_argument("--n", type=int, default=3, help="examples to show")
    tasks.add_argument("--split", default="validation")
    tasks.add_argument("--seed", type=int, default=0)
    tasks.set_defaults(handler=run_tasks)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """argparse plus T5X's dynamic `--gin.KEY=VALUE` flags."""
    argv = list(sys.argv[1:] if argv is None else argv)
    bindings = [a[len("--gin.") :] for a in argv if a.startswith("--gin.")]
    args = build_parser().parse_args([a for a in argv if not a.startswith("--gin.")])
    args.gin_bindings = [b.replace("=", " = ", 1) for b in bindings]
    if hasattr(args, "default_gin_files") and args.gin_file is None:
        args.gin_file = args.default_gin_files
    return args


def run_train(args) -> dict:
    return _train(args)[1]


def _train(args) -> tuple[dict, dict]:
    """(train's arguments, the last evaluation's metrics)."""
    import jax

    from lmsuite.training import loop

    if args.distributed:
        jax.distributed.initialize()

    kwargs = load_config(args)
    from etils import epath

    model_dir = epath.Path(args.model_dir)  # local or gs://
    model_dir.mkdir(parents=True, exist_ok=True)
    # Every configurable was called while the arguments were collected: this is the operative
    # config, as T5X writes it.
    (model_dir / "config.gin").write_text(gin.operative_config_str())
    return kwargs, loop.train(model_dir=str(model_dir), **kwargs)


def run_pretrain(args) -> dict:
    from lmsuite.training import input_pipeline, metrics, report

    kwargs, final = _train(args)
    held_out = input_pipeline.eval_dataset(  # the batches the run's evaluation read
        task=kwargs["task"],
        sequence_length=kwargs["sequence_length"],
        feature_converter=kwargs["feature_converter"],
        global_batch_size=kwargs["batch_size"],
        split=kwargs.get("eval_split", input_pipeline.EVAL_SPLIT),
        batches=kwargs.get("eval_batches", input_pipeline.EVAL_BATCHES),
    )
    baseline = report.majority_baseline(held_out.as_numpy_iterator())
    from lmsuite.training.checkpointing import absolute

    model_dir = absolute(args.model_dir)
    png = model_dir / "loss_curve.png"
    report.plot_loss_curve(metrics.read_jsonl(model_dir / "metrics.jsonl"), png, baseline=baseline)
    print(f"checkpoints:   {model_dir / 'checkpoints'}")
    print(f"tensorboard:   tensorboard --logdir {model_dir / 'tensorboard'}")
    print(f"metrics:       {model_dir / 'metrics.jsonl'}")
    print(f"loss curve:    {png}")
    accuracy = final.get("eval/mlm_accuracy")
    if accuracy is not None:
        note = "" if baseline is None else f" (always the most frequent target: {baseline:.4f})"
        print(f"held-out MLM accuracy: {accuracy:.4f}{note}")
    return final


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the process's own command line: it may be relaunched
        from lmsuite.training import host_malloc

        host_malloc.relaunch_with_settings()
    args = parse_args(argv)
    from lmsuite.training import loop

    try:
        args.handler(args)
    except ConfigError as error:
        print(f"lmsuite: configuration errors:\n{error}", file=sys.stderr)
        return CONFIG_ERROR_EXIT_CODE
    except loop.NonFiniteLossError as error:
        print(f"lmsuite: {error}", file=sys.stderr)
        return loop.DIVERGED_EXIT_CODE
    except loop.Preempted as error:
        print(f"lmsuite: {error}", file=sys.stderr)
        return loop.PREEMPTED_EXIT_CODE
    return 0


if __name__ == "__main__":
    sys.exit(main())
