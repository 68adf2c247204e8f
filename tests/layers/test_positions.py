"""Position tables and buckets against independent references."""

import math

import numpy as np
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from lmsuite.layers.positions import sinusoidal_table, t5_relative_bucket


def test_sinusoidal_matches_closed_form():
    table = sinusoidal_table(50, 16)
    for p in (0, 1, 7, 49):
        for i in range(8):
            angle = p / 10000 ** (2 * i / 16)
            assert math.isclose(table[p, 2 * i], math.sin(angle), abs_tol=1e-6)
            assert math.isclose(table[p, 2 * i + 1], math.cos(angle), abs_tol=1e-6)


def test_sinusoidal_rejects_odd_width():
    import pytest

    with pytest.raises(ValueError, match="even width, got 7"):
        sinusoidal_table(4, 7)


def test_t5_buckets_match_hf_for_every_distance():
    rel = np.arange(-300, 301)[None, :]
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (16, 64), (8, 20)):
            ours = t5_relative_bucket(
                rel, bidirectional=bidirectional, num_buckets=buckets, max_distance=distance
            )
            ref = T5Attention._relative_position_bucket(
                torch.from_numpy(rel),
                bidirectional=bidirectional,
                num_buckets=buckets,
                max_distance=distance,
            ).numpy()
            np.testing.assert_array_equal(ours, ref)
