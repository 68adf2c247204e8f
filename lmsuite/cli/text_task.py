"""The user's own text on the command line (`lmsuite.data.text_files`):

  lmsuite vocab train --text_files=GLOB[,GLOB] --size=N [--out_dir=D] [--seed=S] [format flags]
  lmsuite train|pretrain ... --train_files=GLOB [--validation_files=GLOB] [--vocab=MODEL]
                             [format flags]
  format flags: --text_format=auto|text|jsonl  --split_documents=file|blank_line|line
                --jsonl_field=FIELD

Globs are local or gs://, comma-separated or the flag repeated. `prepare_run` registers the task
of the run's recipe (its first objective) over the files and binds TASK to it before the
configuration is checked, so the checks see it as any task; `lmsuite train` records its spec in
run.json, from which `lmsuite eval` and `lmsuite.load` register it again.
"""

import sys
from pathlib import Path

import gin

from lmsuite.cli import config

_FORMAT_FLAGS = ("text_format", "split_documents", "jsonl_field")


def add_format_flags(parser) -> None:
    parser.add_argument(
        "--text_format",
        choices=["auto", "text", "jsonl"],
        default=None,
        help="auto (default): JSON lines for *.jsonl, *.ndjson, *.json (also .gz), else text",
    )
    parser.add_argument(
        "--split_documents",
        choices=["file", "blank_line", "line"],
        default=None,
        help="one document per file, blank-line separated block, or line (default: file for "
        "text, line (a record) for JSON lines)",
    )
    parser.add_argument(
        "--jsonl_field", default=None, help="the JSON-lines field holding the text (default: text)"
    )


def add_train_flags(parser) -> None:
    parser.add_argument(
        "--train_files",
        action="append",
        default=None,
        help="train on your own text: globs (local or gs://; comma-separated or repeated); the "
        "run's TASK becomes the recipe's task over these files",
    )
    parser.add_argument(
        "--validation_files",
        action="append",
        default=None,
        help="held-out text for --train_files (default: 5%% of the training documents, chosen "
        "by a hash of their text)",
    )
    parser.add_argument(
        "--vocab",
        default=None,
        help="a SentencePiece model from `lmsuite vocab train` for the --train_files task "
        "(default: lmsuite's 8,100-id vocabulary); ModelConfig.vocab_size must match it",
    )
    add_format_flags(parser)


def add_vocab_flags(parser) -> None:
    parser.add_argument(
        "--text_files",
        action="append",
        default=None,
        help="train on your own files: globs (local or gs://; comma-separated or repeated)",
    )
    add_format_flags(parser)


def _reading(args) -> dict:
    return dict(
        format=args.text_format or "auto",
        split_documents=args.split_documents,
        jsonl_field=args.jsonl_field or "text",
    )


def run_vocab(args) -> str:
    """`lmsuite vocab train`: a deterministic SentencePiece model for an embedded corpus
    (--corpus) or the user's files (--text_files); prints the model's path."""
    from lmsuite.data import text_files, vocab

    if (args.corpus is None) == (not args.text_files):
        raise config.ConfigError(
            [
                "`lmsuite vocab train` takes one of --corpus=NAME (an embedded corpus, one of "
                f"{vocab.local_corpora()}) and --text_files=GLOB (your own files)"
            ]
        )
    try:
        vocab.check_size(args.size)
    except ValueError as error:
        raise config.ConfigError([f"--size={args.size}: {error}"]) from error
    if args.corpus is not None:
        problems = [f"--{f} is for --text_files" for f in _FORMAT_FLAGS if getattr(args, f)]
        if args.corpus not in vocab.local_corpora():
            problems.append(
                f"--corpus={args.corpus!r} is not an embedded corpus: --corpus takes an embedded "
                f"corpus name, one of {vocab.local_corpora()}; your own files go in "
                f"--text_files (e.g. --text_files={args.corpus})"
            )
        if problems:
            raise config.ConfigError(problems)
        path = vocab.train_vocab(
            corpus=args.corpus, size=args.size, out_dir=args.out_dir, seed=args.seed
        )
    else:
        try:
            path = text_files.train_vocab_from_files(
                text_files=args.text_files,
                size=args.size,
                out_dir=args.out_dir,
                seed=args.seed,
                **_reading(args),
            )
        except ValueError as error:
            raise config.ConfigError([str(error)]) from error
        ids = args.size + vocab.NUM_SENTINELS
        print(
            f"lmsuite vocab: {args.size} pieces + {vocab.NUM_SENTINELS} sentinels = {ids} ids; "
            f"train with --train_files=... --vocab={path} --gin.ModelConfig.vocab_size={ids}",
            file=sys.stderr,
        )
    print(path)
    return str(path)


def _recipe_name(args) -> str | None:
    """The run's recipe, from the gin files and the bindings without static problems (as
    `config.load_config` parses them); None when they do not parse (load_config says why).

    Raises:
      ConfigError: the configuration parses but names no recipe.
    """
    config.register_configurables()
    search_paths = [Path(p) for p in args.gin_search_paths] + [config.GIN_DIR]
    bad: set[int] = set()
    config.static_problems(args.gin_file, args.gin_bindings, search_paths, bad)
    bindings = [b for i, b in enumerate(args.gin_bindings) if i not in bad]
    gin.clear_config()
    config._add_search_paths(search_paths)
    try:
        gin.parse_config_files_and_bindings(
            args.gin_file, bindings, finalize_config=False, skip_unknown=True
        )
    except Exception:  # gin's own errors: load_config parses the same way and reports them
        gin.clear_config()
        return None
    names = []
    for key in ("%RECIPE", "lmsuite.training.make_recipe.name"):
        try:
            names.append(gin.query_parameter(key))
        except ValueError:  # not bound
            pass
    gin.clear_config()
    recipe = next((n for n in names if isinstance(n, str)), None)
    if recipe is None:
        raise config.ConfigError(
            [
                "--train_files builds the task of the run's recipe: set RECIPE (e.g. "
                "--gin.RECIPE=\"'bert_mlm'\"; `lmsuite recipes list`)"
            ]
        )
    return recipe


def prepare_run(args) -> None:
    """With --train_files: registers the text task of the run's recipe, binds TASK to it and
    sets `args.text_task` (its `TextTaskSpec`); otherwise checks that no text flag is given."""
    args.text_task = None
    others = ["validation_files", "vocab", *_FORMAT_FLAGS]
    if not getattr(args, "train_files", None):
        given = [f"--{f}" for f in others if getattr(args, f, None)]
        if given:
            raise config.ConfigError(
                [f"{', '.join(given)} describe the --train_files task; add --train_files=GLOB"]
            )
        return
    bound = [b for b in args.gin_bindings if b.split("=", 1)[0].strip() in ("TASK", "train.task")]
    if bound:
        raise config.ConfigError(
            [
                f"--train_files sets the run's TASK (the recipe's task over your files); drop "
                f"--gin.{bound[0].replace(' = ', '=', 1)}"
            ]
        )
    recipe = _recipe_name(args)
    if recipe is None:
        return  # the configuration does not parse: load_config lists why (and stops the run)
    from lmsuite.data import text_files
    from lmsuite.training import recipes

    try:
        objective = recipes.get(recipe).task_objectives[0]
        name = text_files.register_text_task(
            objective=objective,
            train_files=args.train_files,
            validation_files=args.validation_files,
            vocabulary=args.vocab,
            **_reading(args),
        )
        spec = text_files.TEXT_TASKS[name]
        counts = text_files.read_corpus(spec)  # the files' errors now, not in the input thread
    except ValueError as error:
        raise config.ConfigError([str(error)]) from error
    validation = (
        f"{len(spec.validation_files)} validation files"
        if spec.validation_files
        else (f"held out {spec.validation_fraction:.0%} of the documents")
    )
    print(
        f"lmsuite: task {name!r} ({objective} for recipe {recipe!r}): {counts['train']} train "
        f"and {counts['validation']} validation documents ({len(spec.train_files)} train files, "
        f"{validation})",
        file=sys.stderr,
    )
    args.gin_bindings.append(f"TASK = {name!r}")
    args.text_task = spec
