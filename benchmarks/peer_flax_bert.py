"""The peer side of `model_step.py`: one MLM training step of HuggingFace's FlaxBertForMaskedLM.

Runs with the peers' python (transformers 4.57.x is the last release with Flax models); speaks
the line-JSON protocol of `step_protocol.py`. The step is written as HF's `run_mlm_flax.py`
writes it: full (B, S, V) logits from the model, cross-entropy at the labelled positions, AdamW.

    .venv-peers/bin/python benchmarks/peer_flax_bert.py --num_layers=4 ...  # then {"steps": 3}
"""

import argparse
import os

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
import transformers  # noqa: E402
from step_protocol import (  # noqa: E402
    PeerChannel,
    StepConfig,
    add_config_flags,
    config_from_args,
    make_batch,
    serve,
)


def build(config: StepConfig):
    """(step, state): a jitted state -> state update and its initial (params, opt_state, rng)."""
    hf_config = transformers.BertConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=config.d_ff,
        hidden_act="gelu",
        hidden_dropout_prob=config.dropout,
        attention_probs_dropout_prob=config.dropout,
        max_position_embeddings=512,
        type_vocab_size=2,
        layer_norm_eps=1e-12,
    )
    model = transformers.FlaxBertForMaskedLM(
        hf_config, input_shape=(config.batch, config.length), seed=config.seed, dtype=jnp.float32
    )
    batch = {k: jnp.asarray(v) for k, v in make_batch(config).items()}
    tx = optax.adamw(config.learning_rate, eps=1e-6, weight_decay=config.weight_decay)
    train = config.dropout > 0

    def loss_fn(params, rng):
        logits_BSV = model(
            batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
            params=params,
            dropout_rng=rng if train else None,
            train=train,
        ).logits
        labels_BS = jnp.maximum(batch["labels"], 0)
        loss_BS = optax.softmax_cross_entropy_with_integer_labels(logits_BSV, labels_BS)
        weights_BS = batch["label_weights"]
        return jnp.sum(loss_BS * weights_BS) / jnp.sum(weights_BS)

    def step(state):
        params, opt_state, rng = state
        rng, step_rng = jax.random.split(rng)
        loss, grads = jax.value_and_grad(loss_fn)(params, step_rng)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, rng, loss

    jitted = jax.jit(step, donate_argnums=0)
    params = model.params
    state = (params, tx.init(params), jax.random.PRNGKey(config.seed), jnp.zeros(()))
    return (lambda s: jitted(s[:3])), state


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    add_config_flags(parser)
    parser.add_argument("--warmup_steps", type=int, default=2)
    args = parser.parse_args()
    channel = PeerChannel()
    config = config_from_args(args)
    step, state = build(config)
    serve(
        channel,
        step,
        state,
        warmup_steps=args.warmup_steps,
        block=jax.block_until_ready,
        leaves=jax.tree_util.tree_leaves,  # jax < 0.4.25 too
        versions={
            "jax": jax.__version__,
            "flax": __import__("flax").__version__,
            "optax": optax.__version__,
            "transformers": transformers.__version__,
        },
    )


if __name__ == "__main__":
    main()
