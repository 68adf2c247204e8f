"""Preflight refuses a sequence length only where a position table bounds it."""

import pytest

from lmsuite import cli
from lmsuite.models import ModelConfig
from lmsuite.training import preflight, recipes

SEQ2SEQ = dict(architecture="encoder_decoder", heads=("lm",), type_vocab_size=0)


@pytest.fixture(scope="module", autouse=True)
def _registered():
    cli.register_configurables()
    import lmsuite.data.tasks  # noqa: F401


def _length_problems(config: ModelConfig, lengths) -> list[str]:
    found = preflight.check_run(
        task="wiki_sample_t5_span_corruption",
        recipe=recipes.get("t5_span_corruption"),
        sequence_length=lengths,
        model_config=config,
    )
    return [p for p in found.problems if "position table" in p]


def test_t5_relative_positions_take_inputs_longer_than_max_length():
    config = ModelConfig(**SEQ2SEQ, position_type="t5_relative", max_length=512)
    assert _length_problems(config, {"inputs": 1024, "targets": 229}) == []


def test_a_learned_table_bounds_the_lengths_past_its_offset():
    """BART's table: 130 rows, the first 2 reserved, so 128 positions."""
    config = ModelConfig(**SEQ2SEQ, position_type="learned", max_length=130, position_offset=2)
    assert _length_problems(config, {"inputs": 128, "targets": 32}) == []
    assert _length_problems(config, {"inputs": 129, "targets": 32}) == [
        "sequence_length['inputs'] = 129 is longer than the position table: 128 positions "
        "(ModelConfig max_length = 130, position_offset = 2)"
    ]
