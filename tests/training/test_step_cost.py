"""`step_cost`: a run's step FLOPs (XLA's count) and tokens, before it trains."""

import jax
import pytest

import lmsuite
from lmsuite.training import input_pipeline, report
from lmsuite.training.step_cost import step_cost

# JAX's event for a jit function's lowering to MLIR (one per lowering, with the function's name).
LOWERING_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
SMALL = {
    "TRAIN_STEPS": 1,
    "WARMUP_STEPS": 0,
    "BATCH_SIZE": 8,  # (the test suite forces 8 CPU devices)
    "train.eval_batches": 1,
    "train.final_eval": False,
    "train.progress_bar": False,
}


def _run(tmp_path, experiment="bert_tiny", **bindings):
    return lmsuite.run_from_gin(
        f"experiments/{experiment}.gin", model_dir=str(tmp_path / experiment),
        bindings={**SMALL, **bindings},
    )  # fmt: skip


def test_the_count_is_the_one_the_training_loop_reports(tmp_path, monkeypatch):
    run = _run(tmp_path)
    expected = step_cost(run)
    seen = []
    original = report.lowered_flops

    def spy(lowered, **kwargs):
        seen.append(original(lowered, **kwargs))
        return seen[-1]

    monkeypatch.setattr(report, "lowered_flops", spy)
    # The loop lowers its step from the batch's shapes before it takes the first batch (the
    # compile overlaps the input pipeline's start), and its first call reuses that lowering
    # and its executable: a call that lowered again would compile again.
    order = []
    next_batch = input_pipeline.Prefetcher.__next__

    def lowered_event(event, seconds, **kwargs):
        if event == LOWERING_EVENT and kwargs.get("fun_name") == "jit(train_step)":
            order.append("train_step lowered")

    def spied_next(self):
        order.append("batch taken")
        return next_batch(self)

    monkeypatch.setattr(input_pipeline.Prefetcher, "__next__", spied_next)
    jax.monitoring.register_event_duration_secs_listener(lowered_event)
    try:
        lmsuite.train(run)
    finally:
        jax.monitoring.unregister_event_duration_listener(lowered_event)
    assert seen and seen[0] == expected.flops
    assert order == ["train_step lowered", "batch taken"], order  # TRAIN_STEPS 1


@pytest.mark.parametrize(
    "experiment",
    ["bert_tiny"]
    + [pytest.param(e, marks=pytest.mark.slow) for e in ("electra_tiny", "xlnet_tiny")],
)
def test_flops_and_tokens_grow_with_the_batch(tmp_path, experiment):
    one = step_cost(_run(tmp_path, experiment, BATCH_SIZE=8))
    two = step_cost(_run(tmp_path, experiment, BATCH_SIZE=16))
    assert two.tokens == 2 * one.tokens
    assert two.params == one.params
    # the optimizer update does not grow with the batch: a little under twice
    assert 1.9 < two.flops / one.flops <= 2.0


def test_electra_is_charged_for_its_generator(tmp_path):
    """ELECTRA's step runs its generator too: a generator of every layer instead of half of
    them costs more, a discriminator's layer's worth of extra work or less."""
    half = step_cost(_run(tmp_path, "electra_tiny"))
    whole = step_cost(_run(tmp_path, "electra_tiny", **{
        "ElectraOptions.generator_layer_fraction": 1.0}))  # fmt: skip
    assert half.params < whole.params
    assert 1.05 * half.flops < whole.flops < 2 * half.flops
