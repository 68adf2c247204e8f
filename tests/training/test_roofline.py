"""The per-op roofline counts what the compiled TPU program does: checked on programs compiled
for a v4 chip through libtpu's compile-only devices, against closed-form counts and XLA's own
cost analysis, and on a hand-written module."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lmsuite.training import accelerators, aot, hlo_text, roofline

V4 = accelerators.get("v4-8").generation


def _compile_for_v4(fn, *shapes):
    """`fn` compiled for one v4 chip (the slice's first device), from shapes alone."""
    device = aot.slice_devices("v4-8")[0]
    sharding = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
    args = [jax.ShapeDtypeStruct(s, d, sharding=sharding) for s, d in shapes]
    return jax.jit(fn).lower(*args).compile()


def _project(compiled):
    return roofline.project(compiled.as_text(), roofline.rates_for(V4))


def test_a_matmul_counts_its_flops_and_xla_agrees():
    n = 1024
    compiled = _compile_for_v4(lambda a, b: a @ b, ((n, n), jnp.bfloat16), ((n, n), jnp.bfloat16))
    projection = _project(compiled)
    flops = sum(op.flops * op.trips for op in projection.ops)
    assert flops == 2 * n**3
    assert flops == pytest.approx(compiled.cost_analysis()["flops"], rel=0.01)
    by_class = projection.by_class()
    assert by_class["matmul"]["flops"] == 2 * n**3
    # three bf16 matrices: two read (one of them prefetched), one written
    assert sum(op.hbm_bytes for op in projection.ops) == 3 * n * n * 2
    # 2.1 GFLOP on a 275 TFLOP/s chip: MXU-bound at 7.8 us. The prefetch of one operand (an
    # asynchronous copy, 2 MiB at 1.2 TB/s: 1.7 us) fits in the HBM time the matmul leaves idle
    assert [op.op_class for op in projection.ops].count("copy") == 1
    assert by_class["copy"]["hbm_bytes"] == n * n * 2 and by_class["copy"]["seconds"] == 0
    assert projection.seconds == pytest.approx(2 * n**3 / V4.peak_flops, rel=1e-6)


def test_an_elementwise_op_is_bound_by_hbm_or_the_vector_unit():
    n = 4096
    compiled = _compile_for_v4(lambda x: jnp.tanh(x * 2.0 + 1.0), ((n, n), jnp.float32))
    projection = _project(compiled)
    hbm = sum(op.hbm_bytes for op in projection.ops)
    vector = sum(op.vector_ops for op in projection.ops)
    assert hbm == 2 * n * n * 4  # one f32 read, one written
    assert vector >= 3 * n * n  # multiply, add, tanh per element
    assert sum(op.flops for op in projection.ops) == 0
    seconds = max(hbm / V4.hbm_bandwidth, vector / roofline.rates_for(V4).vpu_ops)
    assert projection.seconds == pytest.approx(seconds, rel=0.01)


def test_a_loop_body_counts_once_per_trip():
    n, trips = 512, 7

    def repeated(a, b):
        return jax.lax.fori_loop(0, trips, lambda _, x: jnp.tanh(x @ b), a)

    compiled = _compile_for_v4(repeated, ((n, n), jnp.float32), ((n, n), jnp.float32))
    projection = _project(compiled)
    assert sum(op.flops * op.trips for op in projection.ops) == trips * 2 * n**3
    assert any(op.trips == trips for op in projection.ops)


def test_threefry_bits_are_the_rng_class_and_cost_vector_time():
    def dropout(x, key):
        keep = jax.random.bernoulli(jax.random.wrap_key_data(key), 0.9, x.shape)
        return jnp.where(keep, x / 0.9, 0.0)

    compiled = _compile_for_v4(dropout, ((2048, 2048), jnp.float32), ((2,), jnp.uint32))
    by_class = _project(compiled).by_class()
    assert by_class["rng"]["vector_ops"] > 10 * 2048 * 2048  # threefry: ~20 integer ops a word
    assert by_class["rng"]["seconds"] > 0.5 * _project(compiled).seconds


def test_hand_written_module_padding_prefetch_and_in_place_update():
    text = """HloModule m

%fused (p0: f32[8,16], p1: f32[64,16], p2: s32[]) -> f32[64,16] {
  %p0 = f32[8,16]{1,0:T(8,128)} parameter(0)
  %p1 = f32[64,16]{1,0:T(8,128)} parameter(1)
  %p2 = s32[]{:T(128)} parameter(2)
  %z = s32[] constant(0)
  %e = f32[8,16]{1,0:T(8,128)} exponential(%p0)
  ROOT %u = f32[64,16]{1,0:T(8,128)} dynamic-update-slice(%p1, %e, %p2, %z)
}

ENTRY %main (a: f32[8,16], b: f32[64,16], i: s32[]) -> f32[64,16] {
  %a = f32[8,16]{1,0:T(8,128)} parameter(0)
  %b = f32[64,16]{1,0:T(8,128)} parameter(1)
  %i = s32[]{:T(128)} parameter(2)
  %c = (f32[8,16]{1,0:T(8,128)S(1)}, f32[8,16]{1,0:T(8,128)}, u32[]) copy-start(%a)
  %d = f32[8,16]{1,0:T(8,128)S(1)} copy-done(%c)
  ROOT %f = f32[64,16]{1,0:T(8,128)} fusion(%d, %b, %i), kind=kLoop, calls=%fused
}
"""
    module = hlo_text.parse(text)
    assert module.entry.name == "main"
    assert module.entry.by_name["a"].shape[0].padded_elements == 8 * 128  # 16 lanes of 128
    ops = {op.name: op for op in roofline.project(text, roofline.rates_for(V4)).ops}
    assert set(ops) == {"c", "f"}
    assert ops["c"].hbm_bytes == 8 * 128 * 4  # the prefetch reads HBM once
    # the fusion reads its operand from on-chip memory, the index from HBM, and writes 8 of
    # the 64 rows in place
    assert ops["f"].hbm_bytes == 8 * 128 * 4 + 4
    assert ops["f"].vector_ops == 8 * 128  # exp on every stored element, padding included


def test_rates_follow_the_published_peaks():
    """The figures docs/tpu.md cites: v4's VPU at 2 TensorCores x 8 x 128 lanes x 2 ALUs at
    1.05 GHz (the clock of 275 TFLOP/s over 4 MXUs of 128 x 128 x 2 FLOPs per core), v5p's with
    4 ALUs at 1.75 GHz, a v3 core's at 0.94 GHz; ICI a ring over one link both ways."""
    v4 = roofline.rates_for(V4)
    assert v4.vpu_ops == pytest.approx(4.30e12, rel=0.01)
    assert v4.mxu_flops == 275e12 and v4.hbm_bandwidth == 1.2e12 and v4.ici_bandwidth == 9e10
    v5p = roofline.rates_for(accelerators.get("v5p-8").generation)
    assert v5p.vpu_ops == pytest.approx(1.43e13, rel=0.01)
    v3 = roofline.rates_for(accelerators.get("v3-8").generation)
    assert v3.vpu_ops == pytest.approx(1.92e12, rel=0.01)


def test_splash_kernels_are_attention_with_their_matmuls_counted():
    """The fused path's kernels carry no cost estimate: their FLOPs come from the shapes."""
    from lmsuite.layers.fused_attention import fused_attention
    from lmsuite.layers.masks import MaskLayout

    def loss(q, k, v, ids):
        return fused_attention(
            q, k, v, MaskLayout(q_segment_ids_BL=ids, kv_segment_ids_BM=ids)
        ).sum()

    qkv = ((2, 128, 4, 16), jnp.float32)
    compiled = _compile_for_v4(jax.grad(loss, (0, 1, 2)), qkv, qkv, qkv, ((2, 128), jnp.int32))
    ops = roofline.project(compiled.as_text(), roofline.rates_for(V4)).ops
    kernels = [op for op in ops if op.name.startswith("splash_mha")]
    assert {op.op_class for op in kernels} == {"attention"}
    assert {op.name.split("_segmented")[0] for op in kernels} == {
        "splash_mha_fwd",
        "splash_mha_dq",
        "splash_mha_dkv",
    }
    # forward: scores and the weighted sum, 2 x B x H x L x M x K each
    forward = next(op for op in kernels if op.name.startswith("splash_mha_fwd"))
    assert forward.flops == 2 * 2 * (2 * 4 * 128 * 128 * 16)
    assert forward.vector_ops == roofline.SPLASH_VECTOR_OPS_PER_SCORE * 2 * 4 * 128 * 128
