"""The import direction of ../shared/STYLE.md, checked on the source: cli -> training ->
{models, objectives, data}; models -> layers -> partitioning; data and objectives stand apart."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).parents[1] / "lmsuite"

# package -> lmsuite packages it must not import
FORBIDDEN = {
    "layers": {"models", "objectives", "data", "training", "evaluation", "convert", "cli"},
    "models": {"objectives", "data", "training", "evaluation", "convert", "cli"},
    "objectives": {"models", "data", "training", "evaluation", "convert", "cli", "layers"},
    "data": {"models", "layers", "objectives", "training", "evaluation", "convert", "cli"},
    "training": {"cli", "convert", "evaluation"},
    "convert": {"training", "data", "objectives", "cli", "evaluation"},
    "partitioning": {"layers", "models", "objectives", "data", "training", "convert", "cli"},
}
# Third-party modules only some packages may import.
ONLY_IN = {"gin": {"cli"}, "argparse": {"cli"}, "absl.flags": {"cli"}}
JAX_FREE = {"data"}  # tf.data + SeqIO only


def _imports(path: pathlib.Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


def _package(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).parts[0].removesuffix(".py")


SOURCES = sorted(p for p in ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_import_direction(path):
    package = _package(path)
    problems = []
    for name in set(_imports(path)):
        parts = name.split(".")
        if parts[0] == "lmsuite" and len(parts) > 1 and parts[1] in FORBIDDEN.get(package, ()):
            problems.append(name)
        for module, allowed in ONLY_IN.items():
            if (name == module or name.startswith(module + ".")) and package not in allowed:
                problems.append(name)
        if package in JAX_FREE and parts[0] in ("jax", "flax", "optax", "orbax"):
            problems.append(name)
    assert not problems, f"{path.relative_to(ROOT)} imports {sorted(problems)}"


def test_the_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from lmsuite.models import Transformer\nimport gin\n")
    assert {"lmsuite.models", "gin"} <= set(_imports(bad))
