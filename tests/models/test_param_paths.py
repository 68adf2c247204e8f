"""Every tiny model's parameter tree (path, shape, logical axes) is pinned.

Checkpoints and the HF converters address parameters by tree path, so moving code between model
modules must not move a single parameter. The snapshot was written before the family modules were
split out of `Transformer`; regenerate it only for a deliberate change of layout:

    LMSUITE_WRITE_PARAM_PATHS=1 pytest tests/models/test_param_paths.py
"""

import json
import os
from pathlib import Path

import pytest

from lmsuite.cli import model_config_from_gin
from lmsuite.cli.config import GIN_DIR
from lmsuite.models.summary import summarize

SNAPSHOT = Path(__file__).parent / "testdata" / "param_paths.json"
# Every tiny model file, plus the experiments whose model differs from their model file (extra
# heads such as NSP's classifier or SpanBERT's SBO, ELECTRA's pretrainer, XLNet's options).
GIN_FILES = sorted(
    [f"models/{p.name}" for p in (GIN_DIR / "models").glob("*_tiny*.gin")]
    + [f"experiments/{p.name}" for p in (GIN_DIR / "experiments").glob("*_tiny.gin")]
    + ["experiments/smoke.gin"]
)


def _tree(gin_file: str) -> dict[str, list]:
    rows = summarize(model_config_from_gin([gin_file]))["params"]
    return {r["path"]: [r["shape"], r["axes"]] for r in rows}


@pytest.fixture(scope="module")
def snapshot():
    if os.environ.get("LMSUITE_WRITE_PARAM_PATHS"):
        trees = {name: _tree(name) for name in GIN_FILES}
        SNAPSHOT.write_text(json.dumps(trees, indent=1, sort_keys=True) + "\n")
    return json.loads(SNAPSHOT.read_text())


def test_snapshot_covers_every_tiny_gin_file(snapshot):
    assert sorted(snapshot) == GIN_FILES


@pytest.mark.parametrize("gin_file", GIN_FILES)
def test_parameter_tree_unchanged(snapshot, gin_file):
    expected = {path: [shape, axes] for path, (shape, axes) in snapshot[gin_file].items()}
    got = json.loads(json.dumps(_tree(gin_file)))  # tuples -> lists, as stored
    assert sorted(got) == sorted(expected), f"{gin_file}: parameter paths moved"
    assert got == expected, f"{gin_file}: parameter shapes or logical axes changed"
