"""The `lmsuite` command line: the only module that imports gin and argparse.

    lmsuite info --gin_file=models/bert_base.gin [--json]
    lmsuite train --gin_file=F --gin.KEY=VALUE --model_dir=DIR     (training system)

Library functions carry no gin decorators; this module wraps them with
`gin.external_configurable` at run time, so a notebook can call them without gin.
"""

import argparse
import os
import sys
from collections.abc import Sequence

import gin

from lmsuite.models.config import ModelConfig

# gin/ at the repository root, searched after the user's --gin_search_paths.
DEFAULT_GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gin")

# Registered once, under the short name the gin files use and the module-qualified one.
_ModelConfig = gin.external_configurable(ModelConfig, name="ModelConfig", module="lmsuite.models")


def parse_gin(
    gin_files: Sequence[str],
    bindings: Sequence[str] = (),
    *,
    search_paths: Sequence[str] = (),
    finalize: bool = True,
):
    """Clears gin, then parses the files (searched in `search_paths` and gin/) and bindings."""
    gin.clear_config()
    # gin logs an error for every search path that misses, so the likeliest comes first.
    for path in [DEFAULT_GIN_DIR, *search_paths]:
        gin.add_config_file_search_path(path)
    files = [os.path.abspath(f) if os.path.exists(f) else f for f in gin_files]
    gin.parse_config_files_and_bindings(
        files, list(bindings), finalize_config=finalize, skip_unknown=False
    )


def model_config_from_gin(
    gin_files: Sequence[str], bindings: Sequence[str] = (), *, search_paths: Sequence[str] = ()
) -> ModelConfig:
    """The ModelConfig that gin files (e.g. `models/bert_base.gin`) describe."""
    parse_gin(gin_files, bindings, search_paths=search_paths)
    return _ModelConfig()


# ----------------------------------------------------------------------------- commands
def _split_gin_flags(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """T5X spells bindings `--gin.KEY=VALUE`; argparse cannot declare those, so split them off."""
    rest, bindings = [], []
    for arg in argv:
        if arg.startswith("--gin.") and "=" in arg:
            bindings.append(arg[len("--gin.") :])
        else:
            rest.append(arg)
    return rest, bindings


def _cmd_info(args, bindings) -> int:
    from lmsuite.models import summary

    config = model_config_from_gin(args.gin_file, bindings, search_paths=args.gin_search_paths)
    result = summary.summarize(config)
    if args.json:
        print(summary.summary_json(result))
    else:
        print(summary.format_summary(result, title=", ".join(args.gin_file)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lmsuite", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="parameter counts, shapes and logical axes of a model")
    info.add_argument("--gin_file", action="append", required=True)
    info.add_argument("--gin_search_paths", action="append", default=[])
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    info.set_defaults(func=_cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest, bindings = _split_gin_flags(argv)
    args = build_parser().parse_args(rest)
    return args.func(args, bindings)


if __name__ == "__main__":
    sys.exit(main())
