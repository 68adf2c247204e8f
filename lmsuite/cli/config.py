"""gin at the edge: the library's configurables registered under stable names, gin files and
bindings checked before anything compiles, and `train`'s arguments evaluated and checked.

Every problem is collected before `ConfigError` is raised: gin's typos and unset macros, task
modules and gin imports that fail, configurables that reject their values, and the evaluated
run's problems (`lmsuite.training.preflight.check_run`).
"""

import copy
import importlib
import inspect
import logging
import os
import sys
import tokenize
import traceback
from pathlib import Path

import gin
import gin.config_parser as gin_parser

from lmsuite.did_you_mean import nearest


def _no_accelerator_here() -> bool:
    """True on a host with libtpu installed (the `tpu` extra, for `lmsuite compile`) but no TPU
    chips and no GPU plugin: there JAX would probe for TPUs at start-up and print libtpu's
    errors about worker hostnames before falling back to the CPU."""
    import glob
    import importlib.util

    if importlib.util.find_spec("libtpu") is None:
        return False
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):  # TPU chips
        return False
    return not any(
        importlib.util.find_spec(name) is not None
        for name in ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin")
    )


if "JAX_PLATFORMS" not in os.environ and _no_accelerator_here():
    os.environ["JAX_PLATFORMS"] = "cpu"

GIN_DIR = Path(__file__).resolve().parents[1] / "gin"


class _QuietSearchMisses(logging.Filter):
    """gin logs an ERROR for every search path an include misses before one hits; drop those."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Path not found:")


logging.getLogger().addFilter(_QuietSearchMisses())
CONFIG_ERROR_EXIT_CODE = 2


def described(summary: str) -> dict[str, str]:
    """A subcommand's `add_parser` texts: the summary in `lmsuite --help`'s list, and as the
    opening sentence of the command's own `--help` (argparse shows neither there by default)."""
    return {"help": summary, "description": summary[0].upper() + summary[1:] + "."}


class ConfigError(ValueError):
    """Every problem found in a configuration, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(f"  - {p}" for p in problems))

    def report(self) -> str:
        """What the CLI prints on stderr: one line for one problem, else a list."""
        if len(self.problems) == 1:
            return f"lmsuite: configuration error: {self.problems[0]}"
        return f"lmsuite: configuration errors:\n{self}"


# ------------------------------------------------------------------------- registration
def _collect_train_args(**kwargs):
    """Gin's `train`: returns its bound arguments so they can be checked before training."""
    return kwargs


def register_configurables() -> None:
    """Makes the library functions configurable under stable gin names (idempotent)."""
    from lmsuite.models import ModelConfig, XLNetOptions
    from lmsuite.models.config import LabelHead
    from lmsuite.models.option_groups import DebertaOptions, ElectraOptions, TupeOptions
    from lmsuite.training import recipes
    from lmsuite.training.optimizer_config import OptimizerConfig, ScheduleConfig

    # Converters and losses are not configurable on their own: a recipe pairs them
    # (lmsuite/training/recipes.py), and make_recipe takes the options.
    entries = [
        (ModelConfig, "ModelConfig", "lmsuite.models"),
        (XLNetOptions, "XLNetOptions", "lmsuite.models"),
        (ElectraOptions, "ElectraOptions", "lmsuite.models"),
        (DebertaOptions, "DebertaOptions", "lmsuite.models"),
        (TupeOptions, "TupeOptions", "lmsuite.models"),
        (LabelHead, "LabelHead", "lmsuite.models"),
        (_collect_train_args, "train", "lmsuite.training"),
        # The run config's optimizer and schedule, under the names of the functions that make
        # them (the gin files bind make_optimizer.eps, make_schedule.warmup_steps, ...).
        (OptimizerConfig, "make_optimizer", "lmsuite.training"),
        (ScheduleConfig, "make_schedule", "lmsuite.training"),
        (recipes.make_recipe, "make_recipe", "lmsuite.training"),
    ]
    for fn, name, module in entries:
        if gin.config._REGISTRY.get_match(f"{module}.{name}") is None:
            gin.external_configurable(fn, name=name, module=module)


def _signature_params(selector: str) -> list[str] | None:
    """Parameter names of a configurable; None if it takes **kwargs we cannot check."""
    from lmsuite.cli import gin_run

    configurable = gin.config._REGISTRY.get_match(selector)
    if configurable.name == "train":  # collects its arguments: gin_run maps them onto the groups
        return [*gin_run.TRAIN_PARAMETERS, gin_run.LEARNING_RATE_FN]
    fn = configurable.wrapped
    if inspect.isclass(fn):
        fn = fn.__init__
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return None
    return [n for n in params if n != "self"]


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


_nearest = nearest


def _moved(selector: str, arg: str, params) -> str:
    """Where a parameter of an older lmsuite now lives, else the nearest name."""
    if selector.endswith("ModelConfig") and arg.startswith("deberta_"):
        option = arg.removeprefix("deberta_")
        return (
            f"; DeBERTa's options moved to DebertaOptions: write DebertaOptions.{option} "
            "(models/deberta.gin sets ModelConfig.deberta = @DebertaOptions())"
        )
    return nearest(arg, params)  # one rule for every "did you mean" (lmsuite.did_you_mean)


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
    """Makes gin search the working directory, then `paths` in their order (the user's folders,
    lmsuite's own last), for this parse: a folder an earlier call added (a notebook that
    trains twice) must not come before them."""
    _guard_gin_package_lookup()
    prefixes = gin.config._LOCATION_PREFIXES  # gin keeps them for the process, in order
    wanted = [str(p) for p in paths]
    prefixes[:] = [""] + wanted + [p for p in prefixes if p not in ("", *wanted)]


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
                            f"{statement.arg_name!r}"
                            f"{_moved(statement.selector, statement.arg_name, params)}"
                        )
            for kind, name in _references(statement.value):
                if kind == "%" and name != "gin.REQUIRED":
                    used_macros.setdefault(name, loc)
                elif kind == "@" and registry.get_match(name.rsplit("/", 1)[-1]) is None:
                    # (a scoped reference, @scope/Name, names configurable Name)
                    problem(f"{loc}: unknown configurable @{name}{_nearest(name, known)}")

    unparsed = False
    for name in gin_files:
        path = _find_file(name, search_paths)
        if path is None and os.path.isdir(name):
            problems.append(f"gin file {name!r} is a directory; expected a .gin file")
        elif path is None:
            folders = [os.getcwd(), *(str(p) for p in search_paths)]
            problems.append(
                f"gin file {name!r} not found in {folders} (the working directory, "
                f"--gin_search_paths, then lmsuite's own gin files)"
            )
        else:
            try:
                scan(path.read_text(), str(path))
            except (SyntaxError, tokenize.TokenError) as error:  # gin's parser: with the line
                problems.append(f"gin file {str(path)!r}: {_syntax_problem(error)}")
                unparsed = True
    for i, binding in enumerate(bindings):
        current["binding"] = i
        try:
            scan(binding, f"--gin binding {i + 1} ({binding!r})")
        except (SyntaxError, tokenize.TokenError) as error:
            problem(_binding_syntax_problem(binding, error))
    current["binding"] = None
    if unparsed:  # the rest of that file was not read: its macros cannot be cross-checked
        return problems
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


def _syntax_problem(error: SyntaxError | tokenize.TokenError) -> str:
    """gin's SyntaxError (or the tokenizer's error) in one line: its first line, and where."""
    if isinstance(error, tokenize.TokenError):  # (message, (line, column))
        message, (line, _) = error.args
        return f"line {line}: {message}"
    first = str(error.msg).strip().splitlines()[0] if error.msg else "invalid syntax"
    where = f"line {error.lineno}: " if error.lineno else ""
    return f"{where}{first} ({error.text.strip()!r})" if error.text else f"{where}{first}"


def _binding_syntax_problem(binding: str, error: SyntaxError | tokenize.TokenError) -> str:
    """A `--gin.KEY=VALUE` flag gin cannot parse, with the likely fix: a string without its
    quotes (`--gin.TASK=my_task` parses as a Python name, not a string)."""
    key, equals, value = (part.strip() for part in binding.partition("="))
    flag = f"--gin.{key}={value}" if equals else f"--gin.{key}"
    if not equals:
        return f"{flag}: expected --gin.KEY=VALUE, e.g. --gin.TRAIN_STEPS=100"
    if value.isidentifier() and value not in ("True", "False", "None"):
        return (
            f"{flag}: {value!r} is not a gin value; a string keeps its quotes: "
            f"--gin.{key}=\"'{value}'\""
        )
    return f"{flag}: gin cannot parse {value!r}: {_syntax_problem(error)}"


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
            message = _first_line(error).removeprefix("ValueError: ")  # (the usual: the value)
            if "REQUIRED" not in message and "Required bindings" not in message:
                problems.append(f"train.{name}: {message}")
            continue
        if not _is_required(evaluated):
            out[name] = evaluated
    return out


def load_run(args, *, need_data: bool = True, devices: int | None = None):
    """Parses gin files and bindings, checks them, and returns the run's checked `TrainConfig`.

    `lmsuite compile` passes `need_data=False` (it reads no examples: unprepared data is a
    warning) and the slice's device count (the mesh is checked against it, not this host's).

    Every problem is collected before raising: gin's typos and unset macros, task modules and
    gin imports that fail, configurables that reject their values, and the run's own problems
    (`TrainConfig.check`: its groups' values, task, data, recipe, model, vocabulary, mesh).
    """
    from lmsuite.cli import gin_run
    from lmsuite.training import preflight
    from lmsuite.training.train_config import InvalidRunError

    register_configurables()
    if getattr(args, "tfds_data_dir", None):
        import seqio

        seqio.set_tfds_data_dir_override(args.tfds_data_dir)
    search_paths = [Path(p) for p in args.gin_search_paths] + [GIN_DIR]
    task_modules = getattr(args, "task_module", []) or []
    problems = import_task_modules(task_modules)
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
    if problems:  # no run can be built; what did evaluate is still checked, to list it all
        found = preflight.check_run(
            task=kwargs.get("task"),
            recipe=kwargs["recipe"].recipe if "recipe" in kwargs else None,
            sequence_length=kwargs.get("sequence_length"),
            model_config=kwargs.get("model_config"),
            batch_size=kwargs.get("batch_size"),
            mesh_shape=kwargs.get("mesh_shape", (-1, 1, 1)),
            num_microbatches=kwargs.get("num_microbatches", 1),
            train_steps=kwargs.get("train_steps"),
            devices=devices,
            need_data=need_data,
        )
        _print_warnings(found.warnings)
        raise ConfigError(problems + found.problems)
    try:
        run = gin_run.train_config(
            kwargs,
            # `lmsuite compile` writes no run (its --model_dir only receives the executable)
            model_dir=getattr(args, "model_dir", None) or ".",
            task_modules=task_modules,
            # Every configurable was called while the arguments were evaluated: this is the
            # operative config, as T5X writes it.
            operative_config=gin.operative_config_str(),
        )
    except (TypeError, ValueError) as error:
        raise ConfigError([str(error)]) from error
    try:
        if need_data and devices is None:
            found = run.validate()  # once: `lmsuite.train(run)` does not check it again
        else:
            found = run.check(devices=devices, need_data=need_data)
            if found.problems:
                raise InvalidRunError(found.problems, found.warnings)
    except InvalidRunError as error:
        _print_warnings(error.warnings)
        raise ConfigError(error.problems) from error
    _print_warnings(found.warnings)
    return run


def load_config(args, *, need_data: bool = True, devices: int | None = None) -> dict:
    """`load_run`'s run as the flat arguments gin's `train` binds, the recipe built and the
    optimizer made (`gin_run.train_arguments`: what `lmsuite compile` compiles)."""
    from lmsuite.cli import gin_run

    return gin_run.train_arguments(load_run(args, need_data=need_data, devices=devices))


def _print_warnings(warnings: list[str]) -> None:
    for warning in warnings:
        print(f"lmsuite: warning: {warning}", file=sys.stderr)


def model_config_from_gin(
    gin_files: list[str], bindings: list[str] = (), *, search_paths: list[str] = ()
):
    """The ModelConfig that model gin files (e.g. `models/bert_base.gin`) or whole experiment
    files (`experiments/albert_base.gin`: the run's configurables parse too) describe."""
    register_configurables()
    gin.clear_config()
    _add_search_paths([*map(Path, search_paths), GIN_DIR])
    files = [str(Path(f).absolute()) if Path(f).is_file() else f for f in gin_files]
    gin.parse_config_files_and_bindings(files, list(bindings), finalize_config=False)
    return gin.get_configurable("lmsuite.models.ModelConfig")()
