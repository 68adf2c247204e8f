"""A TUPE model has no HF class: exporting it is refused by name, also when a class is named."""

import jax
import numpy as np
import pytest

from lmsuite import convert
from lmsuite.models import ModelConfig, Transformer

TUPE = ModelConfig(
    vocab_size=40, d_model=16, num_heads=2, d_ff=24, num_layers=1, max_length=16,
    position_type="tupe", type_vocab_size=0, heads=("mlm",),
)  # fmt: skip


@pytest.mark.parametrize("hf_class", [None, "BertForMaskedLM"])
def test_export_refuses_tupe(hf_class, tmp_path):
    params = Transformer(TUPE).init(jax.random.key(0), input_ids=np.ones((1, 4), np.int32))
    with pytest.raises(ValueError, match="HuggingFace transformers has no TUPE model class"):
        convert.to_hf(TUPE, params["params"], str(tmp_path / "out"), hf_class=hf_class)
    assert not (tmp_path / "out").exists()


def test_infer_hf_class_refuses_tupe_and_not_its_learned_twin():
    with pytest.raises(ValueError, match="no TUPE model class.*Use it through lmsuite"):
        convert.infer_hf_class(TUPE)
    assert convert.infer_hf_class(TUPE.replace(position_type="learned", tupe=None)) == (
        "BertForMaskedLM"
    )
