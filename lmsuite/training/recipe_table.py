"""What `lmsuite recipes list` and `lmsuite recipes show NAME` print.

`format_list` gives one line per recipe (name, task objectives, feature converter, loss, model
architecture and heads), then the objectives that have data but no recipe, each with why;
`format_recipe` every field of one row, its loss's declared contract (features, metrics,
heads) and the gin lines that select it.
"""

from lmsuite.training import recipes


def _converter_name(recipe: recipes.Recipe, pack: bool) -> str:
    converter = recipe.converter(pack=pack)
    return f"{type(converter).__name__}{' (packed)' if pack else ''}"


def _loss_name(recipe: recipes.Recipe) -> str:
    loss = getattr(recipe.loss, "func", recipe.loss)  # a functools.partial: its function
    return f"{loss.__module__.rsplit('.', 1)[-1]}.{loss.__name__}"


def format_list() -> str:
    """One line per recipe, then the objectives that have data but no recipe, with why."""
    rows = [("recipe", "task objectives", "feature converter", "loss", "model")]
    for recipe in recipes.RECIPES.values():
        rows.append(
            (
                recipe.name,
                ", ".join(recipe.task_objectives),
                _converter_name(recipe, recipe.pack),
                _loss_name(recipe),
                f"{'/'.join(recipe.architectures)} [{', '.join(recipe.objective.heads)}]"
                + (f" + {n} label heads" if (n := len(recipe.objective.label_heads)) else ""),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if not recipes.DATA_ONLY:
        return "\n".join(lines)
    lines.append("")
    lines.append("data only (a SeqIO task exists, no recipe trains it yet):")
    width = max(len(d.objective) for d in recipes.DATA_ONLY.values())
    for entry in recipes.DATA_ONLY.values():
        lines.append(f"  {entry.objective.ljust(width)}  {entry.reason}")
    return "\n".join(lines)


def format_recipe(recipe: recipes.Recipe) -> str:
    """Every field of one row, and the gin lines that select it."""
    converter = recipe.converter(pack=recipe.pack)
    features = sorted(recipe.model_features(pack=recipe.pack))
    options = dict(recipe.loss_options)
    objective = recipe.objective
    lines = [
        f"recipe {recipe.name}: {recipe.summary}",
        f"  task objectives:   {', '.join(recipe.task_objectives)} (tasks "
        "{corpus}_{objective}, or any task whose examples carry the task features)",
        f"  task features:     {', '.join(recipe.task_features)}",
        f"  sequence lengths:  keys {list(recipe.length_keys)}, e.g. {recipe.lengths_for(128)}",
        f"  feature converter: {type(converter).__module__}.{type(converter).__name__}"
        f"(pack={recipe.pack})",
        f"  model features:    {', '.join(features)}",
        f"  loss:              lmsuite.objectives.{_loss_name(recipe)}"
        f"({', '.join(f'{k}={v!r}' for k, v in options.items())})",
        f"  loss options:      {', '.join(recipes.loss_parameters(recipe))}",
        f"  loss reads:        {', '.join(objective.features)}",
        f"  metrics:           {', '.join(objective.metrics)}",
        f"  predictions:       {objective.prediction_name} "
        f"({', '.join(objective.prediction_features)}), against the baselines in "
        f"{', '.join(objective.learning_metrics)}",
        *[
            f"  label metric:      {metric} against the majority {label}"
            for metric, label in objective.label_metrics
        ],
        f"  model:             architecture {' or '.join(recipe.architectures)}, heads "
        f"{list(objective.heads)} (e.g. lmsuite/gin/models/{recipe.example_model}.gin"
        + (f" + {'; '.join(recipe.example_bindings)}" if recipe.example_bindings else "")
        + ")",
        f"  reference:         {recipe.reference}",
    ]
    if recipe.differences:
        lines.append(f"  differences:       {recipe.differences}")
    lines += [
        "  gin:",
        f"    RECIPE = '{recipe.name}'",
        f"    SEQUENCE_LENGTH = {recipe.lengths_for(128)}",
        "    make_recipe.pack = True/False        # optional",
        "    make_recipe.loss_options = {...}      # optional, any of the loss options above",
    ]
    return "\n".join(lines)
