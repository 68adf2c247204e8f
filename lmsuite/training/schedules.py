"""Learning-rate schedules used by the papers: BERT's linear warmup + linear decay (with TF's
jump at the end of warmup as an option), T5's inverse square root, warmup + cosine, constant.

Every schedule is an Optax schedule: a function of the integer step (0 for the first update).
"""

import jax.numpy as jnp
import optax

SCHEDULES = ("linear", "rsqrt", "cosine", "constant")


def linear_warmup_linear_decay(
    *,
    peak_value: float,
    warmup_steps: int,
    total_steps: int,
    end_value: float = 0.0,
    tf_bert_jump: bool = False,
) -> optax.Schedule:
    """Linear warmup from 0 to `peak_value`, then linear decay to `end_value` at `total_steps`.

    With `tf_bert_jump=True` the decay is measured from step 0 over `total_steps`, as TF BERT's
    `optimization.create_optimizer` does (`polynomial_decay` of the global step, overridden during
    warmup by `peak * step / warmup`), so the rate drops from about `peak` to
    `peak * (1 - warmup / total)` at the end of warmup.

    Example (peak 1, warmup 10, total 100):
      default:       step 0 -> 0.0, 5 -> 0.5, 10 -> 1.0, 55 -> 0.5, 100 -> 0.0
      tf_bert_jump:  step 9 -> 0.9, 10 -> 0.9, 55 -> 0.45, 100 -> 0.0
    """
    if total_steps <= 0 or warmup_steps < 0 or warmup_steps > total_steps:
        raise ValueError(
            f"need 0 <= warmup_steps <= total_steps and total_steps > 0, got "
            f"warmup_steps={warmup_steps}, total_steps={total_steps}"
        )
    warmup = optax.linear_schedule(0.0, peak_value, max(warmup_steps, 1))
    if tf_bert_jump:
        decay = optax.linear_schedule(peak_value, end_value, total_steps)

        def schedule(step):
            return jnp.where(step < warmup_steps, warmup(step), decay(step))

        return schedule
    decay = optax.linear_schedule(peak_value, end_value, max(total_steps - warmup_steps, 1))
    return optax.join_schedules([warmup, decay], [warmup_steps])


def inverse_sqrt(*, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
    """T5's schedule: `scale / sqrt(max(step, warmup_steps))`, constant during warmup.

    Example (warmup 10000): step 0 -> 0.01, 10000 -> 0.01, 40000 -> 0.005.
    """
    if warmup_steps <= 0:
        raise ValueError(f"inverse_sqrt needs warmup_steps > 0, got {warmup_steps}")

    def schedule(step):
        return scale * jnp.reciprocal(jnp.sqrt(jnp.maximum(step, warmup_steps).astype(jnp.float32)))

    return schedule


def make_schedule(
    *,
    name: str,
    peak_value: float,
    warmup_steps: int = 0,
    total_steps: int = 1,
    end_value: float = 0.0,
    tf_bert_jump: bool = False,
) -> optax.Schedule:
    """Builds one of `SCHEDULES` by name; `peak_value` is the `scale` of `rsqrt`."""
    if name == "linear":
        return linear_warmup_linear_decay(
            peak_value=peak_value,
            warmup_steps=warmup_steps,
            total_steps=total_steps,
            end_value=end_value,
            tf_bert_jump=tf_bert_jump,
        )
    if name == "rsqrt":
        return inverse_sqrt(warmup_steps=warmup_steps, scale=peak_value)
    if name == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0,
            peak_value=peak_value,
            warmup_steps=warmup_steps,
            decay_steps=total_steps,
            end_value=end_value,
        )
    if name == "constant":
        return optax.constant_schedule(peak_value)
    raise ValueError(f"schedule name must be one of {SCHEDULES}, got {name!r}")
