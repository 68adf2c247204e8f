"""The training loop: one function, read top to bottom, in named sections.

checks -> mesh -> data (built, not yet read: the model is initialised from its row shapes) ->
model and optimizer -> restore -> input -> step -> loop (log, eval, checkpoint, preemption,
divergence) -> finish. Everything it needs comes in as keyword arguments, the recipe's converter
and loss among them; `lmsuite.cli` binds them from gin.
"""

import collections
import dataclasses
import signal
import time
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import optax
from etils import epath
from tqdm import tqdm

from lmsuite import partitioning
from lmsuite.models import ModelConfig, Transformer, memory_shapes
from lmsuite.training import checkpointing, input_pipeline, preflight, recipes, report, step
from lmsuite.training.metrics import MetricsLog
from lmsuite.training.train_state import abstract_state, create_sharded_state

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM: the run stopped early, but nothing was lost.
DIVERGED_EXIT_CODE = 3


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm became NaN/Inf; the message names the step."""


class Preempted(RuntimeError):
    """SIGTERM arrived; a checkpoint of the current step was written."""


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What a finished run reports: the step it reached, the last logged training metrics, the
    last evaluation (empty if none ran) and where its artefacts are."""

    step: int
    train_metrics: dict[str, float]
    eval_metrics: dict[str, float]
    model_dir: str
    checkpoints: list[int]


class RateWindow:
    """Steps/s and tokens/s of the training loop, for the progress bar and metrics.jsonl.

    Each rate spans the steps since the previous log, stretched back to cover at least
    `min_seconds` (but not before the first step, which includes compilation; only the first log
    reaches back to the loop's start). The host reads step k's metrics only after dispatching
    step k + 1 and logging the step before, so the moment a read returns lags the step's end by
    however long the host was busy; over a single-step window that lag can exceed the step
    itself (a log_every=1 run read 4,042 steps/s for an 80 steps/s step). Over seconds the lag
    at a span's two ends is small against the span.
    """

    def __init__(self, start: float, min_seconds: float = 2.0):
        self.min_seconds = min_seconds
        self._points = collections.deque([(start, 0, 0.0)])  # (time, steps, tokens), cumulative
        self._last_log = self._points[0]

    def add(self, now: float, tokens: float) -> None:
        _, steps, total = self._points[-1]
        self._points.append((now, steps + 1, total + tokens))

    def rates(self) -> tuple[float, float]:
        """(steps/s, tokens/s) ending at the newest point, which becomes the last log."""
        now, steps, tokens = self._points[-1]
        points = self._points
        if self._last_log[1] == 0:  # the first log: everything since the loop started
            start = self._last_log
        else:
            # Keep the newest point at least min_seconds old (or the first step's, if none is
            # that old); amortised O(1) per step, as each point is dropped once.
            while len(points) > 1 and (points[0][1] == 0 or now - points[1][0] >= self.min_seconds):
                points.popleft()
            start = min(points[0], self._last_log)  # by time: the earlier of the two
        self._last_log = points[-1]
        elapsed = max(now - start[0], 1e-9)
        return (steps - start[1]) / elapsed, (tokens - start[2]) / elapsed


def train(
    *,
    model_dir: str,
    model_config: ModelConfig,
    task: str,
    sequence_length: Mapping[str, int],
    recipe: recipes.Built | recipes.RecipeChoice,
    optimizer: optax.GradientTransformation,
    learning_rate_fn: optax.Schedule,
    batch_size: int,
    train_steps: int,
    mesh_shape: Sequence[int] = (-1, 1, 1),
    rules: partitioning.Rules = partitioning.DEFAULT_RULES,
    seed: int = 0,
    num_microbatches: int = 1,
    checkpoint_every: int = 1000,
    keep_checkpoints: int = 3,
    log_every: int = 10,
    eval_every: int = 0,
    final_eval: bool = True,
    eval_batches: int = input_pipeline.EVAL_BATCHES,
    eval_split: str = input_pipeline.EVAL_SPLIT,
    skip_nonfinite: bool = False,
    progress_bar: bool = True,
    peak_flops_per_device: float | None = None,
    input_threads: int | None = None,
    input_sharding: str = "source",
    input_nice: int | None = None,
    checkpoint_nice: int | None = None,
    checked: bool = False,
) -> RunResult:
    """Trains `model_config` on `task` with `recipe` (`recipes.make_recipe(name=...)`) until
    `train_steps`, resuming from `model_dir` if it holds checkpoints.

    `final_eval` evaluates at the last step when `eval_every` does not (the held-out figures the
    run's summary prints). `input_sharding` is `input_pipeline.process_dataset`'s: "replicated"
    makes the batches independent of the number of hosts. Before anything compiles the run is
    checked (`preflight.check_run`) unless `checked` says the caller did (`lmsuite train` lists
    those problems with gin's).

    Raises:
      ValueError: every configuration problem at once (task, recipe, vocabulary, lengths, mesh).
      NonFiniteLossError: a NaN/Inf loss without `skip_nonfinite` (the last good checkpoint is
        left untouched; nothing is saved after the bad step).
      Preempted: SIGTERM; a checkpoint of the current step was saved first.
    """
    if not checked:
        found = preflight.check_run(
            task=task,
            recipe=recipe.recipe,
            sequence_length=sequence_length,
            model_config=model_config,
            batch_size=batch_size,
            mesh_shape=mesh_shape,
            num_microbatches=num_microbatches,
            train_steps=train_steps,
        )
        preflight.raise_problems(found)
    if isinstance(recipe, recipes.RecipeChoice):
        recipe = recipes.build(recipe, model_config=model_config)
    objective, feature_converter = recipe.objective, recipe.feature_converter
    model_dir_path = epath.Path(model_dir)  # local or gs://
    model_dir_path.mkdir(parents=True, exist_ok=True)
    is_main = jax.process_index() == 0

    # ----------------------------------------------------------------------------- mesh
    data, fsdp, tensor = mesh_shape
    mesh = partitioning.make_mesh(data=data, fsdp=fsdp, tensor=tensor)

    # ------------------------------------------------------------------------------ data
    # Built first (lazily: nothing is read yet): the model is initialised from its row shapes.
    train_data = input_pipeline.process_dataset(
        task=task,
        sequence_length=sequence_length,
        feature_converter=feature_converter,
        global_batch_size=batch_size,
        split="train",
        seed=seed,
        input_threads=input_threads,
        input_sharding=input_sharding,
        rows_task=recipe.recipe.rows_task,
    )
    example = report.example_inputs(train_data.element_spec)

    # --------------------------------------------------------------- model and optimizer
    model = Transformer(model_config)

    # A carried state (XLNet's memory) holds one row per batch row: the global batch.
    carry_shapes = None if objective.carry is None else memory_shapes(model_config, batch_size)

    def init_params(rng):
        inputs = objective.model_inputs(example)
        return model.init({"params": rng}, **inputs)["params"]

    state, state_shardings, logical_specs = create_sharded_state(
        init_params=init_params,
        tx=optimizer,
        mesh=mesh,
        rng=jax.random.PRNGKey(seed),
        rules=rules,
        carry_shapes=carry_shapes,
    )
    if is_main:
        report.write_model_info(
            model_dir_path / "model-info.txt", state.params, logical_specs, state_shardings.params
        )

    # --------------------------------------------------------------------------- restore
    if checkpoint_nice is None:
        checkpoint_nice = checkpointing.default_checkpoint_nice()
    ckpt = checkpointing.Checkpointer(
        directory=model_dir_path / "checkpoints", keep=keep_checkpoints, nice=checkpoint_nice
    )
    shapes = jax.eval_shape(lambda s: s, state)
    restored = ckpt.restore_latest(abstract_state(state_shardings, shapes))
    batches_consumed = 0
    if restored is not None:
        state, position = restored
        batches_consumed = position["batches_consumed"]
    start_step = int(state.step)
    log = MetricsLog(model_dir=model_dir_path, resume_step=start_step)

    # ------------------------------------------------------------------------ input
    batch_shapes = {
        k: jax.ShapeDtypeStruct((batch_size,) + v.shape[1:], v.dtype) for k, v in example.items()
    }
    batch_sharding = step.batch_shardings(batch_shapes, mesh, rules=rules)
    if batches_consumed:  # a resumed run sees the batches it would have seen
        train_data = train_data.skip(batches_consumed)
    batches = input_pipeline.Prefetcher(
        train_data,
        batch_sharding,
        nice=input_pipeline.default_input_nice() if input_nice is None else input_nice,
    )

    # ------------------------------------------------------------------------------ step
    train_step = step.jit_train_step(
        apply_fn=model.apply,
        objective=objective,
        learning_rate_fn=learning_rate_fn,
        state_shardings=state_shardings,
        batch_sharding=batch_sharding,
        mesh=mesh,
        rules=rules,
        num_microbatches=num_microbatches,
        skip_nonfinite=skip_nonfinite,
    )
    eval_step = step.jit_eval_step(
        apply_fn=model.apply,
        objective=objective,
        state_shardings=state_shardings,
        batch_sharding=batch_sharding,
        mesh=mesh,
        rules=rules,
    )
    dropout_rng = jax.random.PRNGKey(seed + 1)
    initial_carry = jax.jit(
        lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), carry_shapes),
        out_shardings=state_shardings.carry,
    )

    def evaluate() -> dict[str, float]:
        eval_data = input_pipeline.eval_dataset(
            task=task,
            sequence_length=sequence_length,
            feature_converter=feature_converter,
            global_batch_size=batch_size,
            split=eval_split,
            batches=eval_batches,
            input_sharding=input_sharding,
            rows_task=recipe.recipe.rows_task,
        )
        totals: dict[str, float] = {}
        count = 0
        carry = initial_carry()  # held-out rows carry their own memory, from zeros
        for local in eval_data.as_numpy_iterator():
            batch = input_pipeline.to_global(local, batch_sharding)
            metrics, carry = eval_step(state, batch, carry)
            for k, v in jax.device_get(metrics).items():
                totals[k] = totals.get(k, 0.0) + float(v)
            count += 1
        return {f"eval/{k}": v / max(count, 1) for k, v in totals.items()}

    # -------------------------------------------------------------------- preemption
    preempted = {"flag": False}
    previous_handler = signal.signal(signal.SIGTERM, lambda *_: preempted.__setitem__("flag", True))

    def save(at_step: int) -> None:
        ckpt.save(at_step, state, {"batches_consumed": at_step})

    # ------------------------------------------------------------------------------ loop
    flops_per_step = None
    if peak_flops_per_device is None:  # resolved now: on CPU it is measured, not while a step runs
        peak_flops_per_device = report.device_peak_flops()
    last_eval: dict[str, float] = {}
    last_logged: dict[str, float] = {}
    bar = tqdm(
        total=train_steps, initial=start_step, disable=not (progress_bar and is_main), unit="step"
    )
    rates = RateWindow(time.perf_counter())

    def report_step(done: int, metrics: dict) -> None:
        """Reads one step's metrics: stops on NaN/Inf, logs every `log_every` steps."""
        host = jax.device_get(metrics)
        rates.add(time.perf_counter(), float(host["num_tokens"]))
        if host["nonfinite"] and not skip_nonfinite:
            committed = ckpt.committed_steps()
            where = (
                f"The last good checkpoint is step {max(committed)} in {ckpt.directory}"
                if committed
                else f"No checkpoint had been written yet (none in {ckpt.directory})"
            )
            raise NonFiniteLossError(
                f"loss is {float(host['loss'])} (grad_norm {float(host['grad_norm'])}) at "
                f"step {done}; stopping without saving. {where}"
            )
        bar.update(1)
        if done % log_every and done != train_steps:
            return
        steps_per_sec, tokens_per_sec = rates.rates()
        scalars = {k: v for k, v in host.items() if k != "nonfinite"}
        scalars["tokens_per_sec"] = tokens_per_sec
        scalars["steps_per_sec"] = steps_per_sec
        scalars["input_wait_sec"] = batches.wait_seconds
        mfu = report.mfu(
            flops_per_step=flops_per_step,
            steps_per_sec=steps_per_sec,
            peak_flops_per_device=peak_flops_per_device,
        )
        if mfu is not None:
            scalars["mfu"] = mfu
        log.write(done, scalars)
        last_logged.clear()
        last_logged.update({k: float(v) for k, v in scalars.items()})
        bar.set_postfix(
            loss=f"{float(host['loss']):.4f}",
            tok_s=f"{scalars['tokens_per_sec']:.0f}",
            mfu="n/a" if mfu is None else f"{100 * mfu:.1f}%",
        )

    try:
        pending = None  # (step, metrics) not yet read back
        for current in range(start_step, train_steps):
            batch = next(batches)
            if flops_per_step is None:
                flops_per_step = report.lowered_flops(
                    train_step.lower(state, batch, dropout_rng), loop_trips=num_microbatches
                ) or report.train_flops(state.params, batch, objective)
            state, metrics = train_step(state, batch, dropout_rng)
            done = current + 1
            # Read the previous step's metrics while this one runs, so the device never waits
            # for the host; a NaN is caught at most one step late, before anything is saved.
            if pending is not None:
                report_step(*pending)
            pending = (done, metrics)
            stop = preempted["flag"]
            do_eval = (bool(eval_every) or final_eval) and (
                (eval_every and done % eval_every == 0) or done == train_steps
            )
            do_save = done % checkpoint_every == 0 or done == train_steps or stop
            if do_eval or do_save:
                report_step(*pending)
                pending = None
            if do_eval:
                last_eval = evaluate()
                log.write(done, last_eval)
            if do_save:
                save(done)
            if stop:
                ckpt.commit()
                raise Preempted(f"SIGTERM at step {done}; saved checkpoint step {done}")
        ckpt.commit()
        result = RunResult(
            step=max(start_step, train_steps),
            train_metrics=dict(last_logged),
            eval_metrics=dict(last_eval),
            model_dir=str(model_dir_path),
            checkpoints=ckpt.committed_steps(),
        )
    finally:
        # ------------------------------------------------------------------------ finish
        signal.signal(signal.SIGTERM, previous_handler)
        bar.close()
        batches.close()
        ckpt.close()
        log.close()
    return result
