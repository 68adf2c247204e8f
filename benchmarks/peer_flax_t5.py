"""The peer side of `seq2seq_step.py`: one span-corruption training step of HuggingFace's
FlaxT5ForConditionalGeneration at the T5 1.1 config.

Runs with the peers' python (transformers 4.57.x is the last release with Flax models); speaks
the line-JSON protocol of `step_protocol.py`. The step is written as HF's `run_t5_mlm_flax.py`
writes it (full (B, M, V) logits from the model, a loss over the labels, an optax update), with
two changes so that both sides do the same work:

- the loss is lmsuite's and T5X's: mean over the real target tokens of the cross-entropy plus
  1e-4 (log Z)^2 (`step_protocol.T5_Z_LOSS`; `run_t5_mlm_flax.py` has no z-loss);
- the optimizer is Adafactor with T5's settings, as lmsuite's `make_optimizer(name="adafactor",
  clip_norm=None)` builds it (`run_t5_mlm_flax.py` offers it behind `--adafactor`, with optax's
  defaults, which are these). Optax 0.2.2's `adafactor` here is the same algorithm as lmsuite's
  0.2.8 (factored second moments from 128 on, decay 0.8, block-RMS update clipping 1.0,
  parameter-scaled steps, eps 1e-30); 0.2.8 only adds dtype casts, which are no-ops in float32.

XLA:CPU in jaxlib 0.4.26 rewrites a dot followed by the add of a bias into a oneDNN matmul with
a binary-add post-op (the `onednn-matmul-rewriter` pass). When the bias broadcasts over the
batch, as HF's (1, H, L, M) position bias does over the (B, H, L, M) attention scores, oneDNN
3.3 has no fast kernel for it and runs its reference one (`ONEDNN_VERBOSE=1` shows
`matmul,ref:any`), two orders of magnitude slower than the plain dot and add: the four encoder
self-attention score matmuls then took nearly all of HF's step. The peer therefore turns that
pass off (`--xla_disable_hlo_passes`) unless it is given `--onednn_matmul_rewriter`, so that the
comparison measures the models rather than that kernel choice; under lmsuite's jax 0.10.2 the
same dot and add run on the ordinary path.

    .venv-peers/bin/python benchmarks/peer_flax_t5.py --num_layers=4 ...  # then {"steps": 3}
"""

import argparse
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Before jax reads XLA_FLAGS (see the module docstring).
REWRITER_FLAG = "--onednn_matmul_rewriter"
if REWRITER_FLAG not in sys.argv[1:]:
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_disable_hlo_passes=onednn-matmul-rewriter".strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
import transformers  # noqa: E402
from step_protocol import (  # noqa: E402
    T5_Z_LOSS,
    PeerChannel,
    Seq2SeqConfig,
    add_config_flags,
    config_from_args,
    make_seq2seq_batch,
    serve,
)


def build(config: Seq2SeqConfig):
    """(step, state): a jitted state -> state update and its initial (params, opt_state, rng)."""
    hf_config = transformers.T5Config(
        vocab_size=config.vocab_size,
        d_model=config.d_model,
        d_kv=config.head_dim,
        d_ff=config.d_ff,
        num_layers=config.num_layers,
        num_decoder_layers=config.num_layers,
        num_heads=config.num_heads,
        relative_attention_num_buckets=config.relative_buckets,
        relative_attention_max_distance=config.relative_max_distance,
        dropout_rate=config.dropout,
        layer_norm_epsilon=1e-6,
        feed_forward_proj="gated-gelu",  # T5 1.1: gelu_new (tanh) gate times a linear branch
        tie_word_embeddings=False,  # T5 1.1: untied lm_head, no D**-0.5 rescaling
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    model = transformers.FlaxT5ForConditionalGeneration(
        hf_config,
        input_shape=(config.batch, config.inputs_length),
        seed=config.seed,
        dtype=jnp.float32,
    )
    batch = {k: jnp.asarray(v) for k, v in make_seq2seq_batch(config).items()}
    tx = optax.adafactor(
        learning_rate=config.learning_rate,
        decay_rate=0.8,
        clipping_threshold=1.0,
        multiply_by_parameter_scale=True,
        min_dim_size_to_factor=128,
    )
    train = config.dropout > 0

    def loss_fn(params, rng):
        logits_BMV = model(
            batch["input_ids"],
            attention_mask=jnp.ones_like(batch["input_ids"]),
            decoder_input_ids=batch["decoder_input_ids"],
            params=params,
            dropout_rng=rng if train else None,
            train=train,
        ).logits
        log_z_BM = jax.nn.logsumexp(logits_BMV, axis=-1)
        cross_entropy_BM = optax.softmax_cross_entropy_with_integer_labels(
            logits_BMV, batch["labels"]
        )
        loss_BM = cross_entropy_BM + T5_Z_LOSS * jnp.square(log_z_BM)
        weights_BM = batch["decoder_loss_weights"]
        return jnp.sum(loss_BM * weights_BM) / jnp.sum(weights_BM)

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
    add_config_flags(parser, Seq2SeqConfig)
    parser.add_argument("--warmup_steps", type=int, default=2)
    parser.add_argument(
        REWRITER_FLAG,
        action="store_true",
        help="keep jaxlib's oneDNN matmul rewrite (slow for HF's position bias; see above)",
    )
    args = parser.parse_args()
    channel = PeerChannel()
    config = config_from_args(args, Seq2SeqConfig)
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
            "onednn_matmul_rewriter": args.onednn_matmul_rewriter,
        },
    )


if __name__ == "__main__":
    main()
