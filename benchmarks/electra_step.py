"""ELECTRA's joint training step (generator + sampling + discriminator) against lmsuite's own MLM
step on the discriminator's config, side by side in one process.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/electra_step.py

Both sides are the step `lmsuite train` runs (`resident_step`: `create_sharded_state` and
`jit_train_step` on a one-device mesh, the state donated) on the same seeded MLM batch
(`step_protocol.make_batch`: full rows, two segments, P = round(0.15 L) predictions). The MLM
side is an encoder with the MLM head at the discriminator's sizes (`lmsuite/gin/models/
electra_small_discriminator.gin` with the flags' sizes, E = 128), trained by `objectives.mlm`;
the ELECTRA side is the same discriminator joined by a generator of `--generator_fraction` its
width (`ModelConfig.electra`), trained by the `electra` recipe's loss (MLM + 50 x RTD). The
ratio says what the generator, the sampling and the discriminator's second pass over the whole
sequence cost per token.

After both have compiled and warmed up, rounds alternate which side goes first, so that load
from other processes hits both alike; each side's figure is its median over rounds, by wall time
and by the process's CPU time. Tokens are batch x seq per step.
"""

import argparse
import sys
from pathlib import Path

import jax

# The sibling protocol module, and lmsuite itself when the checkout is not pip-installed.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from lmsuite_step import print_medians, resident_step  # noqa: E402
from step_protocol import (  # noqa: E402
    StepConfig,
    add_config_flags,
    config_from_args,
    make_batch,
    time_steps,
)

from lmsuite import cli  # noqa: E402
from lmsuite.models import Transformer, summary  # noqa: E402
from lmsuite.models.option_groups import ElectraOptions  # noqa: E402
from lmsuite.objectives import mlm  # noqa: E402
from lmsuite.objectives.electra import electra  # noqa: E402
from lmsuite.training import optimizers  # noqa: E402

MLM_FEATURES = ("input_ids", "token_type_ids", "masked_positions", "masked_ids", "masked_weights")


def model_configs(config: StepConfig, fraction: float):
    """(the MLM encoder, the joint ELECTRA model) at the benchmark's sizes, without dropout."""
    bindings = {
        "ModelConfig.d_model": config.d_model,
        "ModelConfig.num_heads": config.num_heads,
        "ModelConfig.d_ff": config.d_ff,
        "ModelConfig.num_layers": config.num_layers,
        "ModelConfig.vocab_size": config.vocab_size,
        "ModelConfig.max_length": max(512, config.length),
        "ModelConfig.dropout_rate": config.dropout,
        "ModelConfig.attention_dropout_rate": config.dropout,
        "ModelConfig.head_activation": "gelu",
    }
    disc = cli.model_config_from_gin(
        ["models/electra_small_discriminator.gin"], [f"{k} = {v!r}" for k, v in bindings.items()]
    )
    joint = disc.replace(
        heads=("mlm", "rtd"), electra=ElectraOptions(generator_hidden_fraction=fraction)
    )
    return disc.replace(heads=("mlm",)), joint


def build(config: StepConfig, model_config, objective, batch_np):
    """(step, state) of `resident_step` for one side."""
    model = Transformer(model_config)
    example = {k: v[:1] for k, v in batch_np.items()}
    tx = optimizers.make_optimizer(
        name="adamw",
        learning_rate=config.learning_rate,
        clip_norm=1.0,
        weight_decay=config.weight_decay,
    )
    return resident_step(
        model=model,
        objective=objective,
        batch_np=batch_np,
        tx=tx,
        init_params=lambda rng: model.init({"params": rng}, **objective.model_inputs(example))[
            "params"
        ],
        learning_rate=config.learning_rate,
        seed=config.seed,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_config_flags(parser)
    parser.add_argument("--generator_fraction", type=float, default=0.25)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps_per_round", type=int, default=3)
    parser.add_argument("--warmup_steps", type=int, default=2)
    args = parser.parse_args()
    config = config_from_args(args)
    if args.rounds <= 0 or args.steps_per_round <= 0 or args.warmup_steps < 0:
        raise ValueError(
            f"rounds={args.rounds} and steps_per_round={args.steps_per_round} must be "
            f"positive, warmup_steps={args.warmup_steps} not negative"
        )
    full = make_batch(config)
    batch_np = {k: full[k] for k in MLM_FEATURES} | {"input_mask": full["attention_mask"]}
    mlm_config, joint_config = model_configs(config, args.generator_fraction)
    counts = {
        "MLM": summary.summarize(mlm_config)["total"],
        "ELECTRA": summary.summarize(joint_config)["total"],
    }
    sides = {}
    for name, model_config, objective in (
        ("MLM", mlm_config, mlm()),
        ("ELECTRA", joint_config, electra()),
    ):
        run, state = build(config, model_config, objective, batch_np)
        _, state = time_steps(run, state, 1 + args.warmup_steps, jax.block_until_ready)
        sides[name] = [run, state]
        print(f"{name}: {counts[name]:,} params, compiled and warmed up", flush=True)

    times = {name: [] for name in sides}
    for r in range(args.rounds):
        for name in list(sides) if r % 2 == 0 else list(reversed(sides)):
            run, state = sides[name]
            t, sides[name][1] = time_steps(run, state, args.steps_per_round, jax.block_until_ready)
            times[name].append({k: v / args.steps_per_round for k, v in t.items()})
        line = ", ".join(f"{n} {times[n][-1]['seconds'] * 1e3:.0f} ms/step" for n in sides)
        print(f"round {r}: {line}", flush=True)
    losses = {n: float(s[1][1]["loss"]) for n, s in sides.items()}
    print(f"losses after the rounds: {losses}")

    print(f"\nconfig: {config}, generator_fraction {args.generator_fraction}")
    print(f"jax {jax.__version__}; {args.rounds} rounds of {args.steps_per_round} steps, medians")
    print_medians(
        times,
        tokens_per_step=config.tokens_per_step,
        side="ELECTRA",
        against="MLM",
        label="ELECTRA / MLM tokens/s",
    )


if __name__ == "__main__":
    main()
