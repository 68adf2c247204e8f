"""The run config's optimizer group: an optimizer and its learning-rate schedule.

`OptimizerConfig.build` makes the optax transformation and the schedule the step logs; gin
binds these groups as `make_optimizer.*` and `make_schedule.*` (`lmsuite.cli.config`), the names
of the functions they call. Each checks its own values when made.
"""

import dataclasses

import optax

from lmsuite.training import optimizers, schedules
from lmsuite.training.config_group import Group, finite_rate, is_count, positive_int


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScheduleConfig(Group):
    """A learning-rate schedule (`schedules.make_schedule`); `total_steps=None` means the run's
    `trainer.train_steps`. Its settings are checked when it is made."""

    name: str = "linear"
    peak_value: float
    warmup_steps: int = 0
    total_steps: int | None = None
    end_value: float = 0.0
    tf_bert_jump: bool = False

    def __post_init__(self):
        if self.name not in schedules.SCHEDULES:
            raise ValueError(
                f"schedule name must be one of {schedules.SCHEDULES}, got {self.name!r}"
            )
        problems = self.problems()
        if problems:  # made with a bad value: nothing downstream should see it
            raise ValueError("; ".join(problems))
        if is_count(self.total_steps):  # (not an integer: TrainConfig.check names it once)
            self.build(train_steps=self.total_steps)  # the schedule's own checks

    def problems(self) -> list[str]:
        """Its values: a finite positive peak rate (LEARNING_RATE), whole warmup steps."""
        out: list[str] = []
        finite_rate(
            out, "the learning rate (make_schedule.peak_value, LEARNING_RATE)", self.peak_value
        )
        finite_rate(out, "make_schedule.end_value", self.end_value, zero=True)
        positive_int(out, "make_schedule.warmup_steps (WARMUP_STEPS)", self.warmup_steps, zero=True)
        return out

    def build(self, *, train_steps: int) -> optax.Schedule:
        total = train_steps if self.total_steps is None else self.total_steps
        return schedules.make_schedule(
            name=self.name,
            peak_value=self.peak_value,
            warmup_steps=self.warmup_steps,
            total_steps=total,
            end_value=self.end_value,
            tf_bert_jump=self.tf_bert_jump,
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig(Group):
    """An optimizer (`optimizers.make_optimizer`'s settings): a constant `learning_rate` or a
    `ScheduleConfig`, which is also the rate the step logs."""

    name: str = "adamw"
    learning_rate: ScheduleConfig | float
    clip_norm: float | None = 1.0
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-6
    bias_correction: bool | None = None

    def __post_init__(self):
        if self.name not in optimizers.OPTIMIZERS:
            raise ValueError(
                f"optimizer name must be one of {optimizers.OPTIMIZERS}, got {self.name!r}"
            )
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise ValueError(f"clip_norm must be positive or None, got {self.clip_norm}")
        problems: list[str] = []
        if not isinstance(self.learning_rate, ScheduleConfig):  # (a schedule checks its own)
            # a negative rate would train by gradient ascent
            finite_rate(
                problems, "optimizer.learning_rate (or a ScheduleConfig)", self.learning_rate
            )
        finite_rate(
            problems, "make_optimizer.weight_decay (WEIGHT_DECAY)", self.weight_decay, zero=True
        )
        finite_rate(problems, "make_optimizer.eps", self.eps, zero=True)
        if problems:
            raise ValueError("; ".join(problems))

    def build(self, *, train_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
        """(the optimizer, its learning-rate schedule)."""
        rate = self.learning_rate
        if isinstance(rate, ScheduleConfig):
            rate = schedule = rate.build(train_steps=train_steps)
        else:
            schedule = optax.constant_schedule(rate)
        tx = optimizers.make_optimizer(
            name=self.name,
            learning_rate=rate,
            clip_norm=self.clip_norm,
            weight_decay=self.weight_decay,
            b1=self.b1,
            b2=self.b2,
            eps=self.eps,
            bias_correction=self.bias_correction,
        )
        return tx, schedule
