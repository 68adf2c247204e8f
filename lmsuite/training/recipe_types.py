"""The row types of the recipe table (`recipes.py`): `Recipe`, one trainable objective, and
`DataOnly`, an objective whose data exists but that nothing trains yet."""

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import seqio

from lmsuite.models import ModelConfig
from lmsuite.objectives import Objective


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recipe:
    """One trainable objective: the pairing of a task, a feature converter, a loss and a model.

    What the loss reads and reports (features, heads, metrics, predictions) is the loss's own
    declaration (`lmsuite.objectives.Objective`), read through `objective`; the row holds the
    pairing and the facts of the pairing.

    Attributes:
      name: what `RECIPE` selects.
      summary: one line for `lmsuite recipes list`.
      task_objectives: task objectives (`lmsuite.data.tasks.OBJECTIVES`) this row trains.
      length_keys: the sequence-length keys the task and converter need.
      lengths_for: L -> a complete sequence_length for inputs of length L (tests, benchmarks).
      task_features: features the task's examples must carry (before the converter).
      converter: (pack) -> the feature converter; `pack` is the default packing.
      loss: the loss factory (`lmsuite.objectives`); `loss_options` its options for this row.
      architectures: the model families that can train it (`lmsuite.models.families`).
      token_types: "none" (the loss feeds no token types), "optional" (fed only to models with
        type_vocab_size >= 2; RoBERTa's one type and DeBERTa's none read the rows without them)
        or "pairs" (two segments: type_vocab_size >= 2).
      example_model: a compatible `lmsuite/gin/models/*_tiny.gin` (+ bindings) for tests and docs.
      check_lengths: optional sequence_length -> problems specific to this row.
      check_model: optional (model config, sequence_length or None) -> problems of the model
        with this row beyond its architecture and heads.
      rows_task: for tasks whose examples are interleaved rows of streams, (task, rows) -> the
        task laid out for batches of `rows` rows, read in order
        (`input_pipeline.process_dataset`); None for every row whose examples stand alone.
      task_ids_along: the task features a mixture's per-token task ids run along (their
        lengths summed), so that the loss reports its metrics per task
        (`lmsuite.data.mixtures`, `lmsuite.objectives.per_task`); () where the converter
        cannot carry them (a mixture then trains without per-task metrics).
      reference: the paper code this row follows; `differences` what lmsuite does otherwise.
    """

    name: str
    summary: str
    task_objectives: tuple[str, ...]
    length_keys: tuple[str, ...]
    lengths_for: Callable[[int], dict[str, int]]
    task_features: tuple[str, ...]
    converter: Callable[..., seqio.FeatureConverter]
    pack: bool
    loss: Callable[..., Objective]
    loss_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    architectures: tuple[str, ...]
    token_types: str = "none"
    example_model: str
    example_bindings: tuple[str, ...] = ()
    check_lengths: Callable[[Mapping[str, int]], list[str]] | None = None
    check_model: Callable[[ModelConfig, Mapping[str, int] | None], list[str]] | None = None
    rows_task: Callable[[str, int], str] | None = None
    task_ids_along: tuple[str, ...] = ()
    reference: str = ""
    differences: str = ""

    @functools.cached_property
    def objective(self) -> Objective:
        """The loss with this row's options: its declared features, heads and metrics are what
        the row's converter and model must provide (a run's own options: `recipes.build`)."""
        return self.loss(**self.loss_options)

    def model_features(self, *, pack: bool) -> set[str]:
        """The features its converter emits (packing features included when `pack`)."""
        converter = self.converter(pack=pack)
        names = set(converter.MODEL_FEATURES)
        if pack:
            names |= set(getattr(converter, "PACKING_FEATURE_DTYPES", None) or {})
        return names

    def can_pack(self) -> bool:
        try:
            self.converter(pack=True)
        except ValueError:
            return False
        return True


@dataclasses.dataclass(frozen=True)
class DataOnly:
    """A task objective whose data exists but that no recipe trains yet, and why."""

    objective: str
    reason: str
    converter: Callable[..., seqio.FeatureConverter]
    lengths_for: Callable[[int], dict[str, int]]
