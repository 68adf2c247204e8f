"""One MLM training step of lmsuite's BERT vs HuggingFace's FlaxBertForMaskedLM, side by side.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/model_step.py --peer_python=.venv-peers/bin/python

Both sides run forward, backward and optax AdamW on the same seeded batch (`step_protocol.py`)
at the same config (default L=4 layers, D=256, H=4, F=1024, V=30522, S=128, B=16, 15% of
positions predicted). lmsuite gathers the P masked positions before the MLM head
(`masked_positions`); HF computes full (B, S, V) logits and masks the loss. The peer runs in
its own process and virtual environment (`peer_flax_bert.py`).

After both sides have compiled and warmed up, rounds alternate: matmul ceiling, ours, peer. Each
side's figure is its median over rounds, so load from other processes hits both alike. Every
figure is given twice: by wall time, and by each process's CPU time (all its threads), which
hardly moves when other processes compete for the cores.

Model FLOPs are counted analytically (`step_protocol.step_flops`): matmuls only, forward + backward
= 3 x forward, with the attention score/value matmuls and the vocabulary projection each side
actually computes:

    forward per sequence = layers * (2 S (4 D^2 + 2 D F) + 4 S^2 D) + 2 N (D^2 + D V)

with N = P = round(0.15 S) for lmsuite and N = S for HF. The ceiling is the best FLOP/s of a
jitted chain of large float32 matmuls, measured in the same rounds.
"""

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import optax

# The sibling protocol module, and lmsuite itself when the checkout is not pip-installed.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from step_protocol import (  # noqa: E402
    Ours,
    StepConfig,
    add_config_flags,
    add_driver_flags,
    compare,
    config_from_args,
    make_batch,
    step_flops,
)

from lmsuite.models import ModelConfig, Transformer  # noqa: E402

PEER_SCRIPT = Path(__file__).resolve().parent / "peer_flax_bert.py"


def build_ours(config: StepConfig, dtype: str = "float32"):
    """(step, state): a jitted state -> state update and its initial (params, opt_state, rng).
    `dtype` is lmsuite's activation dtype (parameters stay float32; the peer runs float32)."""
    model_config = ModelConfig(
        dtype=dtype,
        vocab_size=config.vocab_size,
        d_model=config.d_model,
        num_heads=config.num_heads,
        d_ff=config.d_ff,
        num_layers=config.num_layers,
        max_length=512,
        type_vocab_size=2,
        activation="gelu",
        heads=("mlm",),
        dropout_rate=config.dropout,
        attention_dropout_rate=config.dropout,
    )
    model = Transformer(model_config)
    batch = {k: jnp.asarray(v) for k, v in make_batch(config).items()}
    tx = optax.adamw(config.learning_rate, eps=1e-6, weight_decay=config.weight_decay)
    deterministic = config.dropout == 0

    def loss_fn(params, rng):
        logits_BPV = model.apply(
            {"params": params},
            batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
            masked_positions=batch["masked_positions"],
            deterministic=deterministic,
            rngs=None if deterministic else {"dropout": rng},
        )["mlm_logits"]
        loss_BP = optax.softmax_cross_entropy_with_integer_labels(logits_BPV, batch["masked_ids"])
        weights_BP = batch["masked_weights"]
        return jnp.sum(loss_BP * weights_BP) / jnp.sum(weights_BP)

    def step(state):
        params, opt_state, rng = state
        rng, step_rng = jax.random.split(rng)
        loss, grads = jax.value_and_grad(loss_fn)(params, step_rng)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, rng, loss

    rng = jax.random.PRNGKey(config.seed)
    params = jax.jit(model.init)(rng, batch["input_ids"][:1])["params"]
    jitted = jax.jit(step, donate_argnums=0)
    state = (params, tx.init(params), rng, jnp.zeros(()))
    return (lambda s: jitted(s[:3])), state


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_config_flags(parser)
    add_driver_flags(parser, rounds=5, steps_per_round=3)
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="lmsuite's activation dtype (bfloat16: the paper-sized experiments' mixed "
        "precision; the peer stays float32, XLA:CPU has no bf16 matmul units)",
    )
    args = parser.parse_args()
    config = config_from_args(args)
    print(f"lmsuite activations in {args.dtype}; HF Flax in float32")
    step, state = build_ours(config, args.dtype)
    ours = Ours(
        step=step,
        state=state,
        block=jax.block_until_ready,
        num_params=lambda s: sum(x.size for x in jax.tree.leaves(s[0])),
        loss=lambda s: float(s[3]),
    )
    flops = {
        "lmsuite": step_flops(config, vocab_rows_per_sequence=config.num_predictions),
        "HF Flax": step_flops(config, vocab_rows_per_sequence=config.length),
    }
    compare(
        args,
        config,
        ours,
        peer_script=PEER_SCRIPT,
        flops=flops,
        what="BERT" if args.dtype == "float32" else f"BERT ({args.dtype} activations)",
        jax_version=jax.__version__,
    )


if __name__ == "__main__":
    main()
