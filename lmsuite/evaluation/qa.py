"""Extractive QA: a span head on an encoder, HF `BertForQuestionAnswering` weights in, SQuAD
fine-tuning and EM/F1.

  model = qa_from_hf(hf_bert_for_qa)                    # QAModel: logits match HF's to 1e-4
  start_BL, end_BL = model.logits(input_ids, attention_mask, token_type_ids)
  result = finetune_qa("runs/default", train=train_examples, validation=dev_examples,
                       epochs=2, batch_size=16, max_length=256, seed=0)
  result.metrics["exact_match"], result.metrics["f1"]

The span head is BERT's: one Dense(D -> 2) on the final hidden states, column 0 the start
logits, column 1 the end logits (HF's `qa_outputs`). The parameters are a pair of trees:
{"encoder": the Transformer's (no heads), "span_head": {"qa_outputs": {kernel, bias}}}. The
loss is the mean of the start and end cross-entropies, windows whose answer lies outside
pointing both at [CLS], as in the BERT reference.
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from lmsuite import extras
from lmsuite import partitioning as P
from lmsuite.evaluation import finetune, squad
from lmsuite.layers.dense import DenseGeneral, default_kernel_init
from lmsuite.models import ModelConfig, Transformer, families
from lmsuite.models.inputs import position_limit

HF_QA_CLASS = "BertForQuestionAnswering"


class SpanHead(nn.Module):
    """hidden_BLD -> (start_BL, end_BL) logits: one Dense(2), HF's `qa_outputs`."""

    config: ModelConfig

    @nn.compact
    def __call__(self, hidden_BLD):
        cfg = self.config
        logits_BL2 = DenseGeneral(
            (2,),
            (P.EMBED,),
            (P.TABLE,),
            kernel_init=default_kernel_init(cfg.init_stddev),
            dtype=cfg.compute_dtype,
            name="qa_outputs",
        )(hidden_BLD)
        return logits_BL2[..., 0], logits_BL2[..., 1]


def span_logits(config: ModelConfig, params, batch, *, deterministic=True, rng=None):
    """(start_BL, end_BL) of the encoder + span head on a batch of Features arrays."""
    hidden_BLD = Transformer(config).apply(
        {"params": params["encoder"]},
        batch["input_ids"],
        attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"] if config.type_vocab_size > 0 else None,
        deterministic=deterministic,
        rngs=None if deterministic else {"dropout": rng},
    )["hidden"]
    return SpanHead(config).apply({"params": params["span_head"]}, hidden_BLD)


@dataclasses.dataclass
class QAModel:
    """An encoder config (no heads) and its {"encoder", "span_head"} parameters."""

    config: ModelConfig
    params: Any

    def __post_init__(self):
        self._apply = jax.jit(lambda p, b: span_logits(self.config, p, b))

    def logits(self, input_ids, attention_mask=None, token_type_ids=None):
        """(start, end) logits (B, L) as numpy, for HF-style inputs (numpy or torch)."""
        ids = _np(input_ids)
        batch = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids) if attention_mask is None else _np(attention_mask),
            "token_type_ids": np.zeros_like(ids) if token_type_ids is None else _np(token_type_ids),
        }
        return tuple(np.asarray(x) for x in self._apply(self.params, batch))


def _np(x):
    return np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x, np.int32)


def qa_from_hf(hf_model) -> QAModel:
    """A HF `BertForQuestionAnswering` (instance or directory): encoder and `qa_outputs`."""
    from lmsuite.convert import bert, common

    if isinstance(hf_model, str):
        transformers = extras.require("transformers", feature="reading a HF QA model")
        hf_model = transformers.BertForQuestionAnswering.from_pretrained(hf_model)
    if type(hf_model).__name__ != HF_QA_CLASS:
        raise ValueError(f"qa_from_hf converts {HF_QA_CLASS}, got {type(hf_model).__name__}")
    hf_model.eval()
    bert.check_bert_options(hf_model.config, "BERT")
    config = bert.base_config(hf_model.config, heads=())
    state = {k: v.detach().cpu().float().numpy() for k, v in hf_model.state_dict().items()}
    flat = {}
    bert.embeddings_from_hf(state, "bert.", config, flat)
    bert.encoder_from_hf(state, "bert.", config, flat)
    head = {
        "qa_outputs": {
            "kernel": common.linear_in(common.take(state, "qa_outputs.weight")),
            "bias": common.take(state, "qa_outputs.bias"),
        }
    }
    common.check_consumed(state, HF_QA_CLASS)
    return QAModel(config, {"encoder": common.check_params(config, flat), "span_head": head})


def is_hf_qa_dir(path: str) -> bool:
    """Whether `path` is a HF directory whose config.json names BertForQuestionAnswering."""
    import json
    import os

    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        return False
    with open(file) as f:
        return HF_QA_CLASS in (json.load(f).get("architectures") or [])


def qa_params(config: ModelConfig, pretrained, *, seed: int, from_scratch: bool):
    """{"encoder", "span_head"}: a fresh span head and the pretrained encoder (or, with
    `from_scratch`, a random one)."""
    encoder_config = config.replace(heads=())
    rng_encoder, rng_head = jax.random.split(jax.random.PRNGKey(seed))
    encoder = finetune.init_params(encoder_config, rng_encoder)
    if not from_scratch:
        encoder = finetune.transplant(encoder, pretrained, keep=lambda _: True)
    hidden = jnp.zeros((1, 1, config.d_model), jnp.float32)
    head = nn.unbox(SpanHead(encoder_config).init(rng_head, hidden)["params"])
    return encoder_config, {"encoder": encoder, "span_head": head}


# One compilation per (config, batch shape) across epochs and calls.
_jitted_span_logits = jax.jit(span_logits, static_argnums=0)


def _qa_loss(config):
    def loss_fn(params, batch, rng):
        start, end = span_logits(config, params, batch, deterministic=False, rng=rng)
        mask = batch["attention_mask"] > 0
        losses = [
            optax.softmax_cross_entropy_with_integer_labels(
                jnp.where(mask, logits, -1e9), batch[key]
            )
            for logits, key in ((start, "start_positions"), (end, "end_positions"))
        ]
        per_row = (losses[0] + losses[1]) / 2
        return jnp.sum(per_row * batch["weights"]) / jnp.maximum(jnp.sum(batch["weights"]), 1)

    return loss_fn


def feature_arrays(features: squad.Features) -> dict:
    return {
        k: getattr(features, k)
        for k in (
            "input_ids",
            "token_type_ids",
            "attention_mask",
            "start_positions",
            "end_positions",
        )
    }


def predict_answers(
    config, params, features, examples, *, batch_size: int, max_answer_length: int = 30
) -> dict[str, str]:
    """qa_id -> predicted answer text (`squad.best_spans` over every window)."""
    starts, ends = [], []
    arrays = feature_arrays(features)
    for batch in finetune.batches(arrays, batch_size=batch_size, rng=None):
        start, end = _jitted_span_logits(config, params, batch)
        keep = batch["weights"] > 0
        starts.append(np.asarray(start)[keep])
        ends.append(np.asarray(end)[keep])
    return squad.best_spans(
        np.concatenate(starts),
        np.concatenate(ends),
        features,
        examples,
        max_answer_length=max_answer_length,
    )


def finetune_qa(
    model_or_path,
    *,
    train: list,
    validation: list,
    learning_rate: float = 5e-5,
    epochs: int = 2,
    batch_size: int = 16,
    max_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
    max_answer_length: int = 30,
    seed: int = 0,
    warmup_fraction: float = 0.1,
    from_scratch: bool = False,
    progress: bool = True,
) -> finetune.FinetuneResult:
    """Fine-tunes an encoder with a span head on `squad.QAExample`s; EM/F1 on `validation`.

    `model_or_path` is an lmsuite run or HF directory (a `BertForQuestionAnswering` one keeps
    its trained `qa_outputs`, read with `qa_from_hf`), a transformers model or a `LoadedModel`.
    """
    if not train or not validation:
        raise ValueError(
            f"QA needs train and validation examples, got {len(train)}, {len(validation)}"
        )
    if isinstance(model_or_path, str) and is_hf_qa_dir(model_or_path):
        from lmsuite.evaluation import tokenizer_export

        converted = qa_from_hf(model_or_path)
        vocab = tokenizer_export.TokenizersText.from_dir(model_or_path)
        config, source = converted.config, model_or_path
        _, params = qa_params(
            config, converted.params["encoder"], seed=seed, from_scratch=from_scratch
        )
        if not from_scratch:
            params["span_head"] = converted.params["span_head"]
    else:
        loaded = finetune.open_model(model_or_path)
        if not families.family(loaded.config).bidirectional:
            raise ValueError(
                f"extractive QA needs an encoder, got {families.describe(loaded.config)}"
            )
        vocab, source = loaded.vocab, loaded.source
        config, params = qa_params(
            loaded.config, loaded.params, seed=seed, from_scratch=from_scratch
        )
    if vocab is None:
        raise ValueError(f"{source} has no vocabulary to tokenize questions and contexts with")
    limit = position_limit(config)  # None: relative positions, any length
    if limit is not None and max_length > limit:
        raise ValueError(
            f"max_length={max_length} exceeds the model's position table of {limit} positions"
        )
    windows = dict(
        vocab=vocab, max_length=max_length, doc_stride=doc_stride, max_query_length=max_query_length
    )
    train_features = squad.make_features(train, **windows)
    validation_features = squad.make_features(validation, **windows)

    def evaluate(p):
        predictions = predict_answers(
            config,
            p,
            validation_features,
            validation,
            batch_size=batch_size,
            max_answer_length=max_answer_length,
        )
        return squad.exact_match_and_f1(predictions, validation)

    params, history = finetune.fit(
        params=params,
        loss_fn=_qa_loss(config),
        train=feature_arrays(train_features),
        evaluate=evaluate,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        warmup_fraction=warmup_fraction,
        seed=seed,
        progress=progress,
        description="qa scratch" if from_scratch else "qa fine-tune",
    )
    metrics = {
        **history[-1],
        "train_examples": len(train),
        "train_windows": len(train_features.example_index),
        "validation_examples": len(validation),
        "learning_rate": learning_rate,
        "epochs": epochs,
        "batch_size": batch_size,
        "max_length": max_length,
        "doc_stride": doc_stride,
        "seed": seed,
        "from_scratch": from_scratch,
        "source": source,
    }
    return finetune.FinetuneResult(metrics=metrics, history=history, params=params, config=config)
