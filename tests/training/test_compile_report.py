"""The figures a compile report takes from XLA's refusal message and memory analysis."""

import types

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lmsuite.training import compile_report

GIB = 2**30
COMMON = dict(
    accelerator="v4-8", topology="v4:2x2x1", mesh_shape=(1, 4, 1), num_devices=4,
    hbm_bytes=32 * GIB, tokens_per_step=1024, shapes_task="t",
)  # fmt: skip


def _arguments():
    mesh = Mesh(np.array(jax.devices()[:4]), ("fsdp",))
    split = NamedSharding(mesh, PartitionSpec("fsdp"))
    whole = NamedSharding(mesh, PartitionSpec())
    return {
        "kernel": jax.ShapeDtypeStruct((1024, 512), jnp.float32, sharding=split),  # 512 KiB
        "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=whole),  # 4 bytes on every device
    }


def test_a_refusal_reports_xla_figures_and_the_argument_shards():
    message = (
        "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory "
        "space hbm.\n\nTotal hbm usage >= 41.50G:\n    reserved        530.00M\n"
        "    program          40.02G\n  The 40.02G required for HLO temporaries (40.02G) "
        "exceeds available HBM (30.75G).\n"
    )
    found = compile_report.refused_for_hbm(message, _arguments(), COMMON, 3e12, 1.5)
    arguments = 1024 * 512 * 4 // 4 + 4
    assert found.argument_bytes == arguments
    assert found.temp_bytes == int(40.02 * GIB) and found.usable_hbm_bytes == int(30.75 * GIB)
    assert found.total_bytes == arguments + int(40.02 * GIB)
    assert found.out_of_memory == message.splitlines()[0]
    assert not found.fits
    assert found.over_bytes == found.total_bytes - int(30.75 * GIB)  # the usable HBM, not 32 GiB
    assert found.step_flops == 3e12 and found.step_seconds is None and found.mfu is None


def test_a_refusal_without_figures_counts_the_arguments_only():
    found = compile_report.refused_for_hbm(
        "RESOURCE_EXHAUSTED: out of memory", _arguments(), COMMON, None, 0.1
    )
    assert found.temp_bytes == 0 and found.usable_hbm_bytes is None
    assert found.total_bytes == found.argument_bytes and found.step_flops is None
    assert not found.fits  # XLA refused it, whatever the bytes
    assert found.over_bytes == 0  # the arguments alone are far below the 32 GiB


def test_device_bytes_take_the_peak_where_xla_reports_one():
    memory = types.SimpleNamespace(
        argument_size_in_bytes=100, output_size_in_bytes=40, alias_size_in_bytes=30,
        temp_size_in_bytes=50, generated_code_size_in_bytes=7, peak_memory_in_bytes=0,
    )  # fmt: skip
    assert compile_report.device_bytes(memory) == 100 + 40 - 30 + 50 + 7  # no peak: the sum
    assert compile_report.device_bytes(types.SimpleNamespace(**{
        **vars(memory), "peak_memory_in_bytes": 500,
    })) == 507  # fmt: skip
    del memory.peak_memory_in_bytes  # an older jaxlib's analysis
    assert compile_report.device_bytes(memory) == 167
