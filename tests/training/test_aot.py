"""`lmsuite compile`: the real train step compiled for TPU slices on this CPU host (libtpu's
compile-only devices), its per-device argument bytes equal to the state's and batch's shards
summed independently from their shardings, and bad input stopped before anything compiles."""

import functools
import json

import jax
import numpy as np
import pytest

from lmsuite import cli
from lmsuite.training import accelerators, aot, mesh_search, train_state

TINY = ["t5_1_1_tiny", "bart_tiny", "xlnet_tiny"]  # XLNet: its memory is part of the state


def _arguments(experiment: str, topology: str, *bindings: str) -> dict:
    args = cli.parse_args(
        ["compile", f"--gin_file=experiments/{experiment}.gin", f"--topology={topology}",
         *bindings]
    )  # fmt: skip
    return cli.load_config(
        args, need_data=False, devices=accelerators.get(topology).num_devices
    )  # fmt: skip


@functools.cache
def _data_parallel_step(experiment: str, topology: str) -> tuple[dict, aot.CompileReport]:
    """(the compile arguments, the compiled step) of `experiment`'s data-parallel step, compiled
    once per worker: a TPU compile takes 10-20 s here and two tests read T5 1.1's."""
    kwargs = _arguments(experiment, topology)
    return kwargs, aot.compile_train_step(accelerator=topology, **kwargs)


def _shard_bytes(shapes, shardings, layouts=None) -> int:
    """Bytes of one device's shard of every array, from each sharding's own shard shape; with
    `layouts` (the compiled step's input layouts), padded as the TPU stores it: the shard's
    dimensions in the layout's physical order, the minor ones rounded up to the first tile
    (a scalar or a (2,) key is held in a 128-element tile, a (32,) bias likewise). Arguments
    the compiled step does not read (a T5 1.1 run's dropout key, position features) have no
    layout and are not counted, as XLA does not count them."""
    leaves, specs = jax.tree.leaves(shapes), jax.tree.leaves(shardings)
    total = 0
    for i, (leaf, sharding) in enumerate(zip(leaves, specs, strict=True)):
        shape = list(sharding.shard_shape(leaf.shape))
        if layouts is not None:
            layout = layouts[i].layout
            if layout is None:  # an argument the step never reads: XLA drops it
                continue
            shape = [shape[d] for d in reversed(layout.major_to_minor)][::-1] if shape else [1]
            tile = layout.tiling[0] if layout.tiling else ()
            shape = [1] * max(0, len(tile) - len(shape)) + shape
            for j, t in enumerate(tile, start=len(shape) - len(tile)):
                shape[j] = -(-shape[j] // t) * t
        total += int(np.prod(shape)) * np.dtype(leaf.dtype).itemsize
    return total


def _expected_argument_bytes(kwargs, topology, mesh_shape, compiled=None) -> tuple[int, int]:
    """(the shards' bytes as laid out on the device, their bytes unpadded)."""
    from lmsuite import partitioning
    from lmsuite.models import Transformer, memory_shapes
    from lmsuite.training import step

    devices = aot.slice_devices(topology)
    data, fsdp, tensor = mesh_shape
    mesh = partitioning.make_mesh(data=data, fsdp=fsdp, tensor=tensor, devices=devices)
    recipe = kwargs["recipe"]
    batch, _ = aot.abstract_batch(
        task=kwargs["task"],
        sequence_length=kwargs["sequence_length"],
        recipe=recipe,
        batch_size=kwargs["batch_size"],
    )
    model = Transformer(kwargs["model_config"])
    example = {k: np.zeros((1,) + v.shape[1:], v.dtype) for k, v in batch.items()}
    inputs = recipe.objective.model_inputs(example)
    state, shardings, _ = train_state.sharded_abstract_state(
        init_params=lambda rng: model.init({"params": rng}, **inputs)["params"],
        tx=kwargs["optimizer"],
        mesh=mesh,
        rng=jax.random.PRNGKey(0),
        carry_shapes=None
        if recipe.objective.carry is None
        else memory_shapes(kwargs["model_config"], kwargs["batch_size"]),
    )
    batch_shardings = step.batch_shardings(batch, mesh, rules=partitioning.DEFAULT_RULES)
    rng = jax.ShapeDtypeStruct((2,), np.uint32)  # the dropout key, replicated
    arrays = (state, batch, rng)
    arrays_shardings = (shardings, batch_shardings, shardings.step)
    layouts = jax.tree.leaves(compiled.input_formats, is_leaf=lambda x: hasattr(x, "layout"))
    assert len(layouts) == len(jax.tree.leaves(arrays))
    return (
        _shard_bytes(arrays, arrays_shardings, layouts),
        _shard_bytes(arrays, arrays_shardings),
    )


@pytest.mark.parametrize(
    "topology, experiment",
    [
        # BART in test-all only: T5 1.1 is the encoder-decoder of the fast suite
        *(
            pytest.param("v4-8", n, marks=pytest.mark.slow) if n == "bart_tiny" else ("v4-8", n)
            for n in TINY
        ),
        # v3's two cores per chip and its tiling: one model in the fast suite, all in test-all
        *(pytest.param("v3-8", n, marks=pytest.mark.slow) for n in TINY if n != "xlnet_tiny"),
        ("v3-8", "xlnet_tiny"),
    ],
)
def test_argument_bytes_are_the_shards_of_state_and_batch(topology, experiment):
    kwargs, found = _data_parallel_step(experiment, topology)
    assert found.num_devices == accelerators.get(topology).num_devices
    padded, unpadded = _expected_argument_bytes(kwargs, topology, (-1, 1, 1), found.compiled)
    assert found.argument_bytes == padded
    assert unpadded <= padded < 1.3 * unpadded  # tiles pad small arrays (biases, scalars)
    assert found.alias_bytes > 0  # the state is donated: its outputs reuse its buffers
    assert found.fits and found.total_bytes >= found.argument_bytes
    assert found.flops > 0 and found.bytes_accessed > 0
    assert 0 < found.mfu <= 1
    assert found.step_seconds == max(found.compute_seconds, found.memory_seconds)


def test_a_mixture_run_compiles_the_step_it_trains():
    """ERNIE 2.0's four-task mixture: the compiled step is the per-task one, and its batch has
    the task ids and every head's labels, as training's batches do (compiling a mixture once
    raised a KeyError for a label the first task lacks, then lacked the task ids)."""
    kwargs = _arguments("ernie2_tiny", "v4-8")
    recipe = kwargs["recipe"]
    assert len(recipe.tasks) == 4 and recipe.task_ids_along == ("masked_ids",)
    batch, source = aot.abstract_batch(
        task=kwargs["task"], sequence_length=kwargs["sequence_length"], recipe=recipe,
        batch_size=kwargs["batch_size"],
    )  # fmt: skip
    assert source == "wiki_sample_ernie2_mixture"
    assert {"task_ids", *(name for name, _ in recipe.objective.label_heads)} <= set(batch)
    found = aot.compile_train_step(accelerator="v4-8", **kwargs)
    assert found.fits and found.flops > 0


def test_fsdp_shards_the_state_across_devices():
    kwargs, data = _data_parallel_step("t5_1_1_tiny", "v4-8")
    fsdp = aot.compile_train_step(accelerator="v4-8", **dict(kwargs, mesh_shape=(1, 4, 1)))
    padded, _ = _expected_argument_bytes(kwargs, "v4-8", (1, 4, 1), fsdp.compiled)
    assert fsdp.argument_bytes == padded
    # Replicated the state is on every device; fully sharded most of it is split four ways.
    assert fsdp.argument_bytes < 0.5 * data.argument_bytes


def test_slices_have_the_devices_libtpu_describes():
    slices = [("v3-8", 4, 8), ("v3-32", 16, 32), ("v4-8", 4, 4), ("v4-32", 16, 16),
              ("v5p-8", 4, 4), ("v5litepod-16", 16, 16)]  # fmt: skip
    for name, chips, devices in slices:
        slice_ = accelerators.get(name)
        assert (slice_.num_chips, slice_.num_devices) == (chips, devices)
        assert len(aot.slice_devices(name)) == devices
        assert aot.slice_devices(name)[0].device_kind == slice_.generation.device_kind


def test_candidate_meshes_divide_the_batch_and_the_heads():
    config = _arguments("smoke", "v4-8")["model_config"]  # 2 heads
    meshes = mesh_search.candidate_meshes(16, batch_size=8, model_config=config)
    assert meshes[0] == (8, 1, 2)  # data parallel as far as the batch allows, then tensor
    for data, fsdp, tensor in meshes:
        assert data * fsdp * tensor == 16
        assert 8 % (data * fsdp) == 0 and config.num_heads % tensor == 0
    assert (16, 1, 1) not in meshes  # batch 8 cannot split 16 ways


# slow: the fast suite keeps the compile CLI's table and serialized executable
@pytest.mark.slow
def test_compile_cli_auto_lists_fitting_meshes_first(capsys):
    code = cli.main(["compile", "--gin_file=experiments/smoke.gin", "--topology=v4-8",
                     "--mesh=auto", "--json"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    rows = json.loads(out)
    assert rows and all(r["fits"] for r in rows)
    config = _arguments("smoke", "v4-8")["model_config"]
    expected = mesh_search.candidate_meshes(4, batch_size=8, model_config=config)
    assert {tuple(r["mesh_shape"]) for r in rows} == set(expected)
    steps = [r["step_seconds"] for r in rows]
    assert steps == sorted(steps)


def test_compile_cli_table_and_serialized_executable(capsys, tmp_path):
    code = cli.main(["compile", "--gin_file=experiments/smoke.gin", "--topology=v4-8",
                     f"--model_dir={tmp_path}"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "fits" in captured.out and "whole-step roofline" in captured.out
    assert "per-op ms" in captured.out and "per-op time by class" in captured.out
    assert "matmul" in captured.out
    written = list((tmp_path / "compiled").glob("train_step_v4-8_4x1x1.xla"))
    assert len(written) == 1 and written[0].stat().st_size > 1000


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--topology=v4-7"], "unknown TPU accelerator 'v4-7': v4 slices are v4-8, v4-16"),
        (["--topology=v9-8"], "known: v3-8, v3-32"),
        (["--topology=v4-8", "--mesh=3,1,1"], "v4-8: mesh data=3 x fsdp=1 x tensor=1 needs 3"),
        (["--topology=v4-8", "--mesh=1,2"], "expected three comma-separated sizes"),
        (["--topology=v4-32", "--gin.BATCH_SIZE=12"], "batch_size 12 is not divisible by"),
    ],
)
def test_bad_input_is_refused_before_compiling(argv, expected, capsys, monkeypatch):
    compiled = []
    monkeypatch.setattr(aot, "lower_step", lambda **kw: compiled.append(kw))
    code = cli.main(["compile", "--gin_file=experiments/smoke.gin", *argv])
    err = capsys.readouterr().err
    assert code == cli.CONFIG_ERROR_EXIT_CODE, err[-2000:]
    assert expected in err
    assert not compiled


HUGE_BATCH = "--gin.BATCH_SIZE=262144"  # the smoke model's activations need ~40 GiB per v4 chip


def test_a_step_that_does_not_fit_says_by_how_much_and_what_may(capsys):
    code = cli.main(["compile", "--gin_file=experiments/smoke.gin", "--topology=v4-8",
                     HUGE_BATCH, "--json"])  # fmt: skip
    assert code == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert not row["fits"] and "RESOURCE_EXHAUSTED" in row["out_of_memory"]
    # XLA keeps part of the chip's 32 GiB for itself.
    assert 28 * 2**30 < row["usable_hbm_bytes"] < row["hbm_bytes"] == 32 * 2**30
    assert row["over_bytes"] == row["argument_bytes"] + row["temp_bytes"] - row["usable_hbm_bytes"]
    assert row["over_bytes"] > 0 and row["step_seconds"] is None
    assert row["suggested_microbatches"] in (2, 4)


@pytest.mark.slow  # compiles the step with the suggested microbatches: about two minutes
def test_the_suggested_microbatches_fit():
    kwargs = _arguments("smoke", "v4-8", HUGE_BATCH)
    refused = aot.compile_train_step(accelerator="v4-8", **kwargs)
    k = mesh_search.suggest_microbatches(refused, kwargs["batch_size"])
    found = aot.compile_train_step(accelerator="v4-8", **dict(kwargs, num_microbatches=k))
    assert found.fits and found.temp_bytes < refused.temp_bytes / (k / 2)


def test_suggested_microbatches_divide_among_the_devices():
    gib = 2**30
    refused = aot.CompileReport(
        accelerator="v4-8", topology="v4:2x2x1", mesh_shape=(1, 4, 1), num_devices=4,
        hbm_bytes=32 * gib, argument_bytes=2 * gib, output_bytes=0, alias_bytes=0,
        temp_bytes=90 * gib, code_bytes=0, total_bytes=92 * gib, flops=None,
        bytes_accessed=None, step_flops=None, compute_seconds=None, memory_seconds=None,
        step_seconds=None, mfu=None, tokens_per_step=0, shapes_task="t", compile_seconds=0.0,
        out_of_memory="RESOURCE_EXHAUSTED", usable_hbm_bytes=30 * gib,
    )  # fmt: skip
    # 90 GiB of temporaries in the 28 GiB beside the arguments: 4 microbatches (3.2 rounded up).
    assert mesh_search.suggest_microbatches(refused, 256) == 4
    assert mesh_search.suggest_microbatches(refused, 8004) is None  # 2,001 rows do not split 4 ways
    assert refused.over_bytes == 62 * gib and not refused.fits


def test_microbatched_steps_count_every_microbatch():
    """XLA counts the accumulation loop's body once; the report counts all of its trips."""
    kwargs = _arguments("smoke", "v4-8", "--gin.BATCH_SIZE=16")  # 4 microbatches of 4 rows
    whole = aot.compile_train_step(accelerator="v4-8", **kwargs)
    split = aot.compile_train_step(accelerator="v4-8", **dict(kwargs, num_microbatches=4))
    assert split.step_flops == whole.step_flops  # the unpartitioned step, counted without a loop
    # Per device: the loop's four trips (and, scaled with them, the optimizer update) against
    # one pass over the whole batch.
    assert 0.95 < split.flops / whole.flops < 1.3


@pytest.mark.parametrize("experiment", ["bert_tiny", "bart_tiny"])
def test_fused_attention_compiles_to_the_splash_kernel(experiment):
    """attention_impl="fused" lowered for a TPU slice from this CPU host runs Pallas' splash
    kernel (Mosaic custom calls), forward and both backward passes, in every attention:
    bidirectional, causal and cross (BART: 128 encoder and 128 decoder positions)."""
    pytest.importorskip("libtpu")
    kwargs = _arguments(experiment, "v4-8", "--gin.ModelConfig.attention_impl='fused'")
    config = kwargs["model_config"]
    assert config.attention_impl == "fused"
    found = aot.compile_train_step(accelerator="v4-8", **kwargs)
    hlo = found.compiled.as_text()
    assert "tpu_custom_call" in hlo
    attentions = config.num_layers
    if config.architecture == "encoder_decoder":
        attentions += 2 * config.decoder_layers  # self- and cross-attention
    for kernel in ("splash_mha_fwd", "splash_mha_dq", "splash_mha_dkv"):
        calls = [line for line in hlo.splitlines() if kernel in line and "custom-call(" in line]
        assert len(calls) == attentions, (kernel, calls)
    assert found.fits and found.flops > 0


def test_scanned_layers_count_every_layer():
    """XLA counts the scan over layers once (ModelConfig.scan_layers); the report counts every
    layer, as the unscanned step does."""
    kwargs = _arguments("smoke", "v4-8", "--gin.ModelConfig.num_layers=4")
    whole = aot.compile_train_step(accelerator="v4-8", **kwargs)
    scanned_config = kwargs["model_config"].replace(scan_layers=True)
    scanned = aot.compile_train_step(
        accelerator="v4-8", **dict(kwargs, model_config=scanned_config)
    )
    assert scanned.step_flops == whole.step_flops
    # Per device an estimate (the unpartitioned programs' ratio scales the compiled counts); the
    # loop's body counted once would give about 0.5 here.
    assert 0.75 < scanned.flops / whole.flops < 1.25
    # Bytes are not under-counted; XLA's count of the scan's stacked buffers over-counts them
    # (about 2x here and for BERT-base, docs/tpu.md), so the projection errs on the slow side.
    assert 0.75 < scanned.bytes_accessed / whole.bytes_accessed < 2.5
