"""Fine-tuning probes: a pretrained model of any family plus a fresh classifier head, trained
on labelled text, scored on held-out accuracy; `from_scratch=True` trains the same architecture
from random initialisation, the comparison that says what pretraining bought. How each family
is read (which states, pooled how, its text framed how) is `probe_models`' table.

  result = finetune_classifier("runs/default", train=train, validation=validation, test=test,
                               num_labels=6, epochs=3, batch_size=32, max_length=64, seed=0)
  result.metrics["validation_accuracy"], result.metrics["test_accuracy"], result.params

The loop is BERT's fine-tuning recipe: AdamW (LayerNorm and biases not decayed, as in
`training.optimizers`), a learning rate warmed up linearly over `warmup_fraction` of the steps
and decayed linearly to 0, every example once per epoch in a seeded order. Extractive QA
(`qa.py`) trains through the same `fit`.
"""

import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from lmsuite.evaluation import finetune_data, probe_models
from lmsuite.models import ModelConfig, Transformer, families
from lmsuite.models.inputs import position_limit
from lmsuite.training import optimizers


@dataclasses.dataclass(frozen=True)
class FinetuneResult:
    """What a fine-tuning run returns: its final metrics, per-epoch history, the fine-tuned
    parameters and the config they belong to."""

    metrics: dict[str, Any]
    history: list[dict[str, float]]
    params: Any
    config: ModelConfig


def open_model(model_or_path):
    """A `LoadedModel` from a path (lmsuite run or HF directory), a transformers model or a
    `LoadedModel` itself."""
    from lmsuite.evaluation.handle import LoadedModel

    if isinstance(model_or_path, LoadedModel):
        return model_or_path
    from lmsuite.evaluation.load import load

    return load(model_or_path)


def init_params(config: ModelConfig, rng, *, length: int = 8) -> dict:
    """Random parameters of `Transformer(config)` (unboxed, nested); an encoder-decoder's
    decoder too (the study's from-scratch baseline of T5 or BART)."""
    inputs = families.example_inputs(config, batch=1, length=length)
    variables = jax.jit(Transformer(config).init)(rng, **inputs)
    return nn.unbox(variables["params"])


def transplant(fresh: dict, pretrained: dict, *, keep: Callable[[str], bool]) -> dict:
    """`fresh` with every parameter whose path `keep`s and that `pretrained` has (same shape)
    taken from `pretrained`; the pretrained heads a new task has no use for are dropped.

    Example: fresh {"encoder": e0, "classifier": c0}, pretrained {"encoder": e1, "mlm_head": m}
      -> {"encoder": e1, "classifier": c0}
    """
    flat_fresh = traverse_util.flatten_dict(fresh, sep="/")
    flat_old = traverse_util.flatten_dict(pretrained, sep="/")
    out = {}
    for key, value in flat_fresh.items():
        old = flat_old.get(key)
        if keep(key) and old is not None:
            if np.shape(old) != np.shape(value):
                raise ValueError(
                    f"pretrained {key} has shape {np.shape(old)}, the model {np.shape(value)}"
                )
            # A copy: `fit` donates the parameters, which must not delete the caller's
            # (a `LoadedModel` fine-tuned again, e.g. at the next learning rate).
            value = jnp.array(old, jnp.float32, copy=True)
        out[key] = value
    return traverse_util.unflatten_dict(out, sep="/")


# ----------------------------------------------------------------------------- the loop
def make_optimizer(
    *, learning_rate: float, total_steps: int, warmup_fraction: float, weight_decay: float = 0.01
) -> optax.GradientTransformation:
    """AdamW under a linear warmup to `learning_rate`, then linear decay to 0."""
    if not 0 <= warmup_fraction < 1:
        raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction}")
    warmup = int(round(warmup_fraction * total_steps))
    schedule = optax.join_schedules(
        [
            optax.linear_schedule(0.0, learning_rate, max(warmup, 1)),
            optax.linear_schedule(learning_rate, 0.0, max(total_steps - warmup, 1)),
        ],
        [warmup],
    )
    return optimizers.make_optimizer(
        name="adamw", learning_rate=schedule, clip_norm=1.0, weight_decay=weight_decay
    )


def train_step(state, batch, rng, peak, *, loss_fn, optimizer):
    """One AdamW step on `loss_fn(params, batch, rng)`; state = (params, opt_state, step).

    `optimizer`'s schedule peaks at 1 and `peak` scales its updates: AdamW's update (decay
    included) is linear in the learning rate, so this is the step at a schedule peaking at
    `peak`, and one compiled step serves every rate of a sweep.
    """
    params, opt_state, step = state
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, jax.random.fold_in(rng, step))
    updates, opt_state = optimizer.update(grads, opt_state, params)
    updates = jax.tree.map(lambda u: peak * u, updates)
    return (optax.apply_updates(params, updates), opt_state, step + 1), loss


@functools.lru_cache(maxsize=32)
def _compiled_step(loss_fn, total_steps: int, warmup_fraction: float):
    """The jitted `train_step` with a unit-peak schedule, one per (loss, schedule shape): a
    sweep over learning rates, and the runs of one architecture, compile it once."""
    optimizer = make_optimizer(
        learning_rate=1.0, total_steps=total_steps, warmup_fraction=warmup_fraction
    )
    step = jax.jit(
        functools.partial(train_step, loss_fn=loss_fn, optimizer=optimizer), donate_argnums=0
    )
    return step, optimizer


def batches(arrays: dict, *, batch_size: int, rng: np.random.Generator | None) -> Iterator[dict]:
    """`arrays` (each (N, ...)) in batches of exactly `batch_size` rows (one compiled shape);
    the last batch is filled with copies of row 0 whose `weights` are 0. `rng`: shuffle first.

    Example: N=3, batch_size=2 -> rows [0, 1] weights [1, 1], then [2, 0] weights [1, 0].
    """
    n = len(next(iter(arrays.values())))
    order = np.arange(n) if rng is None else rng.permutation(n)
    for begin in range(0, n, batch_size):
        rows = order[begin : begin + batch_size]
        weights = np.zeros(batch_size, np.float32)
        weights[: len(rows)] = 1
        rows = np.concatenate([rows, np.full(batch_size - len(rows), rows[0])])
        yield {**{k: v[rows] for k, v in arrays.items()}, "weights": weights}


class _ProgressLine:
    """tqdm's update/set_postfix/close as a printed line every 5% (tqdm not installed)."""

    def __init__(self, total: int, description: str, enabled: bool):
        self.total, self.description, self.enabled, self.n = total, description, enabled, 0

    def update(self, k: int = 1):
        self.n += k
        if self.enabled and (self.n % max(self.total // 20, 1) == 0 or self.n == self.total):
            print(f"{self.description}: step {self.n}/{self.total}", flush=True)

    def set_postfix(self, **values):
        if self.enabled:
            print(f"{self.description}: " + "  ".join(f"{k} {v}" for k, v in values.items()))

    def close(self):
        pass


def _progress(total: int, description: str, enabled: bool):
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _ProgressLine(total, description, enabled)
    return tqdm(total=total, desc=description, disable=not enabled, unit="step")


def fit(
    *,
    params,
    loss_fn,
    train: dict,
    evaluate: Callable[[Any], dict],
    epochs: int,
    batch_size: int,
    learning_rate: float,
    warmup_fraction: float,
    seed: int,
    progress: bool = True,
    description: str = "fine-tune",
) -> tuple[Any, list[dict]]:
    """Trains `params` on the `train` arrays for `epochs`; (params, per-epoch history) where
    each history row holds the epoch's mean train loss and what `evaluate(params)` returned."""
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1, got {epochs}, {batch_size}")
    n = len(next(iter(train.values())))
    steps_per_epoch = -(-n // batch_size)
    if not 0 <= warmup_fraction < 1:
        raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction}")
    step, optimizer = _compiled_step(loss_fn, epochs * steps_per_epoch, warmup_fraction)
    peak = jnp.float32(learning_rate)
    state = (params, optimizer.init(params), jnp.zeros([], jnp.int32))
    rng = jax.random.PRNGKey(seed)
    order = np.random.default_rng(seed)
    bar = _progress(epochs * steps_per_epoch, description, progress)
    history = []
    for epoch in range(epochs):
        losses = []
        for batch in batches(train, batch_size=batch_size, rng=order):
            state, loss = step(state, batch, rng, peak)
            losses.append(loss)
            bar.update(1)
        row = {"epoch": epoch + 1, "train_loss": float(np.mean(jax.device_get(losses)))}
        row.update(evaluate(state[0]))
        history.append(row)
        bar.set_postfix(**{k: f"{v:.4f}" for k, v in row.items() if k != "epoch"})
    bar.close()
    return state[0], history


# ------------------------------------------------------------------------ classification
def classifier_model(config: ModelConfig, *, num_labels: int, dropout_rate=None):
    """The encoder's config with only the pooled `classifier` head, `num_labels` wide (ELECTRA:
    its discriminator's). Other families: `probe_models.probe_for(config, ...).config`."""
    probe = probe_models.probe_for(config, num_labels=num_labels, dropout_rate=dropout_rate)
    if not probe.own_head:
        raise ValueError(
            f"classifier_model is the encoders' head; {families.describe(config)} is read by "
            "probe_models.probe_for"
        )
    return probe.config


@functools.lru_cache(maxsize=32)  # one function per probe: its compiled step is reused
def _classifier_loss(probe: probe_models.ProbeModel):
    def loss_fn(params, batch, rng):
        logits = probe.logits(params, batch, deterministic=False, rng=rng)
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
        return jnp.sum(losses * batch["weights"]) / jnp.maximum(jnp.sum(batch["weights"]), 1)

    return loss_fn


@functools.partial(jax.jit, static_argnums=0)
def _predicted_labels(probe: probe_models.ProbeModel, params, batch):
    return probe.logits(params, batch).argmax(-1)


def predict_labels(
    probe: probe_models.ProbeModel, params, arrays: dict, *, batch_size: int
) -> np.ndarray:
    """argmax of the classifier logits for every row of `arrays` (`encode_examples` framed as
    `probe.framing`)."""
    out = []
    for batch in batches(arrays, batch_size=batch_size, rng=None):
        predicted = np.asarray(_predicted_labels(probe, params, batch))
        out.append(predicted[batch["weights"] > 0])
    return np.concatenate(out)


def _check_examples(name: str, examples: list, num_labels: int):
    if not examples:
        raise ValueError(f"{name} has no examples")
    bad = sorted({e.label for e in examples if not 0 <= e.label < num_labels})
    if bad:
        raise ValueError(f"{name} labels {bad} are outside [0, num_labels={num_labels})")


def _majority_share(labels: np.ndarray, num_labels: int) -> float:
    counts = np.bincount(labels, minlength=num_labels)
    return float(counts.max() / counts.sum())


def finetune_classifier(
    model_or_path,
    *,
    train: list,
    validation: list,
    num_labels: int,
    test: list | None = None,
    learning_rate: float = 2e-5,
    epochs: int = 3,
    batch_size: int = 32,
    max_length: int = 128,
    seed: int = 0,
    warmup_fraction: float = 0.1,
    from_scratch: bool = False,
    dropout_rate: float | None = None,
    progress: bool = True,
) -> FinetuneResult:
    """Fine-tunes a classifier (and the model under it) on `TextExample`s, for every family:
    how each is read and its texts framed is `probe_models`' table (encoders: the pooled
    `classifier` head on [CLS]; encoder-decoders: the encoder mean-pooled, the decoder unused;
    XLNet: the content stream's last position; causal LMs: the last real token).

    Args:
      model_or_path: an lmsuite run or HF directory, a transformers model or a `LoadedModel`;
        its model (ELECTRA: the discriminator) and vocabulary are used.
      train, validation: `finetune_data.TextExample` lists with labels in [0, num_labels).
      test: an optional held-out list scored once with the final parameters (select settings
        on `validation`, report `test`).
      from_scratch: the same architecture from random initialisation (seeded by `seed`),
        nothing taken from the checkpoint: the baseline pretraining has to beat.
      dropout_rate: overrides the checkpoint's dropout (None keeps it).

    Returns:
      `FinetuneResult`; metrics hold validation_accuracy (final epoch), the majority-class
      share of the validation set, with `test`: test_accuracy and test_majority_class_share,
      and the settings. `result.config` is the fine-tuned backbone's config.

    Raises:
      ValueError: an empty split, a label outside [0, num_labels), no vocabulary, max_length
        beyond the model's positions, or a family no probe reads.
    """
    splits = {"train": train, "validation": validation}
    if test is not None:
        splits["test"] = test
    for name, examples in splits.items():
        _check_examples(name, examples, num_labels)
    loaded = open_model(model_or_path)
    if loaded.vocab is None:
        raise ValueError(f"{loaded.source} has no vocabulary to tokenize the text with")
    probe = probe_models.probe_for(loaded.config, num_labels=num_labels, dropout_rate=dropout_rate)
    config = probe.config
    limit = position_limit(config)  # None: relative positions, any length
    if limit is not None and max_length > limit:
        raise ValueError(
            f"max_length={max_length} exceeds the model's position table of {limit} positions"
        )
    params = probe.init(jax.random.PRNGKey(seed))
    if not from_scratch:
        _, pretrained = probe_models.pretrained_backbone(loaded.config, loaded.params)
        params = transplant(params, pretrained, keep=probe.keep)
    arrays = {
        name: finetune_data.encode_examples(
            examples, vocab=loaded.vocab, max_length=max_length, framing=probe.framing
        )
        for name, examples in splits.items()
    }

    def accuracy(p, split: str) -> float:
        predicted = predict_labels(probe, p, arrays[split], batch_size=batch_size)
        return float(np.mean(predicted == arrays[split]["labels"]))

    params, history = fit(
        params=params,
        loss_fn=_classifier_loss(probe),
        train=arrays["train"],
        evaluate=lambda p: {"validation_accuracy": accuracy(p, "validation")},
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        warmup_fraction=warmup_fraction,
        seed=seed,
        progress=progress,
        description="scratch" if from_scratch else "fine-tune",
    )
    metrics = {
        **history[-1],
        "majority_class_share": _majority_share(arrays["validation"]["labels"], num_labels),
    }
    if test is not None:
        metrics["test_accuracy"] = accuracy(params, "test")
        metrics["test_majority_class_share"] = _majority_share(arrays["test"]["labels"], num_labels)
    metrics.update(
        {
            "train_examples": len(train),
            "validation_examples": len(validation),
            **({"test_examples": len(test)} if test is not None else {}),
            "num_labels": num_labels,
            "family": families.family(loaded.config).name,
            "learning_rate": learning_rate,
            "epochs": epochs,
            "batch_size": batch_size,
            "max_length": max_length,
            "seed": seed,
            "from_scratch": from_scratch,
            "source": loaded.source,
        }
    )
    return FinetuneResult(metrics=metrics, history=history, params=params, config=config)
