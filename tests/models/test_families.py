"""The family table: the only reader of `ModelConfig.architecture`, one narrow module per row."""

import ast
import inspect
import pathlib

import jax
import numpy as np
import pytest

from lmsuite.models import ModelConfig, XLNetOptions, families
from lmsuite.models.option_groups import ElectraOptions

ROOT = pathlib.Path(__file__).parents[2] / "lmsuite"
TINY = dict(vocab_size=40, d_model=16, num_heads=2, d_ff=32, num_layers=2, max_length=16)
CONFIGS = {
    "encoder": ModelConfig(**TINY),
    "electra": ModelConfig(
        **TINY, heads=("mlm", "rtd"), electra=ElectraOptions(generator_hidden_fraction=0.5)
    ),
    "decoder": ModelConfig(**TINY, architecture="decoder", heads=("lm",), type_vocab_size=0),
    "prefix_lm": ModelConfig(**TINY, architecture="prefix_lm", heads=("lm",), type_vocab_size=0),
    "encoder_decoder": ModelConfig(
        **TINY, architecture="encoder_decoder", heads=("lm",), type_vocab_size=0
    ),
    "xlnet": ModelConfig(
        **TINY, architecture="xlnet", heads=("lm",), type_vocab_size=0, xlnet=XLNetOptions()
    ),
    "transformer_xl": ModelConfig(
        **TINY,
        architecture="transformer_xl",
        heads=("lm",),
        type_vocab_size=0,
        position_type="none",
        xlnet=XLNetOptions(attn_type="uni", bi_data=False, reuse_len=None, mem_len=8),
    ),
}


def _reads_architecture(path: pathlib.Path) -> list[int]:
    """Lines of `path` that read an `.architecture` attribute (a ModelConfig's family name)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "architecture"
    )


def test_only_the_family_table_reads_the_architecture():
    offenders = {
        str(path.relative_to(ROOT)): lines
        for path in sorted(ROOT.rglob("*.py"))
        if path.name != "families.py" and (lines := _reads_architecture(path))
    }
    assert not offenders, f"ask `families.family(config)` instead: {offenders}"


def test_the_reader_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(config):\n    return config.architecture == 'encoder'\n")
    assert _reads_architecture(bad) == [2]


def test_every_row_is_tested_here():
    assert sorted(CONFIGS) == sorted([*families.FAMILIES, "electra"])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_each_family_builds_from_its_example_inputs(name):
    config = CONFIGS[name]
    family = families.family(config)
    assert family.name == name
    model = families.Transformer(config)
    assert type(model) is family.module
    inputs = families.example_inputs(config, batch=2, length=6)
    rngs = {"params": jax.random.PRNGKey(0), "sample": jax.random.PRNGKey(1)}
    outputs, _ = jax.eval_shape(lambda: model.init_with_output(rngs, **inputs))
    assert outputs["hidden"].shape[:2] == (2, 6)


@pytest.mark.parametrize(
    "module",
    sorted(
        {f.module for f in families.FAMILIES.values()} | {families.ELECTRA.module},
        key=lambda m: m.__name__,
    ),
)
def test_no_family_module_takes_more_than_ten_inputs(module):
    for method in ("__call__", "decode"):
        if hasattr(module, method):
            params = inspect.signature(getattr(module, method)).parameters
            assert len(params) - 1 <= 10, f"{module.__name__}.{method} takes {list(params)[1:]}"


def test_decoding_families_have_a_cache_and_the_others_refuse_one():
    for name, config in CONFIGS.items():
        family = families.family(config)
        if family.decodes:
            cache = families.init_cache(config, batch_size=1, length=4)
            assert "layers_0" in cache, name
        else:
            with pytest.raises(ValueError, match="cannot decode with a cache"):
                families.init_cache(config, batch_size=1, length=4)


def test_unknown_architecture_names_the_choices():
    with pytest.raises(ValueError, match="architecture must be one of .*'xlnet'.*got 'gpt'"):
        ModelConfig(**TINY, architecture="gpt")


def test_a_family_refuses_heads_of_another():
    with pytest.raises(ValueError, match=r"heads \['rtd'\] need another architecture: 'decoder'"):
        ModelConfig(**TINY, architecture="decoder", heads=("lm", "rtd"), type_vocab_size=0)
    ids = np.zeros((1, 4), np.int32)
    assert (
        families.example_inputs(CONFIGS["prefix_lm"], batch=1, length=4)["prefix_mask"].shape
        == ids.shape
    )


def test_cached_decoding_refuses_training_only_inputs_by_name():
    config = CONFIGS["decoder"]
    model = families.Transformer(config)
    ids = np.ones((1, 3), np.int32)
    params = model.init(jax.random.PRNGKey(0), ids)
    cache = families.init_cache(config, batch_size=1, length=4)
    with pytest.raises(ValueError, match=r"cached decoding does not take \['segment_ids'\]"):
        model.apply(params, ids, cache=cache, cache_index=0, segment_ids=ids)
    with pytest.raises(ValueError, match="a cache needs cache_index"):
        model.apply(params, ids, cache=cache)
    with pytest.raises(ValueError, match=r"needs prefix_mask \(B, M\)"):
        families.Transformer(CONFIGS["prefix_lm"]).apply(params, ids, cache=cache, cache_index=0)
