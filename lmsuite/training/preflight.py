"""Checks of a run that need its evaluated values, made before anything compiles.

`check_run` returns every problem at once (the task, its data, its vocabulary against the model,
the recipe, the batch against the mesh, the lengths against the position table) plus warnings
that do not stop a run. `TrainConfig.validate` raises on them (once per run config); `lmsuite
train` lists them together with gin's typos.
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import seqio

from lmsuite.data import mixtures
from lmsuite.did_you_mean import nearest
from lmsuite.models import ModelConfig, families
from lmsuite.models.inputs import position_limit
from lmsuite.training import recipes


@dataclasses.dataclass
class Findings:
    """What `check_run` found: problems stop the run, warnings are printed and it goes on."""

    problems: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)


def _vocab_size(vocabulary) -> int:
    """The number of ids, without training or loading a lazy corpus vocabulary."""
    from lmsuite.data import vocab as vocab_lib

    if isinstance(vocabulary, vocab_lib.CorpusVocabulary):
        return vocabulary.size + vocabulary.extra_ids
    return int(vocabulary.vocab_size)


def tfds_data_dir() -> str:
    """The directory SeqIO reads TFDS data from (`--tfds_data_dir`, $TFDS_DATA_DIR or TFDS's
    default)."""
    import tensorflow_datasets as tfds

    override = seqio.utils._TFDS_DATA_DIR_OVERRIDE
    return override or tfds.core.constants.get_default_data_dir()


def unprepared_tfds(corpus_name: str) -> str | None:
    """For a TFDS corpus whose data is not prepared: how to prepare it; otherwise None."""
    import tensorflow_datasets as tfds

    from lmsuite.data import corpora

    corpus = corpora.get_corpus(corpus_name)
    if not isinstance(corpus, corpora.TfdsCorpus):
        return None
    data_dir = tfds_data_dir()
    builder = tfds.builder(corpus.tfds_name, data_dir=data_dir)
    if builder.is_prepared():
        return None
    return (
        f"corpus {corpus_name!r} reads TFDS dataset {corpus.tfds_name!r}, which is not prepared "
        f"in the data dir {data_dir!r} (nothing at {builder.data_dir}). Prepare it once with "
        f"`tfds build {corpus.tfds_name} --data_dir={data_dir}` (see the README, 'Production "
        "corpora'), or point --tfds_data_dir (or $TFDS_DATA_DIR) at a directory or gs:// bucket "
        "that holds it"
    )


def _sub_tasks(provider) -> list[seqio.Task]:
    if isinstance(provider, seqio.Mixture):
        return list(provider.tasks)
    return [provider]


def _task_features(task: seqio.Task, sequence_length) -> tuple[dict | None, str | None]:
    """(the features of the task's examples, or None; a problem building them, or None)."""
    try:
        spec = mixtures.example_spec(task, sequence_length)
    except Exception as error:  # the task's own preprocessors decide what fails; report it
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return None, f"task {task.name!r} could not be built: {type(error).__name__}: {first}"
    return spec, None


def check_run(
    *,
    task: str | None,
    recipe: recipes.Recipe | None,
    sequence_length: Mapping[str, int] | None,
    model_config: ModelConfig | None,
    batch_size: int | None = None,
    mesh_shape: Sequence[int] = (-1, 1, 1),
    num_microbatches: int = 1,
    train_steps: int | None = None,
    devices: int | None = None,
    need_data: bool = True,
) -> Findings:
    """Every problem of a run's evaluated configuration (see the module docstring).

    Arguments that are None (not evaluated: a typo elsewhere, an unset macro) skip the checks
    that need them. `devices` is the mesh's device count (default: this process's view);
    `need_data=False` (`lmsuite compile`, which reads no examples) makes an unprepared TFDS
    corpus a warning.
    """
    from lmsuite.data import tasks as tasks_lib
    from lmsuite.data import text_files

    found = Findings()
    problems = found.problems
    if not isinstance(sequence_length, Mapping) or not all(
        isinstance(n, int) and n >= 1 for n in sequence_length.values()
    ):
        sequence_length = None  # malformed: `DataConfig.problems` names it; no check needs it
    lengths = dict(sequence_length or {})

    provider = None
    if task is not None:
        names = seqio.TaskRegistry.names() | seqio.MixtureRegistry.names()
        if task not in names:
            problems.append(f"unknown task {task!r}{nearest(task, names)}")
        else:
            provider = seqio.get_mixture_or_task(task)

    if provider is not None:
        unprepared: set[str] = set()  # a corpus is named once, however many tasks read it
        for sub in _sub_tasks(provider):
            corpus, objective = tasks_lib.PRETRAINING_TASKS.get(sub.name, (None, None))
            if sub.name in text_files.TEXT_TASKS:  # the user's files: no TFDS data to check
                objective = text_files.TEXT_TASKS[sub.name].objective
            if model_config is not None:
                _vocabulary_checks(found, sub, corpus, model_config)
            if corpus is not None:
                how = unprepared_tfds(corpus)
                if how is not None and corpus not in unprepared:
                    unprepared.add(corpus)
                    (problems if need_data else found.warnings).append(f"task {sub.name!r}: {how}")
                if how is not None and need_data:
                    continue
            if recipe is not None:
                features = None
                foreign = objective is None or objective not in recipe.task_objectives
                if foreign and sequence_length is not None:
                    features, problem = _task_features(sub, lengths)
                    if problem is not None:
                        problems.append(problem)
                        continue
                task_problems = recipe_task_problems(
                    recipe, task_name=sub.name, task_objective=objective, task_features=features
                )
                problems.extend(task_problems)
                if objective is not None and foreign and not task_problems:
                    found.warnings.extend(_untrained_features(recipe, sub.name, objective))
    if recipe is not None:
        problems.extend(
            recipe_run_problems(recipe, sequence_length=sequence_length, model_config=model_config)
        )

    if train_steps is not None and (
        isinstance(train_steps, bool) or not isinstance(train_steps, int)
    ):
        problems.append(f"train_steps must be an integer >= 1, got {train_steps!r}")
    elif train_steps is not None and train_steps < 1:
        problems.append(f"train_steps must be >= 1, got {train_steps}")
    batch_checks(problems, batch_size, mesh_shape, num_microbatches, devices)
    mesh_checks(problems, mesh_shape, devices)
    limit = None if model_config is None else position_limit(model_config)
    if limit is not None:  # relative positions (T5, DeBERTa, XLNet) take any length
        for feature in ("input_ids", "targets", "inputs"):
            if feature in lengths and lengths[feature] > limit:
                problems.append(
                    f"sequence_length[{feature!r}] = {lengths[feature]} is longer than the "
                    f"position table: {limit} positions (ModelConfig max_length = "
                    f"{model_config.max_length}, position_offset = {model_config.position_offset})"
                )
    return found


def _vocabulary_checks(found: Findings, task: seqio.Task, corpus, config: ModelConfig) -> None:
    from lmsuite.data import corpora, text_files
    from lmsuite.data import tasks as tasks_lib

    sizes = {name: _vocab_size(f.vocabulary) for name, f in task.output_features.items()}
    if not sizes:
        return
    size = max(sizes.values())
    if config.vocab_size < size:
        found.problems.append(
            f"ModelConfig.vocab_size = {config.vocab_size} is smaller than the vocabulary of task "
            f"{task.name!r} ({size} ids); set --gin.ModelConfig.vocab_size={size}, or train on a "
            f"task whose vocabulary has at most {config.vocab_size} ids"
        )
    elif (
        corpus is not None
        and isinstance(corpora.get_corpus(corpus), corpora.TfdsCorpus)
        and config.vocab_size != size
    ):
        default = tasks_lib.default_vocabulary(corpus)
        found.warnings.append(
            f"task {task.name!r} tokenizes with the default production vocabulary "
            f"({default.corpus}, {size} ids), but ModelConfig.vocab_size = {config.vocab_size}: "
            f"ids {size}..{config.vocab_size - 1} are never seen. Register the task with your "
            "vocabulary (lmsuite.data.tasks.build_task(corpus, objective, vocab=...)) in a "
            "--task_module, or set ModelConfig.vocab_size"
        )
    elif task.name in text_files.TEXT_TASKS and config.vocab_size != size:
        # The user chose this vocabulary for their text: ids it never produces are a mistake.
        found.problems.append(
            f"ModelConfig.vocab_size = {config.vocab_size}, but task {task.name!r} tokenizes with "
            f"{text_files.TEXT_TASKS[task.name].vocabulary or 'the default vocabulary'} "
            f"({size} ids): ids {size}..{config.vocab_size - 1} would never be seen; set "
            f"--gin.ModelConfig.vocab_size={size}"
        )


def mesh_checks(problems, mesh_shape, devices=None) -> None:
    """Adds a problem when the (data, fsdp, tensor) mesh does not fit `devices` (default: this
    run's); a malformed mesh is named by `TrainerConfig.problems`."""
    import jax

    if not isinstance(mesh_shape, list | tuple) or len(mesh_shape) != 3:
        return
    if not all(isinstance(n, int) and (n == -1 or n >= 1) for n in mesh_shape):
        return
    devices = jax.device_count() if devices is None else devices
    fixed = math.prod(n for n in mesh_shape if n != -1)
    if -1 in mesh_shape and devices % fixed:
        problems.append(
            f"mesh_shape {tuple(mesh_shape)}: the sizes other than -1 multiply to {fixed}, "
            f"which does not divide the {devices} devices"
        )
    elif -1 not in mesh_shape and fixed != devices:
        problems.append(
            f"mesh_shape {tuple(mesh_shape)} needs {fixed} devices, but there are {devices} "
            "(one size may be -1: it takes the devices the others leave)"
        )


def batch_checks(problems, batch_size, mesh_shape, num_microbatches, devices=None) -> None:
    """Adds the batch's divisibility problems on a mesh of `devices` (default: this run's)."""
    import jax

    sizes_ok = isinstance(mesh_shape, list | tuple) and len(mesh_shape) == 3
    sizes_ok = sizes_ok and all(isinstance(n, int) for n in mesh_shape)
    if batch_size is None or not sizes_ok or not all(n == -1 or n >= 1 for n in mesh_shape):
        return  # (a malformed mesh or batch is named by the run config's own checks)
    if not isinstance(batch_size, int) or not isinstance(num_microbatches, int):
        return
    data, fsdp, tensor = mesh_shape
    devices = jax.device_count() if devices is None else devices
    if data == -1 and devices % max(fsdp * tensor, 1) == 0:
        data = devices // (fsdp * tensor)
    if data > 0 and batch_size % (data * fsdp):
        problems.append(
            f"batch_size {batch_size} is not divisible by the batch axes data*fsdp = "
            f"{data}*{fsdp} = {data * fsdp} (mesh_shape {tuple(mesh_shape)})"
        )
    if num_microbatches and batch_size % num_microbatches:
        problems.append(
            f"batch_size {batch_size} is not divisible by num_microbatches {num_microbatches}"
        )
    elif num_microbatches > 1 and data > 0 and (batch_size // num_microbatches) % (data * fsdp):
        problems.append(
            f"a microbatch of batch_size {batch_size} / num_microbatches {num_microbatches} = "
            f"{batch_size // num_microbatches} rows is not divisible by the batch axes "
            f"data*fsdp = {data * fsdp}"
        )


def recipe_task_problems(
    recipe: recipes.Recipe,
    *,
    task_name: str,
    task_objective: str | None,
    task_features: Mapping[str, Any] | None,
) -> list[str]:
    """Mismatches between one task and the recipe, each naming the recipe and what it expects.

    `task_objective` is the lmsuite objective the task was built for (None for a user's task);
    `task_features` the features of its examples (None if not known).
    """
    where = f"recipe {recipe.name!r}"
    missing = [f for f in recipe.task_features if f not in (task_features or recipe.task_features)]
    # A task of another objective trains where its examples carry the row's features (a
    # mixture's prefix-LM task under span corruption's row); its name decides only when its
    # features are not known.
    foreign = task_objective is not None and task_objective not in recipe.task_objectives
    if foreign and (task_features is None or missing):
        fitting = sorted(
            n for n, r in recipes.RECIPES.items() if task_objective in r.task_objectives
        )
        if fitting:
            hint = f"; recipe(s) {fitting} train it"
        elif task_objective in recipes.DATA_ONLY:
            hint = f"; no recipe trains it yet: it {recipes.DATA_ONLY[task_objective].reason}"
        else:
            hint = ""
        lacks = f"; its examples lack the row's task features {missing}" if missing else ""
        return [
            f"{where} trains tasks of objective(s) {list(recipe.task_objectives)}, but task "
            f"{task_name!r} is a {task_objective!r} task{hint}{lacks}"
        ]
    if missing:
        return [
            f"{where} needs task features {missing}, which task {task_name!r} does not "
            f"emit (its examples have {sorted(task_features)})"
        ]
    return []


def _untrained_features(recipe: recipes.Recipe, task_name: str, objective: str) -> list[str]:
    """A warning when `recipe` trains a task of another objective whose own rows read features
    this row ignores (an ALBERT SOP task under `bert_mlm` trains no sentence order)."""
    own = [r for r in recipes.RECIPES.values() if objective in r.task_objectives]
    unread = sorted({f for r in own for f in r.task_features} - set(recipe.task_features))
    if not unread:
        return []
    return [
        f"task {task_name!r} is a {objective!r} task; recipe {recipe.name!r} trains it through "
        f"its features {list(recipe.task_features)} and ignores {unread}, which recipe(s) "
        f"{sorted(r.name for r in own)} train"
    ]


def recipe_run_problems(
    recipe: recipes.Recipe,
    *,
    sequence_length: Mapping[str, int] | None,
    model_config: ModelConfig | None,
) -> list[str]:
    """Mismatches of the sequence lengths and the model with the recipe (None skips a check)."""
    where = f"recipe {recipe.name!r}"
    out = []
    if sequence_length is not None:
        lengths = dict(sequence_length)
        missing = [k for k in recipe.length_keys if k not in lengths]
        extra = sorted(set(lengths) - set(recipe.length_keys))
        if missing or extra:
            out.append(
                f"{where} needs sequence_length keys {list(recipe.length_keys)}, got "
                f"{sorted(lengths)}"
                + (f": missing {missing}" if missing else "")
                + (f", unexpected {extra}" if extra else "")
                + f" (e.g. SEQUENCE_LENGTH = {recipe.lengths_for(128)})"
            )
        elif recipe.check_lengths is not None:
            out.extend(f"{where}: {p}" for p in recipe.check_lengths(lengths))
    if model_config is not None:
        if not families.accepts(model_config, recipe.architectures):
            out.append(
                f"{where} needs ModelConfig.architecture in {list(recipe.architectures)}, got "
                f"{families.architecture_name(model_config)!r}"
            )
        heads = recipe.objective.heads  # what its loss reads
        missing_heads = [h for h in heads if h not in model_config.heads]
        if missing_heads:
            out.append(
                f"{where} needs model heads {list(heads)}; ModelConfig.heads = "
                f"{tuple(model_config.heads)} lacks {missing_heads}"
            )
        have = {h.name: h.per_token for h in model_config.label_heads}
        for name, per_token in recipe.objective.label_heads:
            kind = "per-token" if per_token else "per-row"
            if have.get(name) != per_token:
                out.append(
                    f"{where} needs a {kind} label head {name!r} (ModelConfig.label_heads = "
                    f"(@{name}/LabelHead(), ...) with LabelHead.per_token = {per_token}); the "
                    f"model's label heads are {sorted(have)}"
                )
        if recipe.token_types == "pairs" and model_config.type_vocab_size < 2:
            out.append(
                f"{where} feeds two segment types, but ModelConfig.type_vocab_size = "
                f"{model_config.type_vocab_size}; set it to 2"
            )
        if recipe.check_model is not None:
            out.extend(f"{where}: {p}" for p in recipe.check_model(model_config, sequence_length))
    return out
