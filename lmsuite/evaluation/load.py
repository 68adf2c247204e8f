"""`load(path, step=None)`: open a trained model again, from wherever it was written.

an lmsuite run directory   (run.json + checkpoints/<step>/ written by `lmsuite train`): the
                           ModelConfig and the task come from run.json (`run_config`), the
                           vocabulary from the task, and only the parameters are read from the
                           newest committed step (or `step`), as training saved them (a
                           scanned run's, ModelConfig.scan_layers, unscanned for decoding);
a HF directory             (config.json + weights [+ tokenizer.json]): `lmsuite.convert.from_hf`
                           and, for text, the `tokenizers` library;
a transformers model       (an instance, with an optional tokenizer=).

>>> model = load("runs/default")          # newest committed step
>>> model = load("runs/default", step=500)
>>> model.fill_mask("The capital of France is [MASK].")
"""

import os
import sys
from typing import Any

import numpy as np

from lmsuite.convert import common, from_hf
from lmsuite.evaluation import run_config, tokenizer_export
from lmsuite.evaluation.handle import LoadedModel, forward_for
from lmsuite.models import families, scan_layout
from lmsuite.training import checkpointing

CHECKPOINTS = "checkpoints"
STATE_ITEM = "state"  # the Orbax item holding the TrainState (see training/checkpointing.py)


def _listing(path: str, *, limit: int = 20) -> list[str]:
    """The names in `path` (the first `limit`, then how many more), for messages."""
    names = sorted(os.listdir(path)) if os.path.isdir(path) else []
    return names if len(names) <= limit else [*names[:limit], f"... {len(names) - limit} more"]


def is_run_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, run_config.RUN_FILE)) or os.path.isdir(
        os.path.join(path, CHECKPOINTS)
    )


def committed_steps(model_dir: str) -> list[int]:
    """Steps under MODEL_DIR/checkpoints whose save was committed, oldest first: Orbax's
    `commit_success.txt` or lmsuite's checksum manifest (`checkpointing.MANIFEST`, the only
    marker of steps written before Orbax wrote its own). Read from the directory: nothing is
    opened for writing, nothing cleaned."""
    root = os.path.join(model_dir, CHECKPOINTS)
    markers = (checkpointing.MANIFEST, "commit_success.txt")
    return sorted(
        int(name)
        for name in (os.listdir(root) if os.path.isdir(root) else [])
        if name.isdigit() and any(os.path.isfile(os.path.join(root, name, m)) for m in markers)
    )


def restore_params(state_dir: str) -> Any:
    """The `params` subtree of a saved TrainState, as numpy arrays, nothing else read.

    An Orbax partial restore: the optimizer state (twice the parameters, for Adam) stays on
    disk, and no sharding is needed, so a checkpoint written on a pod opens on a laptop.
    """
    import jax
    import orbax.checkpoint as ocp

    metadata = ocp.StandardCheckpointer().metadata(str(checkpointing.absolute(state_dir)))
    metadata = metadata.item_metadata
    if metadata is None:
        raise ValueError(f"{state_dir} holds no readable Orbax metadata (_METADATA)")
    if "params" not in metadata:
        raise ValueError(f"{state_dir} holds {sorted(metadata)}, not a TrainState with params")
    shapes = metadata["params"]
    item = {"params": jax.tree.map(lambda m: np.zeros(m.shape, m.dtype), shapes)}
    args = {"params": jax.tree.map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray), shapes)}
    with ocp.PyTreeCheckpointer() as checkpointer:
        request = ocp.args.PyTreeRestore(item=item, restore_args=args, partial_restore=True)
        restored = checkpointer.restore(str(checkpointing.absolute(state_dir)), args=request)
    return restored["params"]


def task_vocabulary(task: str):
    """The SentencePiece vocabulary of a registered SeqIO task (or mixture)."""
    import seqio

    from lmsuite.data import tasks  # noqa: F401  (registers the lmsuite tasks)

    try:
        found = seqio.get_mixture_or_task(task)
    except ValueError as error:
        raise ValueError(
            f"the run's TASK {task!r} is not a registered SeqIO task: import the module that "
            "registers it (the run's --task_module) before lmsuite.load"
        ) from error
    features = found.output_features
    key = next((k for k in ("input_ids", "inputs", "targets", "input_k") if k in features), None)
    vocab = features[key or next(iter(features))].vocabulary
    if not isinstance(vocab, seqio.SentencePieceVocabulary):
        raise ValueError(
            f"task {task!r} uses a {type(vocab).__name__}; lmsuite.load reads SentencePiece "
            "vocabularies only"
        )
    return vocab


def _newest_verified(root: str, steps: list[int]) -> int:
    """The newest step whose files match their checksums; each damaged one is named on stderr.

    Raises:
      DamagedCheckpointError: every committed step is damaged (the newest one's damage named).
    """
    newest_error = None
    for step in reversed(steps):
        try:
            checkpointing.verify(os.path.join(root, str(step)))
        except checkpointing.DamagedCheckpointError as error:
            newest_error = newest_error or error
            print(f"lmsuite: not loading checkpoint step {step}: {error}", file=sys.stderr)
            continue
        return step
    raise newest_error


def load_run(model_dir: str, step: int | None = None, *, weights: bool = True) -> LoadedModel:
    """An lmsuite run directory (see the module docstring).

    `weights=False` reads no checkpoint: the run's architecture and vocabulary with random
    parameters (seed 0), for training the same model from scratch (`lmsuite study`'s baseline
    needs only its config.gin, run.json and task, so it survives a run whose checkpoints were
    deleted).
    """
    run = run_config.read_run_config(model_dir)
    if not weights:
        if step is not None:
            raise ValueError(f"step={step} reads a checkpoint; weights=False reads none")
        return _architecture_only(model_dir, run)
    steps = committed_steps(model_dir)
    root = os.path.join(model_dir, CHECKPOINTS)
    if not steps:
        inside = f"; {root} holds {_listing(root)}" if os.path.isdir(root) else ""
        raise ValueError(
            f"{model_dir} has no committed checkpoint (no {root}/<step>/{checkpointing.MANIFEST});"
            f" the directory holds {_listing(model_dir)}{inside}"
        )
    if step is None:
        step = _newest_verified(root, steps)
    elif step not in steps:
        raise ValueError(f"{model_dir} has no committed checkpoint step {step}; committed: {steps}")
    step_dir = os.path.join(root, str(step))
    checkpointing.verify(step_dir)  # a damaged array file is named, never loaded
    config = run.model_config
    params = common.check_params(config, common.flatten(restore_params(f"{step_dir}/{STATE_ITEM}")))
    return _loaded(model_dir, run, config, params, source=f"{model_dir} step {step}")


def _architecture_only(model_dir: str, run) -> LoadedModel:
    import jax

    from lmsuite.evaluation.finetune import init_params

    config = run.model_config.replace(scan_layers=False)
    params = common.check_params(config, common.flatten(init_params(config, jax.random.key(0))))
    source = f"{model_dir} (architecture only: random parameters, no checkpoint read)"
    return _loaded(model_dir, run, config, params, source=source)


def _loaded(model_dir: str, run, config, params, *, source: str) -> LoadedModel:
    # The run's --task_module imports and its --train_files task: TASK registers itself.
    run_config.register_run_tasks(run, where=os.path.join(model_dir, run_config.RUN_FILE))
    if config.scan_layers:
        # Checkpoints keep the layout the run trained with; evaluation and cached decoding run
        # the unscanned one (one cache entry per layer).
        params = scan_layout.unscan_params(params, config)
        config = config.replace(scan_layers=False)
    vocab = None
    if run.task is not None:
        template = tokenizer_export.template_for(config)
        vocab = tokenizer_export.SentencePieceText(task_vocabulary(run.task), template=template)
    forward, hf_class = forward_for(config, params)
    return LoadedModel(
        forward=forward,
        vocab=vocab,
        hf_class=hf_class,
        decoder_start_id=config.decoder_start_id,
        causal_start_id=(
            config.decoder_start_id if families.family(config).scores(config) == "causal" else None
        ),
        source=source,
    )


def _hf_vocab(tokenizer, default_dir: str | None):
    if tokenizer is None:
        if default_dir is None or not os.path.isfile(os.path.join(default_dir, "tokenizer.json")):
            return None
        return tokenizer_export.TokenizersText.from_dir(default_dir)
    if isinstance(tokenizer, str | os.PathLike):
        return tokenizer_export.TokenizersText.from_dir(os.fspath(tokenizer))
    if type(tokenizer).__module__.startswith("tokenizers"):
        return tokenizer_export.TokenizersText(tokenizer, roles={})
    return tokenizer_export.TokenizersText.from_transformers(tokenizer)


def load_hf(model, tokenizer=None) -> LoadedModel:
    """A HF directory or transformers model instance (see the module docstring)."""
    directory = os.fspath(model) if isinstance(model, str | os.PathLike) else None
    converted = from_hf(model)
    start = getattr(converted.hf_config, "decoder_start_token_id", None)
    return LoadedModel(
        forward=converted,
        vocab=_hf_vocab(tokenizer, directory),
        hf_class=converted.hf_class,
        decoder_start_id=start if start is not None else converted.config.decoder_start_id,
        source=directory or converted.hf_class,
    )


def load(source, step: int | None = None, *, tokenizer=None) -> LoadedModel:
    """Opens an lmsuite run directory, a HF directory or a transformers model.

    Args:
      source: a path (lmsuite run or HF directory) or a transformers model instance.
      step: the committed checkpoint step of an lmsuite run (default: the newest).
      tokenizer: for HF sources: a transformers fast tokenizer, a `tokenizers.Tokenizer` or a
        directory with tokenizer.json (default: the HF directory's own tokenizer.json).

    Raises:
      ValueError: a run without a committed checkpoint (naming what the directory holds), a
        step that is not committed (listing those that are), a path that is neither kind.
    """
    if isinstance(source, str | os.PathLike):
        given = os.fspath(source)
        path = str(checkpointing.absolute(given))  # Orbax reads absolute paths only
        if os.path.isfile(path):
            raise ValueError(
                f"{given} is a file ({path}); lmsuite.load takes a directory: an lmsuite run "
                "(run.json, checkpoints/) or a HF model (config.json)"
            )
        if is_run_dir(path):
            if tokenizer is not None:
                raise ValueError(f"{path} is an lmsuite run: its vocabulary comes from its task")
            return load_run(path, step)
        if os.path.isfile(os.path.join(path, "config.json")):
            if step is not None:
                raise ValueError(f"step={step} is for lmsuite runs; {path} is a HF directory")
            return load_hf(path, tokenizer)
        what = f"it holds {_listing(path)}" if os.path.isdir(path) else "it does not exist"
        raise ValueError(
            f"{path} is neither an lmsuite run directory (config.gin, checkpoints/) nor a HF "
            f"directory (config.json): {what}"
        )
    if hasattr(source, "state_dict") and hasattr(source, "config"):
        if step is not None:
            raise ValueError(f"step={step} is for lmsuite runs, not a {type(source).__name__}")
        return load_hf(source, tokenizer)
    raise ValueError(
        f"cannot load a {type(source).__name__}: expected a path (lmsuite run or HF directory) "
        "or a transformers model"
    )
