"""The training loop: one short function in named sections, lm1b's `train_and_evaluate`.

checks and records -> mesh -> data (built, not yet read: the model is initialised from its row
shapes) -> model and optimizer -> restore -> input -> step -> loop (log, eval, checkpoint,
preemption, divergence) -> finish. Everything comes from one `TrainConfig`
(`lmsuite.training.train_config`); `lmsuite.train` is this function.
"""

import dataclasses
import functools
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from etils import epath

from lmsuite import partitioning
from lmsuite.models import Transformer, memory_shapes
from lmsuite.training import (
    checkpointing,
    input_pipeline,
    lease,
    report,
    resume_checks,
    step,
)
from lmsuite.training.checkpointing import CheckpointWriteError
from lmsuite.training.lease import LeaseHeldError
from lmsuite.training.metrics import MetricsLog
from lmsuite.training.progress import NonFiniteLossError, RateWindow, StepLog
from lmsuite.training.train_config import TrainConfig
from lmsuite.training.train_state import abstract_state, create_sharded_state

__all__ = [
    "CheckpointWriteError",
    "LeaseHeldError",
    "NonFiniteLossError",
    "Preempted",
    "RateWindow",
    "RunResult",
    "train",
]

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM: the run stopped early, but nothing was lost.
DIVERGED_EXIT_CODE = 3
RUN_FILE = "run.json"  # = lmsuite.evaluation.run_config.RUN_FILE (training cannot import it)
GIN_FILE = "config.gin"
CHECKPOINT_DIR = "checkpoints"  # = lmsuite.evaluation.load.CHECKPOINTS


class Preempted(RuntimeError):
    """SIGTERM arrived; a checkpoint of the current step was saved."""


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What a finished run reports: the step it reached, the last logged training metrics, the
    last evaluation (empty if none ran) and where its artefacts are."""

    step: int
    train_metrics: dict[str, float]
    eval_metrics: dict[str, float]
    model_dir: str
    checkpoints: list[int]


def train(config: TrainConfig) -> RunResult:
    """Trains `config` until `trainer.train_steps`, resuming from its model directory if that
    holds checkpoints; writes run.json (and config.gin, for a config built by gin) there first,
    after checking that a run already there is this one (`resume_checks`).

    Raises:
      InvalidRunError: every configuration problem at once (`TrainConfig.validate`), or a
        model directory that holds another run (`resume_checks`; nothing in it is written).
      NonFiniteLossError: a NaN/Inf loss without `trainer.skip_nonfinite` (the last good
        checkpoint is left untouched; nothing is saved after the bad step).
      Preempted: SIGTERM; a checkpoint of the current step was saved first.
      LeaseHeldError: another live `train` holds the run directory (`lease`).
      CheckpointWriteError: a save failed (a full disk); the committed steps are intact.
    """
    # --------------------------------------------------------------- checks and records
    if not isinstance(config, TrainConfig):
        raise TypeError(
            f"lmsuite.train takes a TrainConfig (built in Python or by lmsuite.run_from_gin), "
            f"got {type(config).__name__}"
        )
    config.validate()
    model_dir = checkpointing.absolute(config.checkpointing.model_dir)
    # One writer per run directory; taken before anything in it is written.
    writer = _take_lease(model_dir)
    try:
        return _train(config, model_dir, writer)
    finally:
        if writer is not None:
            writer.release()


def _take_lease(model_dir: epath.Path) -> lease.Lease | None:
    """Process 0's lease on `model_dir` (None on the other processes of a pod)."""
    if jax.process_index() != 0:
        return None
    model_dir.mkdir(parents=True, exist_ok=True)
    return lease.Lease(model_dir)


def _train(config: TrainConfig, model_dir: epath.Path, writer: lease.Lease | None) -> RunResult:
    """`train` once the run directory is this process's."""
    data, trainer = config.data, config.trainer
    _, data_plan = write_records(config)
    built = config.built()

    # ----------------------------------------------------------------------------- mesh
    data_axis, fsdp, tensor = trainer.mesh_shape
    mesh = partitioning.make_mesh(data=data_axis, fsdp=fsdp, tensor=tensor)

    # ----------------------------------------------------------------------------- data
    # Built first (lazily: nothing is read yet): the model is initialised from its row shapes.
    train_data = data.train_dataset(built, seed=trainer.seed)
    example = report.example_inputs(train_data.element_spec)

    # -------------------------------------------------------------- model and optimizer
    model = Transformer(config.model)
    tx, learning_rate_fn = config.optimizer.build(train_steps=trainer.train_steps)
    # A carried state (XLNet's memory) holds one row per batch row: the global batch.
    carry_shapes = None
    if built.objective.carry is not None:
        carry_shapes = memory_shapes(config.model, data.batch_size)
    state, state_shardings = _initial_state(
        config, model, built, tx, mesh, example, carry_shapes, model_dir
    )

    # -------------------------------------------------------------------------- restore
    nice = config.checkpointing.nice
    ckpt = checkpointing.Checkpointer(
        directory=model_dir / CHECKPOINT_DIR,
        keep=config.checkpointing.keep,
        nice=checkpointing.default_checkpoint_nice() if nice is None else nice,
    )
    state, batches_consumed = _restore(ckpt, state, state_shardings)
    batches_consumed = resume_checks.data_position(data_plan, batches_consumed)
    start_step = int(state.step)
    log = MetricsLog(model_dir=model_dir, resume_step=start_step)
    if start_step:
        committed = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ckpt.commit_time(start_step)))
        _say(
            f"resumed from step {start_step} (committed {committed}, data position "
            f"{batches_consumed} batches of {data.batch_size})"
        )

    # ---------------------------------------------------------------------------- input
    batch_shapes = {
        k: jax.ShapeDtypeStruct((data.batch_size,) + v.shape[1:], v.dtype)
        for k, v in example.items()
    }
    batch_sharding = step.batch_shardings(batch_shapes, mesh, rules=trainer.rules)
    if batches_consumed:  # a resumed run sees the batches it would have seen
        train_data = data.train_dataset(built, seed=trainer.seed, skip_batches=batches_consumed)
    input_nice = input_pipeline.default_input_nice() if data.input_nice is None else data.input_nice
    batches = input_pipeline.Prefetcher(train_data, batch_sharding, nice=input_nice)

    # ----------------------------------------------------------------------------- step
    shardings = dict(state_shardings=state_shardings, batch_sharding=batch_sharding, mesh=mesh)
    train_step = step.jit_train_step(
        apply_fn=model.apply,
        objective=built.objective,
        learning_rate_fn=learning_rate_fn,
        rules=trainer.rules,
        num_microbatches=trainer.num_microbatches,
        skip_nonfinite=trainer.skip_nonfinite,
        **shardings,
    )
    eval_step = step.jit_eval_step(
        apply_fn=model.apply, objective=built.objective, rules=trainer.rules, **shardings
    )
    dropout_rng = step.dropout_key(trainer.seed + 1, trainer.prng_impl)
    evaluate = _evaluator(data, built, eval_step, batch_sharding, carry_shapes, state_shardings)
    batch_specs = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding[k])
        for k, v in batch_shapes.items()
    }

    # ----------------------------------------------------------------------------- loop
    report_step = StepLog(
        trainer, log=log, checkpointer=ckpt, input_wait=lambda: batches.wait_seconds,
        start_step=start_step,
    )  # fmt: skip
    last_eval: dict[str, float] = {}
    # data position (batches read) -> the 1-based stage that begins there (metrics.jsonl's
    # "data/stage", logged at the step after which it begins: the position is the step unless
    # a resume restarted or rescaled the data)
    stage_starts = {stage.start: i + 1 for i, stage in enumerate(data.stages)}
    if batches_consumed == 0 and data.stages:
        log.write(start_step, {"data/stage": 1})
    preempted = _PreemptionNotice()
    try:
        if start_step < trainer.train_steps:
            # Compiled while the input pipeline reads its first batch rather than after it;
            # the jit's first call finds the executable.
            lowered = train_step.lower(state, batch_specs, dropout_rng)
            compiled = _compile_in_background(lowered)
        pending = None  # (step, metrics) not yet read back
        for current in range(start_step, trainer.train_steps):
            batch = next(batches)
            if report_step.flops_per_step is None:
                compiled()  # raises the compile's error, if any
                report_step.flops_per_step = report.lowered_flops(
                    lowered, loop_trips=trainer.num_microbatches
                ) or report.train_flops(state.params, batch, built.objective)
            state, metrics = train_step(state, batch, dropout_rng)
            done = current + 1
            # the batches read: the step, unless a resume restarted or rescaled the data
            position = batches_consumed + done - start_step
            # Read the previous step's metrics while this one runs, so the device never waits
            # for the host; a NaN is caught at most one step late, before anything is saved.
            if pending is not None:
                report_step(*pending)
            pending = (done, metrics)
            stop = preempted(done)
            do_eval, do_save = _due(config, done, stop)
            if do_eval or do_save:
                report_step(*pending)
                pending = None
            if do_eval:
                last_eval = evaluate(state)
                log.write(done, last_eval)
            if do_save:
                ckpt.save(done, state, {"batches_consumed": position})
                if writer is not None:
                    writer.renew()
            if position in stage_starts:  # a continual schedule's next stage begins
                log.write(done, {"data/stage": stage_starts[position]})
            if stop:
                ckpt.commit()
                raise Preempted(f"SIGTERM at step {done}; saved checkpoint step {done}")
        ckpt.commit()
        result = RunResult(
            step=max(start_step, trainer.train_steps),
            train_metrics=dict(report_step.last_logged),
            eval_metrics=dict(last_eval),
            model_dir=str(model_dir),
            checkpoints=ckpt.committed_steps(),
        )
    finally:
        # --------------------------------------------------------------------------- finish
        preempted.close()
        report_step.close()
        batches.close()
        ckpt.close()
        log.close()
    return result


class _PreemptionNotice:
    """`notice(step)` is True once the run must save `step` and stop (SIGTERM).

    One process: a SIGTERM handler sets a flag. Several: JAX's preemption service (started by
    `jax.distributed.initialize`) catches SIGTERM on any process and agrees on one step for all,
    the step after the largest any of them has reached (`reached_preemption_sync_point`), so
    every process saves the same step and none waits alone in a collective. Orbax's
    `PreemptionCheckpointingPolicy` asks the same service.
    """

    def __init__(self):
        self._flag = False
        self._previous = None
        if jax.process_count() == 1:
            self._previous = signal.signal(signal.SIGTERM, self._set)

    def _set(self, *_) -> None:
        self._flag = True

    def __call__(self, step: int) -> bool:
        if jax.process_count() == 1:
            return self._flag
        from jax.experimental import multihost_utils

        return multihost_utils.reached_preemption_sync_point(step)

    def close(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def _say(line: str) -> None:
    if jax.process_index() == 0:
        print(f"lmsuite: {line}", file=sys.stderr, flush=True)


def write_records(config: TrainConfig) -> tuple[epath.Path, resume_checks.DataPlan]:
    """Creates the run directory (local or gs://) and writes run.json, what `lmsuite.load`
    rebuilds the model from without gin, and config.gin when gin built the config; returns
    (the directory, how a resume's data position follows the run's).

    A run.json already there is compared first (`resume_checks.check_resume`): for another
    run, InvalidRunError, and both files are left as they were.
    """
    model_dir = checkpointing.absolute(config.checkpointing.model_dir)
    record = config.run_record()
    run_file = model_dir / RUN_FILE
    data_plan = resume_checks.check_resume(
        run_file,
        record,
        data_change=config.data.data_change,
        # the stages the run has read must not change (`resume_checks.schedule_problem`)
        batches_consumed=(
            checkpointing.newest_data_position(model_dir / CHECKPOINT_DIR)
            if run_file.exists()
            else 0
        ),
    )
    model_dir.mkdir(parents=True, exist_ok=True)
    if config.operative_config is not None:
        _write_whole(model_dir / GIN_FILE, config.operative_config)
    _write_whole(model_dir / RUN_FILE, json.dumps(record, indent=1) + "\n")
    return model_dir, data_plan


def _write_whole(path: epath.Path, text: str) -> None:
    """Writes `path` by renaming a finished temporary file: each process of a pod reads run.json
    (the resume check) while another may be writing it, and must never read half of it."""
    tmp = path.with_name(f"{path.name}.tmp-{jax.process_index()}")
    tmp.write_text(text)
    tmp.replace(path)


def _initial_state(config, model, built, tx, mesh, example, carry_shapes, model_dir):
    """(the sharded initial train state, its shardings); model-info.txt describes it."""

    def init_params(rng):
        return model.init({"params": rng}, **built.objective.model_inputs(example))["params"]

    state, state_shardings, logical_specs = create_sharded_state(
        init_params=init_params,
        tx=tx,
        mesh=mesh,
        rng=jax.random.PRNGKey(config.trainer.seed),
        rules=config.trainer.rules,
        carry_shapes=carry_shapes,
    )
    if jax.process_index() == 0:
        report.write_model_info(
            model_dir / "model-info.txt", state.params, logical_specs, state_shardings.params
        )
    return state, state_shardings


def _restore(ckpt: checkpointing.Checkpointer, state, state_shardings):
    """(the newest committed state, the batches it had consumed), or (`state`, 0) if none."""
    restored = ckpt.restore_latest(
        abstract_state(state_shardings, jax.eval_shape(lambda s: s, state))
    )
    if restored is None:
        return state, 0
    state, position = restored
    return state, position["batches_consumed"]


def _compile_in_background(lowered) -> Callable[[], Any]:
    """Starts `lowered.compile()` on a daemon thread; returns a function that waits for it and
    returns the executable or raises the compile's error.

    XLA compiles without the GIL, so the input pipeline's threads read on meanwhile. A daemon
    thread, because a run stopped by a data error must not wait for the compile to exit.
    """
    result: dict[str, Any] = {}

    def run():
        try:
            result["compiled"] = lowered.compile()
        except BaseException as error:  # handed to the caller
            result["error"] = error

    thread = threading.Thread(target=run, name="compile", daemon=True)
    thread.start()

    def wait():
        thread.join()
        if "error" in result:
            raise result["error"]
        return result["compiled"]

    return wait


def _evaluator(data, built, eval_step, batch_sharding, carry_shapes, state_shardings):
    """evaluate(state) -> each metric over all the held-out batches together, as "eval/NAME"
    (`step.held_out_metrics`).

    The held-out pipeline is built at the first evaluation and its batches kept in host memory
    (`eval_batches` of this process's rows) for the later ones: they are the same batches every
    time (read in order with a fixed seed), and rebuilding and reading a mixture's pipeline, as
    the ERNIE 2.0 recipe's, costs far more than a small model's evaluation step.
    """
    initial_carry = jax.jit(
        lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), carry_shapes),
        out_shardings=state_shardings.carry,
    )
    held_out_batches = functools.cache(lambda: data.eval_dataset(built).cache())

    def evaluate(state) -> dict[str, float]:
        def parts():
            carry = initial_carry()  # held-out rows carry their own memory, from zeros
            for local in held_out_batches().as_numpy_iterator():
                batch = input_pipeline.to_global(local, batch_sharding)
                batch_parts, carry = eval_step(state, batch, carry)
                yield batch_parts

        held_out = step.held_out_metrics(built.objective, parts())
        return {f"eval/{k}": v for k, v in held_out.items()}

    return evaluate


def _due(config: TrainConfig, done: int, stop: bool) -> tuple[bool, bool]:
    """(evaluate, save) after step `done`: every `eval_every` / `checkpoint.every` steps, at
    the last step (evaluation: if `final_eval` or `eval_every`), and saving on preemption."""
    trainer, last = config.trainer, done == config.trainer.train_steps
    every = trainer.eval_every
    do_eval = (bool(every) or trainer.final_eval) and ((every and done % every == 0) or last)
    do_save = done % config.checkpointing.every == 0 or last or stop
    return bool(do_eval), do_save
