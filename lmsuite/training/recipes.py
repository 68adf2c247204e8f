"""Recipes: the one place where a task, its feature converter, its loss and the model meet.

A row is the pairing: the task objectives it accepts (`lmsuite.data.tasks.OBJECTIVES`, or any
task whose examples carry the row's task features), the sequence-length keys, the feature
converter, the loss with this row's options, and the model families that can train it. What the
loss reads and reports (features, heads, metrics) it declares itself (`Recipe.objective`,
`lmsuite.objectives.Objective`); `tests/training/test_objective_contracts.py` holds each row's
converter and model to that declaration. Gin picks a row by name (`RECIPE =
't5_span_corruption'`, `train.recipe = @make_recipe()` in `runs/pretrain.gin`), `lmsuite train`
checks the run against it before anything compiles (`preflight`), and
`tests/training/test_recipes.py` trains every row for two steps through the CLI. Objectives that
have data but no trainable recipe yet are listed in `DATA_ONLY`, each with the reason, so nothing
is data-only without the table saying so.

The rows live with their family, where they share converters, lengths and defaults:
`encoder_recipes` (masked LM and the tasks trained beside it), `seq2seq_recipes` (encoder-decoder
denoising and prefix LM) and `decoder_recipes` (one-stack LMs, XLNet and Transformer-XL). This
module is the table they form and the choosing: `get`, `make_recipe` (what gin calls) and
`build`.

  >>> choice = make_recipe(name="t5_span_corruption")
  >>> built = build(choice, model_config=config)       # after `preflight.check_run` passed
  >>> built.feature_converter, built.objective          # EncDecFeatureConverter(pack=True), seq2seq
"""

import dataclasses
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import seqio

from lmsuite.data import feature_converters as fc
from lmsuite.did_you_mean import nearest
from lmsuite.models import ModelConfig
from lmsuite.objectives import Objective, per_task
from lmsuite.training import decoder_recipes, encoder_recipes, seq2seq_recipes
from lmsuite.training.recipe_types import DataOnly, Recipe

# The table, in the order `lmsuite recipes list` prints it (docs/objectives.md shows that list).
# A new row joins it here as well as in its family's module (a test checks that none is left out).
RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in [
        encoder_recipes.BERT_MLM,
        encoder_recipes.BERT_MLM_NSP,
        encoder_recipes.ALBERT_SOP,
        decoder_recipes.CAUSAL_LM,
        decoder_recipes.DECODER_PREFIX_LM,
        seq2seq_recipes.T5_SPAN_CORRUPTION,
        seq2seq_recipes.IID_DENOISING,
        seq2seq_recipes.PREFIX_LM,
        seq2seq_recipes.BART_DENOISING,
        seq2seq_recipes.MASS,
        decoder_recipes.XLNET_PLM,
        encoder_recipes.SPANBERT,
        encoder_recipes.ELECTRA,
        encoder_recipes.UNILM,
        encoder_recipes.MLM_MULTITASK,
        encoder_recipes.ERNIE2,
        encoder_recipes.STRUCTBERT,
        decoder_recipes.TXL_LM,
        encoder_recipes.UNILM2,
        seq2seq_recipes.UL2,
    ]
}

# A new objective's data may land here first, with the converter that carries its features.
DATA_ONLY: dict[str, DataOnly] = {}


# ------------------------------------------------------------------------------- choosing
@dataclasses.dataclass(frozen=True)
class RecipeChoice:
    """What gin chose: a row, its packing and loss options (see `make_recipe`)."""

    recipe: Recipe
    pack: bool
    loss_options: Mapping[str, Any]
    task_weights: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """What run.json records of the choice beside the row's name, so that `lmsuite eval`
        scores with the run's own loss (`choice_from_json`). An option that gin set to a value
        JSON cannot hold (a configurable reference) is kept by name and repr under
        "unrecorded": the evaluation says it used the row's default for it."""
        recorded, unrecorded = {}, {}
        for key, value in self.loss_options.items():
            try:
                json.dumps(value)
                recorded[key] = value
            except (TypeError, ValueError):
                unrecorded[key] = repr(value)
        record = {
            "pack": self.pack,
            "loss_options": recorded,
            "task_weights": {k: float(v) for k, v in self.task_weights.items()},
        }
        if unrecorded:
            record["unrecorded"] = unrecorded
        return record


def _tuples(value: Any) -> Any:
    """JSON's lists back to the tuples gin gave (options are hashed and compared as tuples)."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def choice_from_json(name: str, record: Mapping[str, Any] | None) -> RecipeChoice:
    """The `RecipeChoice` a run recorded (`RecipeChoice.to_json`); None (a run.json written
    before the record) is the row with its defaults.

    Raises:
      ValueError: an option this version's row no longer takes (`make_recipe`'s message).
    """
    if record is None:
        return make_recipe(name=name)
    return make_recipe(
        name=name,
        pack=record.get("pack"),
        loss_options=_tuples(dict(record.get("loss_options", {}))),
        task_weights=dict(record.get("task_weights", {})),
    )


@dataclasses.dataclass(frozen=True)
class Built:
    """A recipe made concrete for one model and one task or mixture: the converter and the
    loss the run uses. For a mixture, `tasks` are its task names (task ids 1, 2, ...) and
    `task_ids_along` the features its task ids run along (None: a task, or a row that cannot
    carry them); its loss then reports per-task metrics (`lmsuite.objectives.per_task`)."""

    recipe: Recipe
    feature_converter: seqio.FeatureConverter
    objective: Objective
    pack: bool
    tasks: tuple[str, ...] = ()
    task_ids_along: tuple[str, ...] | None = None


def get(name: str) -> Recipe:
    """The row called `name`; a ValueError names the rows (and the closest one)."""
    if name not in RECIPES:
        pending = f" ({name!r} is data-only: {DATA_ONLY[name].reason})" if name in DATA_ONLY else ""
        raise ValueError(
            f"unknown recipe {name!r}{nearest(name, RECIPES)}{pending}; the recipes are "
            f"{sorted(RECIPES)}"
        )
    return RECIPES[name]


def loss_parameters(recipe: Recipe) -> list[str]:
    """The options its loss factory takes (what `loss_options` may set)."""
    return [p for p in inspect.signature(recipe.loss).parameters if p != "name"]


def make_recipe(
    *,
    name: str,
    pack: bool | None = None,
    loss_options: Mapping[str, Any] | None = None,
    task_weights: Mapping[str, float] | None = None,
) -> RecipeChoice:
    """Selects the row `name`; `pack` overrides its default packing; `loss_options` its loss's
    keyword options (e.g. {'z_loss': 0.0, 'label_smoothing': 0.1}); `task_weights` ({task:
    weight}, 1 for a task not named) weigh a mixture's tasks in the loss
    (`lmsuite.objectives.per_task`).

    Raises:
      ValueError: an unknown row or loss option (naming the valid ones), or packing a row whose
        converter cannot pack.
    """
    recipe = get(name)
    options = dict(loss_options or {})
    valid = loss_parameters(recipe)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"recipe {name!r}: loss option(s) {unknown} are not options of its loss "
            f"{getattr(recipe.loss, 'func', recipe.loss).__module__}."
            f"{getattr(recipe.loss, 'func', recipe.loss).__name__}; expected some of {valid}"
        )
    pack = recipe.pack if pack is None else bool(pack)
    if pack and not recipe.can_pack():
        raise ValueError(
            f"recipe {name!r} cannot pack (its sentence-level labels are one per row); "
            "set make_recipe.pack = False"
        )
    if task_weights and not recipe.task_ids_along:
        raise ValueError(
            f"recipe {name!r} cannot weigh a mixture's tasks: its feature converter does not "
            "carry task ids; drop make_recipe.task_weights"
        )
    return RecipeChoice(
        recipe=recipe,
        pack=pack,
        loss_options={**recipe.loss_options, **options},
        task_weights=dict(task_weights or {}),
    )


def loss_call(
    choice: RecipeChoice, *, model_config: ModelConfig
) -> tuple[Callable[..., Objective], dict[str, Any]]:
    """(the loss constructor of `choice`, its keyword arguments for `model_config`): `build`'s
    objective is `loss(**options)`. Both pickle by reference into `lmsuite.objectives`, which
    needs no TensorFlow, so a host without the data stack can rebuild the objective
    (benchmarks/accelerator_step.py on an accelerator image)."""
    options = dict(choice.loss_options)
    if choice.recipe.token_types == "optional" and model_config.type_vocab_size < 2:
        options["token_type_ids"] = None  # the model has no second segment type to read
    return choice.recipe.loss, options


def build(choice: RecipeChoice, *, model_config: ModelConfig, tasks: Sequence[str] = ()) -> Built:
    """The converter and loss of `choice` for `model_config` (token types only where the model
    has a type table); with the `tasks` of a mixture (`mixtures.task_names`), per-task metrics
    where the row can carry task ids."""
    recipe = choice.recipe
    loss, options = loss_call(choice, model_config=model_config)
    objective = loss(**options)
    if choice.task_weights and not tasks:
        raise ValueError(
            f"make_recipe.task_weights = {dict(choice.task_weights)} weigh a mixture's tasks, but "
            "the run's task is not a mixture"
        )
    if not (tasks and recipe.task_ids_along):
        return Built(
            recipe=recipe,
            feature_converter=recipe.converter(pack=choice.pack),
            objective=objective,
            pack=choice.pack,
        )
    return Built(
        recipe=recipe,
        feature_converter=fc.with_task_ids(recipe.converter(pack=choice.pack)),
        objective=per_task.per_task(objective, tasks, weights=choice.task_weights),
        pack=choice.pack,
        tasks=tuple(tasks),
        task_ids_along=recipe.task_ids_along,
    )
