"""The `lmsuite` command line: the only module that imports gin and argparse.

  lmsuite train --gin_file=F [--gin_file=G] --gin.KEY=VALUE --model_dir=DIR
                [--gin_search_paths=...] [--task_module=M ...] [--tfds_data_dir=D] [--distributed]
  lmsuite pretrain [--gin_file=experiments/E.gin] [--gin.KEY=VALUE ...] [--model_dir=DIR]
  lmsuite recipes list | show NAME
  lmsuite tasks list | show NAME [--task_module=M]

Flags are spelled as in T5X. Before anything compiles, the configuration is checked and every
problem is listed at once, each with the nearest valid name: unknown configurables and parameters
(typos), `%gin.REQUIRED` macros left unset, task modules that do not import, an unknown task, a
task whose data is not prepared, a task that does not fit the recipe (features, sequence-length
keys, span lengths), a model that does not (architecture, heads, a vocabulary smaller than the
task's), a batch the data axis does not divide, a sequence longer than the position table.
Exit codes: 2 configuration error, 3 NaN/Inf loss, 143 preempted (SIGTERM, checkpoint saved).
"""

import argparse
import copy
import difflib
import importlib
import inspect
import logging
import os
import sys
import traceback
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
    from lmsuite.models import ModelConfig
    from lmsuite.training import optimizers, recipes, schedules

    # Converters and losses are not configurable on their own: a recipe pairs them
    # (lmsuite/training/recipes.py), and make_recipe takes the options.
    entries = [
        (ModelConfig, "ModelConfig", "lmsuite.models"),
        (_collect_train_args, "train", "lmsuite.training"),
        (optimizers.make_optimizer, "make_optimizer", "lmsuite.training"),
        (schedules.make_schedule, "make_schedule", "lmsuite.training"),
        (recipes.make_recipe, "make_recipe", "lmsuite.training"),
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


def static_problems(
    gin_files: list[str],
    bindings: list[str],
    search_paths: list[Path],
    bad_bindings: set[int] | None = None,
) -> list[str]:
    """Unknown files, configurables, parameters and unset `%gin.REQUIRED` macros, and gin
    `import` lines that fail, all at once. The indices of `--gin` bindings with a problem are
    added to `bad_bindings` (so the rest of the config can still be evaluated and checked)."""
    problems: list[str] = []
    macros: dict[str, tuple[bool, str]] = {}  # name -> (is_required, where)
    used_macros: dict[str, str] = {}
    registry = gin.config._REGISTRY
    known = [c.name for _, c in registry.items()] + [s for s, _ in registry.items()]
    current: dict[str, int | None] = {"binding": None}

    def problem(text: str) -> None:
        problems.append(text)
        if bad_bindings is not None and current["binding"] is not None:
            bad_bindings.add(current["binding"])

    def scan(text: str, where: str, depth: int = 0):
        for statement in gin_parser.ConfigParser(text, _Delegate()):
            loc = f"{where}:{statement.location.line_num}"
            if isinstance(statement, gin_parser.IncludeStatement):
                path = _find_file(statement.filename, search_paths)
                if path is None:
                    problem(
                        f"{loc}: include {statement.filename!r} not found in "
                        f"{[str(p) for p in search_paths]}"
                    )
                elif depth < 20:
                    scan(path.read_text(), str(path), depth + 1)
                continue
            if isinstance(statement, gin_parser.ImportStatement):
                if statement.module.startswith("__gin__"):  # gin's own switches
                    continue
                failure = import_failure(statement.module)
                if failure is not None:
                    problem(f"{loc}: import {statement.module}: {failure}")
                continue
            if not isinstance(statement, gin_parser.BindingStatement):
                continue
            if not statement.arg_name:  # a macro definition
                macros[statement.selector] = (statement.value == ("%", "gin.REQUIRED"), loc)
            else:
                if registry.get_match(statement.selector) is None:
                    problem(
                        f"{loc}: unknown configurable {statement.selector!r}"
                        f"{_nearest(statement.selector, known)}"
                    )
                else:
                    params = _signature_params(statement.selector)
                    if params is not None and statement.arg_name not in params:
                        problem(
                            f"{loc}: {statement.selector} has no parameter "
                            f"{statement.arg_name!r}{_nearest(statement.arg_name, params)}"
                        )
            for kind, name in _references(statement.value):
                if kind == "%" and name != "gin.REQUIRED":
                    used_macros.setdefault(name, loc)
                elif kind == "@" and registry.get_match(name) is None:
                    problem(f"{loc}: unknown configurable @{name}{_nearest(name, known)}")

    for name in gin_files:
        path = _find_file(name, search_paths)
        if path is None:
            problems.append(f"gin file {name!r} not found in . or {[str(p) for p in search_paths]}")
        else:
            scan(path.read_text(), str(path))
    for i, binding in enumerate(bindings):
        current["binding"] = i
        scan(binding, f"--gin binding {i + 1} ({binding!r})")
    current["binding"] = None
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


def import_failure(module: str) -> str | None:
    """Imports a task module; None if it imported, else what went wrong (and where)."""
    try:
        importlib.import_module(module)
    except Exception as error:  # any failure of the user's module is a configuration problem
        frames = traceback.extract_tb(error.__traceback__)
        own = [f for f in frames if "importlib" not in f.filename]
        at = f" (at {own[-1].filename}:{own[-1].lineno})" if own else ""
        return f"does not import: {type(error).__name__}: {error}{at}"
    return None


def import_task_modules(modules: list[str]) -> list[str]:
    """Imports each `--task_module` (registering its tasks); the problems of those that fail."""
    return [
        f"--task_module={m}: {failure}"
        for m in modules
        if (failure := import_failure(m)) is not None
    ]


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def _is_required(value) -> bool:
    return value is gin.REQUIRED


def _evaluate_train_arguments(problems: list[str]) -> dict:
    """`train`'s bound arguments, each evaluated on its own, so that one failing configurable
    (a schedule rejecting TRAIN_STEPS = 0, an unknown recipe) does not hide the checks of the
    others; failures are added to `problems`."""
    raw = gin.get_bindings("lmsuite.training.train", resolve_references=False)
    out = {}
    for name, value in raw.items():
        try:
            evaluated = copy.deepcopy(value)
        except Exception as error:  # a configurable's own validation: report, keep checking
            message = _first_line(error)
            if "REQUIRED" not in message and "Required bindings" not in message:
                problems.append(f"train.{name}: {message}")
            continue
        if not _is_required(evaluated):
            out[name] = evaluated
    return out


def load_config(args) -> dict:
    """Parses gin files and bindings, checks them, and returns `train`'s arguments.

    Every problem is collected before raising: gin's typos and unset macros, task modules and
    gin imports that fail, configurables that reject their values, and the evaluated run's
    problems (`preflight.check_run`: task, data, recipe, model, vocabulary, mesh).
    """
    from lmsuite.training import preflight

    register_configurables()
    if getattr(args, "tfds_data_dir", None):
        import seqio

        seqio.set_tfds_data_dir_override(args.tfds_data_dir)
    search_paths = [Path(p) for p in args.gin_search_paths] + [GIN_DIR]
    problems = import_task_modules(getattr(args, "task_module", []) or [])
    bad_bindings: set[int] = set()
    problems += static_problems(args.gin_file, args.gin_bindings, search_paths, bad_bindings)
    gin.clear_config()
    _add_search_paths(search_paths)
    bindings = [b for i, b in enumerate(args.gin_bindings) if i not in bad_bindings]
    try:
        gin.parse_config_files_and_bindings(
            args.gin_file, bindings, finalize_config=False, skip_unknown=True
        )
    except Exception as error:  # gin's own parse error; the static scan may not have caught it
        if not problems:
            problems.append(_first_line(error))
        raise ConfigError(problems) from error
    kwargs = _evaluate_train_arguments(problems)
    if "recipe" not in kwargs and not any("train.recipe" in p or "RECIPE" in p for p in problems):
        problems.append(
            "no recipe: set RECIPE (e.g. --gin.RECIPE='bert_mlm'; `lmsuite recipes list`)"
        )
    found = preflight.check_run(
        task=kwargs.get("task"),
        recipe=kwargs.get("recipe"),
        sequence_length=kwargs.get("sequence_length"),
        model_config=kwargs.get("model_config"),
        batch_size=kwargs.get("batch_size"),
        mesh_shape=kwargs.get("mesh_shape", (-1, 1, 1)),
        num_microbatches=kwargs.get("num_microbatches", 1),
        train_steps=kwargs.get("train_steps"),
    )
    problems += found.problems
    for warning in found.warnings:
        print(f"lmsuite: warning: {warning}", file=sys.stderr)
    if problems:
        raise ConfigError(problems)
    from lmsuite.training import recipes

    kwargs["recipe"] = recipes.build(kwargs["recipe"], model_config=kwargs["model_config"])
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
    known = task_inspect.list_tasks()
    if args.name not in known:
        raise ConfigError([f"unknown task {args.name!r}{_nearest(args.name, known)}"])
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lmsuite", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    formatter = argparse.RawDescriptionHelpFormatter
    train = commands.add_parser(
        "train",
        help="train from gin files (T5X flags)",
        epilog=GIN_EPILOG,
        formatter_class=formatter,
    )
    _add_gin_flags(train)
    train.set_defaults(handler=run_train)
    pretrain = commands.add_parser(
        "pretrain",
        help="pretrain on CPU: gin/experiments/default.gin (a small BERT) or another experiment",
        epilog=GIN_EPILOG,
        formatter_class=formatter,
    )
    _add_gin_flags(pretrain, default_files=["experiments/default.gin"], model_dir="")
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
    _add_task_module_flag(tasks)
    tasks.set_defaults(handler=run_tasks)

    recipe_parser = commands.add_parser(
        "recipes", help="list the recipes (task objective, converter, loss, model) or show one"
    )
    recipe_parser.add_argument("action", choices=["list", "show"])
    recipe_parser.add_argument("name", nargs="?", default=None)
    recipe_parser.set_defaults(handler=run_recipes)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """argparse plus T5X's dynamic `--gin.KEY=VALUE` flags."""
    argv = list(sys.argv[1:] if argv is None else argv)
    bindings = [a[len("--gin.") :] for a in argv if a.startswith("--gin.")]
    args = build_parser().parse_args([a for a in argv if not a.startswith("--gin.")])
    args.gin_bindings = [b.replace("=", " = ", 1) for b in bindings]
    if hasattr(args, "default_gin_files") and args.gin_file is None:
        args.gin_file = args.default_gin_files
    if getattr(args, "model_dir", None) == "":  # pretrain: runs/<experiment>
        args.model_dir = f"runs/{Path(args.gin_file[0]).stem}"
    return args


def run_train(args):
    kwargs, result = _train(args)
    print(summary_text(kwargs, result))
    return result


def _train(args):
    """(train's arguments, the run's `loop.RunResult`)."""
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
    return kwargs, loop.train(model_dir=str(model_dir), checked=True, **kwargs)


def _metric_line(metrics: dict, keys) -> str:
    return "  ".join(f"{k.removeprefix('eval/')} {metrics[k]:.4f}" for k in keys if k in metrics)


def summary_text(kwargs: dict, result) -> str:
    """What a finished `lmsuite train` prints: steps, final and held-out metrics, artefacts."""
    recipe = kwargs["recipe"].recipe
    metric_keys = ["loss", *recipe.metrics]
    train = result.train_metrics
    lines = [
        f"lmsuite train: step {result.step} of {kwargs['train_steps']} on {kwargs['task']!r} "
        f"with recipe {recipe.name!r}",
        f"  final train:  {_metric_line(train, metric_keys)}"
        + (f"  ({train['tokens_per_sec']:.0f} tokens/s)" if "tokens_per_sec" in train else ""),
    ]
    held_out = result.eval_metrics
    split = kwargs.get("eval_split", "validation")
    if held_out:
        eval_keys = [f"eval/{k}" for k in metric_keys]
        lines.append(f"  held-out ({split}):  {_metric_line(held_out, eval_keys)}")
    else:
        lines.append("  held-out: no evaluation ran (train.final_eval = False)")
    model_dir = Path(result.model_dir) if "://" not in result.model_dir else result.model_dir
    steps = ", ".join(map(str, result.checkpoints)) or "none"
    lines += [
        f"  checkpoints:  {model_dir}/checkpoints (steps {steps})",
        f"  metrics:      {model_dir}/metrics.jsonl",
        f"  tensorboard:  tensorboard --logdir {model_dir}/tensorboard",
        f"  config:       {model_dir}/config.gin",
    ]
    return "\n".join(lines)


def run_pretrain(args):
    from lmsuite.training import input_pipeline, metrics, report

    kwargs, result = _train(args)
    print(summary_text(kwargs, result))
    built = kwargs["recipe"]
    data = dict(
        task=kwargs["task"],
        sequence_length=kwargs["sequence_length"],
        feature_converter=built.feature_converter,
        global_batch_size=kwargs["batch_size"],
    )
    held_out = input_pipeline.eval_dataset(  # the batches the run's evaluation read
        **data,
        split=kwargs.get("eval_split", input_pipeline.EVAL_SPLIT),
        batches=kwargs.get("eval_batches", input_pipeline.EVAL_BATCHES),
    )
    targets, weights = built.recipe.prediction_features
    baselines = report.baselines(
        held_out.as_numpy_iterator(),
        train_batches=input_pipeline.process_dataset(
            **data, split="train", shuffle=False, repeat=False
        ).as_numpy_iterator(),
        targets=targets,
        weights=weights,
        vocab_size=kwargs["model_config"].vocab_size,
    )
    from lmsuite.training.checkpointing import absolute

    model_dir = absolute(args.model_dir)
    png = model_dir / "loss_curve.png"
    report.plot_loss_curve(
        metrics.read_jsonl(model_dir / "metrics.jsonl"), png, baseline=baselines.majority
    )
    print(f"  loss curve:   {png}")
    held = result.eval_metrics
    accuracy_key, entropy_key = (f"eval/{k}" for k in built.recipe.learning_metrics)
    what = built.recipe.prediction_name
    if accuracy_key in held and baselines.majority is not None:
        print(
            f"held-out {what} accuracy: {held[accuracy_key]:.4f} (always the most frequent "
            f"target: {baselines.majority:.4f})"
        )
    if entropy_key in held and baselines.unigram_cross_entropy is not None:
        print(
            f"held-out {what} cross-entropy: {held[entropy_key]:.4f} nats (unigram of the train "
            f"split: {baselines.unigram_cross_entropy:.4f})"
        )
    return result


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
