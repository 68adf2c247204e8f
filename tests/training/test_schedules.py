"""Schedule values at chosen steps."""

import numpy as np
import pytest

from lmsuite.training import schedules


def _values(schedule, steps):
    return [float(schedule(s)) for s in steps]


def test_bert_linear_warmup_then_decay():
    s = schedules.make_schedule(name="linear", peak_value=1e-4, warmup_steps=10, total_steps=110)
    np.testing.assert_allclose(
        _values(s, [0, 5, 10, 60, 110, 200]), [0, 5e-5, 1e-4, 5e-5, 0, 0], atol=1e-12
    )


def test_tf_bert_jump_at_end_of_warmup():
    """TF BERT decays from step 0: at warmup the rate drops from ~peak to peak*(1-w/T)."""
    s = schedules.make_schedule(
        name="linear", peak_value=1.0, warmup_steps=10, total_steps=100, tf_bert_jump=True
    )
    np.testing.assert_allclose(_values(s, [0, 9, 10, 55, 100]), [0, 0.9, 0.9, 0.45, 0], atol=1e-6)
    smooth = schedules.make_schedule(
        name="linear", peak_value=1.0, warmup_steps=10, total_steps=100
    )
    assert float(smooth(10)) == pytest.approx(1.0)


def test_t5_inverse_square_root():
    s = schedules.make_schedule(name="rsqrt", peak_value=1.0, warmup_steps=10_000)
    np.testing.assert_allclose(
        _values(s, [0, 5_000, 10_000, 40_000, 1_000_000]),
        [0.01, 0.01, 0.01, 0.005, 0.001],
        rtol=1e-6,
    )


def test_warmup_cosine_and_constant():
    s = schedules.make_schedule(name="cosine", peak_value=2.0, warmup_steps=10, total_steps=110)
    # Half-way through the cosine: 0.5 * (1 + cos(pi/2)) * peak = peak / 2.
    np.testing.assert_allclose(_values(s, [0, 5, 10, 60, 110]), [0, 1.0, 2.0, 1.0, 0], atol=1e-6)
    c = schedules.make_schedule(name="constant", peak_value=3e-4)
    np.testing.assert_allclose(_values(c, [0, 10**6]), [3e-4, 3e-4])


def test_bad_schedule_arguments_are_named():
    with pytest.raises(ValueError, match="warmup_steps=20, total_steps=10"):
        schedules.make_schedule(name="linear", peak_value=1.0, warmup_steps=20, total_steps=10)
    with pytest.raises(ValueError, match="got 'exp'"):
        schedules.make_schedule(name="exp", peak_value=1.0)
