"""One T5 1.1 span-corruption training step of lmsuite vs HuggingFace's
FlaxT5ForConditionalGeneration, side by side.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/seq2seq_step.py \
        --peer_python=.venv-peers/bin/python

Both sides run forward, backward and Adafactor on the same seeded batch
(`step_protocol.make_seq2seq_batch`) at the same config (default 4 encoder + 4 decoder layers,
D=256, H=4 x K=64, gated-GELU F=1024, V=32128, relative positions 32 buckets / distance 128,
inputs 512, targets 114, batch 8, no dropout). lmsuite's side is the step `lmsuite train`
runs: the model from `lmsuite/gin/models/t5_1_1.gin`, the `t5_span_corruption` recipe's objective
(T5X's cross-entropy with z-loss 1e-4), `make_optimizer(name="adafactor", clip_norm=None)`,
`train_state.create_sharded_state` and `step.jit_train_step` on a one-device mesh, fed SeqIO's
unpacked `EncDecFeatureConverter` features. The peer (`peer_flax_t5.py`, its own process and
virtual environment) computes the same loss and uses optax's Adafactor with the same settings;
it turns off one XLA:CPU rewrite of its jaxlib that sends HF's position-biased attention scores
to oneDNN's reference matmul (`--peer_onednn_matmul_rewriter` keeps it; see its docstring).
lmsuite's step also computes what every training step reports (accuracy, sequence accuracy,
gradient norm), which the peer does not.

After both sides have compiled and warmed up, rounds alternate: matmul ceiling, ours, peer. Each
side's figure is its median over rounds; every figure is given by wall time and by each
process's CPU time (`step_protocol.compare`). Tokens count the encoder inputs and the decoder
targets: 8 x (512 + 114) per step.

Model FLOPs are counted analytically (`step_protocol.seq2seq_step_flops`), the same for both
sides, matmuls only, forward + backward = 3 x forward:

    forward per sequence = n (encoder layer + decoder layer) + 2 M D V
    encoder layer = 8 L D A + 4 L^2 A + 6 L D F
    decoder layer = 8 M D A + 4 M^2 A + 4 M D A + 4 L D A + 4 M L A + 6 M D F

with L, M the inputs and targets lengths, A = H K. The ceiling is the best FLOP/s of a jitted
chain of large float32 matmuls, measured in the same rounds.
"""

import argparse
import inspect
import sys
from pathlib import Path

import jax
import numpy as np

# The sibling protocol module, and lmsuite itself when the checkout is not pip-installed.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from lmsuite_step import resident_step  # noqa: E402
from step_protocol import (  # noqa: E402
    T5_Z_LOSS,
    Ours,
    Seq2SeqConfig,
    add_config_flags,
    add_driver_flags,
    compare,
    config_from_args,
    make_seq2seq_batch,
    seq2seq_step_flops,
)

from lmsuite import cli  # noqa: E402
from lmsuite.models import Transformer  # noqa: E402
from lmsuite.objectives import seq2seq  # noqa: E402
from lmsuite.training import optimizers, recipes  # noqa: E402

PEER_SCRIPT = Path(__file__).resolve().parent / "peer_flax_t5.py"


def model_config(config: Seq2SeqConfig):
    """lmsuite's T5 1.1 (`lmsuite/gin/models/t5_1_1.gin`) at the benchmark's sizes."""
    bindings = {
        "d_model": config.d_model,
        "num_heads": config.num_heads,
        "head_dim": config.head_dim,
        "d_ff": config.d_ff,
        "num_layers": config.num_layers,
        "num_decoder_layers": config.num_layers,
        "vocab_size": config.vocab_size,
        "relative_buckets": config.relative_buckets,
        "relative_max_distance": config.relative_max_distance,
        "max_length": max(512, config.inputs_length, config.targets_length),
        "dropout_rate": config.dropout,
        "attention_dropout_rate": config.dropout,
    }
    return cli.model_config_from_gin(
        ["models/t5_1_1.gin"], [f"ModelConfig.{k} = {v!r}" for k, v in bindings.items()]
    )


def build_ours(config: Seq2SeqConfig):
    """(step, state): lmsuite's jitted train step as `state -> state` over one resident batch,
    and its initial (TrainState, metrics)."""
    cfg = model_config(config)
    choice = recipes.make_recipe(name="t5_span_corruption")
    z_loss = choice.loss_options.get(
        "z_loss", inspect.signature(choice.recipe.loss).parameters["z_loss"].default
    )
    if z_loss != T5_Z_LOSS:
        raise ValueError(
            f"recipe t5_span_corruption's loss uses z_loss={z_loss}, the peer "
            f"{T5_Z_LOSS} (step_protocol.T5_Z_LOSS); expected the same loss on both sides"
        )
    objective = recipes.build(choice, model_config=cfg).objective
    model = Transformer(cfg)
    local = {k: v for k, v in make_seq2seq_batch(config).items() if k in seq2seq.FEATURES}
    example = {k: np.zeros((1,) + v.shape[1:], v.dtype) for k, v in local.items()}
    tx = optimizers.make_optimizer(
        name="adafactor", learning_rate=config.learning_rate, clip_norm=None
    )
    return resident_step(
        model=model,
        objective=objective,
        batch_np=local,
        tx=tx,
        init_params=lambda r: model.init({"params": r}, **objective.model_inputs(example))[
            "params"
        ],
        learning_rate=config.learning_rate,
        seed=config.seed,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_config_flags(parser, Seq2SeqConfig)
    add_driver_flags(parser, rounds=5, steps_per_round=2)
    parser.add_argument(
        "--peer_onednn_matmul_rewriter",
        action="store_true",
        help="let the peer's jaxlib 0.4.26 send HF's position-biased attention scores to "
        "oneDNN's reference matmul, as it does by default (peer_flax_t5.py's docstring)",
    )
    args = parser.parse_args()
    config = config_from_args(args, Seq2SeqConfig)
    ours_step, state = build_ours(config)
    ours = Ours(
        step=ours_step,
        state=state,
        block=jax.block_until_ready,
        num_params=lambda s: sum(x.size for x in jax.tree.leaves(s[0].params)),
        loss=lambda s: float(s[1]["loss"]),
    )
    flops = seq2seq_step_flops(config)
    compare(
        args,
        config,
        ours,
        peer_script=PEER_SCRIPT,
        flops={"lmsuite": flops, "HF Flax": flops},
        what="T5 1.1",
        jax_version=jax.__version__,
        peer_args=("--onednn_matmul_rewriter",) if args.peer_onednn_matmul_rewriter else (),
    )


if __name__ == "__main__":
    main()
