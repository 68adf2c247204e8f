"""One XLNet permutation-LM training step of lmsuite vs HuggingFace's torch XLNetLMHeadModel,
side by side in one process.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/xlnet_step.py

Both sides train the same model from the same weights on the same seeded batch (default 4
layers, D=256, H=4 x K=64, F=1024, V=32000, seq 256, mem_len = reuse_len = 128, 42 predictions,
batch 8, attn_type "bi", untie_r, no dropout, float32). lmsuite's side is the step `lmsuite train`
runs: the model from `lmsuite/gin/models/xlnet.gin`, `plm.permutation_lm()` (its memory in
`state.carry`), `make_optimizer(name="adamw")` with clipping at 1.0, `create_sharded_state` and
`jit_train_step` on a one-device mesh, the state donated. HF's side is the usual torch loop:
forward with `labels` and `use_mems=True`, backward, `clip_grad_norm_(1.0)`, `torch.optim.AdamW`
with lmsuite's weight-decay mask, `zero_grad`; each step feeds the previous step's `mems`.

The weights are HF's initialisation, converted into lmsuite with `lmsuite.convert.from_hf`, and
both sides start from zero memory. The first two steps double as a check that the sides compute
the same thing: the first loss (same weights, zero memory) must agree to 1e-4 relative, the
second (after one update, with the carried memory) to 1e-3. The gin config must equal the
converted one field by field.

The sides share the process, so torch runs on as many threads as XLA:CPU's pool (the cores
this process may use). torch's OpenMP runtime (libgomp) spin-waits at every barrier by default,
which on a shared machine turns other processes' load into torch's own: a thread spins out its
time slice waiting for a sibling the scheduler has parked. So torch runs with
OMP_WAIT_POLICY=PASSIVE, its faster setting on the shared machine (RESULTS.md), unless the
environment chose a policy; `--torch_spin_wait` keeps libgomp's default.

After both have warmed up, rounds alternate which side goes first, so that load from other
processes hits both alike; each side's figure is its median over rounds, by wall time and by
the process's CPU time (all threads), which moves less than wall time when other processes
compete for the cores. Tokens are batch x seq per step.
"""

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np

# The sibling protocol module, and lmsuite itself when the checkout is not pip-installed.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from lmsuite_step import print_medians, resident_step  # noqa: E402
from step_protocol import time_steps  # noqa: E402

from lmsuite import cli  # noqa: E402
from lmsuite.convert import from_hf  # noqa: E402
from lmsuite.models import Transformer, memory_shapes  # noqa: E402
from lmsuite.objectives import plm  # noqa: E402
from lmsuite.training import optimizers  # noqa: E402

FIRST_REGULAR_ID = 10  # XLNet's SentencePiece vocabulary keeps its control symbols below
FIRST_LOSS_RTOL = 1e-4
SECOND_LOSS_RTOL = 1e-3
CLIP_NORM = 1.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class XLNetStepConfig:
    """The model, batch and optimizer both sides build."""

    num_layers: int = 4
    d_model: int = 256
    num_heads: int = 4
    d_ff: int = 1024
    vocab_size: int = 32000
    length: int = 256
    mem_len: int = 128
    num_predictions: int = 42
    batch: int = 8
    learning_rate: float = 1e-4
    weight_decay: float = 0.01
    seed: int = 0

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.length


def make_batch(config: XLNetStepConfig) -> dict[str, np.ndarray]:
    """A seeded PLM batch as `PermutationLmFeatureConverter` emits it, mid-stream.

    Each row predicts P random positions in a random order: perm_mask[i, j] = 1 (i may not see
    j) where j is predicted and ranks no earlier than i, non-predicted positions ranking before
    every prediction, so they see each other but no prediction. Two segments of L / 2;
    stream_step 1 so that the carried memory is kept.

    Example (L 3, P 1, position 1 predicted): perm_mask [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
      target_mapping [[[0, 1, 0]]], target [[input_k[0, 1]]].
    """
    rng = np.random.default_rng(config.seed)
    shape = (config.batch, config.length)
    ids = rng.integers(FIRST_REGULAR_ID, config.vocab_size, size=shape, dtype=np.int32)
    order = np.argsort(rng.random(shape), axis=1)
    positions = np.sort(order[:, : config.num_predictions], axis=1)
    rank = np.full(shape, -1, np.int64)
    rows = np.arange(config.batch)[:, None]
    rank[rows, order[:, : config.num_predictions]] = np.arange(config.num_predictions)
    predicted = rank >= 0
    perm_mask = predicted[:, None, :] & (rank[:, None, :] >= rank[:, :, None])
    seg_id = np.zeros(shape, np.int32)
    seg_id[:, config.length // 2 :] = 1
    return {
        "input_k": ids,
        "seg_id": seg_id,
        "perm_mask": perm_mask.astype(np.float32),
        "target_mapping": np.eye(config.length, dtype=np.float32)[positions],
        "target": ids[rows, positions],
        "target_mask": np.ones(positions.shape, np.float32),
        "stream_step": np.ones(config.batch, np.int32),
    }


def gin_model_config(config: XLNetStepConfig):
    """lmsuite's XLNet (`models/xlnet.gin`) at the benchmark's sizes, without dropout."""
    bindings = {
        "ModelConfig.d_model": config.d_model,
        "ModelConfig.num_heads": config.num_heads,
        "ModelConfig.d_ff": config.d_ff,
        "ModelConfig.num_layers": config.num_layers,
        "ModelConfig.vocab_size": config.vocab_size,
        "ModelConfig.dropout_rate": 0.0,
        "ModelConfig.attention_dropout_rate": 0.0,
        "XLNetOptions.mem_len": config.mem_len,
        "XLNetOptions.reuse_len": config.mem_len,
    }
    return cli.model_config_from_gin(
        ["models/xlnet.gin"], [f"{k} = {v!r}" for k, v in bindings.items()]
    )


def build_hf(config: XLNetStepConfig):
    """HF's XLNetLMHeadModel at the same config, in training mode, with its own init."""
    import torch
    import transformers

    torch.manual_seed(config.seed)
    hf_config = transformers.XLNetConfig(
        vocab_size=config.vocab_size,
        d_model=config.d_model,
        n_layer=config.num_layers,
        n_head=config.num_heads,
        d_inner=config.d_ff,
        mem_len=config.mem_len,
        reuse_len=config.mem_len,
        attn_type="bi",
        untie_r=True,
        dropout=0.0,
        ff_activation="gelu",
    )
    return transformers.XLNetLMHeadModel(hf_config)


def build_ours(config: XLNetStepConfig, model_config, params, batch_np):
    """(step, state): lmsuite's jitted train step as `state -> (TrainState, metrics)` over one
    resident batch, and its initial state with zero memory."""
    model, objective = Transformer(model_config), plm.permutation_lm()
    example = {k: v[:1] for k, v in batch_np.items()}
    abstract = jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), **objective.model_inputs(example))["params"]
    )
    tx = optimizers.make_optimizer(
        name="adamw",
        learning_rate=config.learning_rate,
        clip_norm=CLIP_NORM,
        weight_decay=config.weight_decay,
    )
    return resident_step(
        model=model,
        objective=objective,
        batch_np=batch_np,
        tx=tx,
        init_params=lambda _: jax.tree.map(
            lambda box, value: box.replace_boxed(value),
            abstract,
            params,
            is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned),
        ),
        learning_rate=config.learning_rate,
        seed=config.seed,
        carry_shapes=memory_shapes(model_config, config.batch),
    )


def build_hf_step(config: XLNetStepConfig, hf_model, batch_np):
    """(step, state): one torch training step as `(mems, loss) -> (mems, loss)`, and its
    initial state with zero memory (HF's mems are time-major, (mem_len, B, D) per layer)."""
    import torch

    hf_model.train()
    groups = {True: [], False: []}
    for name, p in hf_model.named_parameters():  # the tied LM weight is listed once
        groups[optimizers.takes_decay(name.replace(".", "/"))].append(p)
    optimizer = torch.optim.AdamW(
        [
            {"params": groups[True], "weight_decay": config.weight_decay},
            {"params": groups[False], "weight_decay": 0.0},
        ],
        lr=config.learning_rate,
        eps=1e-6,
    )
    inputs = {
        "input_ids": torch.from_numpy(batch_np["input_k"]).long(),
        "token_type_ids": torch.from_numpy(batch_np["seg_id"]).long(),
        "perm_mask": torch.from_numpy(batch_np["perm_mask"]),
        "target_mapping": torch.from_numpy(batch_np["target_mapping"]),
        "labels": torch.from_numpy(batch_np["target"]).long(),
    }

    def run(state):
        mems, _ = state
        out = hf_model(**inputs, mems=mems, use_mems=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(hf_model.parameters(), CLIP_NORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return list(out.mems), out.loss.detach()

    zeros = torch.zeros(config.mem_len, config.batch, config.d_model)
    return run, ([zeros.clone() for _ in range(config.num_layers)], None)


def check_same_config(ours, converted) -> None:
    """Raises ValueError naming every field where the gin config and HF's converted differ."""
    diff = {
        f.name: (getattr(ours, f.name), getattr(converted, f.name))
        for f in dataclasses.fields(ours)
        if getattr(ours, f.name) != getattr(converted, f.name)
    }
    if diff:
        raise ValueError(
            f"models/xlnet.gin at the benchmark's sizes differs from HF's converted config "
            f"in {diff} (gin, HF); expected the same model on both sides"
        )


def check_losses(which: str, ours: float, hf: float, rtol: float) -> None:
    print(
        f"{which} loss: lmsuite {ours:.6f}, HF {hf:.6f}, relative difference "
        f"{abs(ours - hf) / abs(hf):.1e}",
        flush=True,
    )
    if not np.isclose(ours, hf, rtol=rtol, atol=0):
        raise ValueError(
            f"the sides compute different steps: {which} loss lmsuite {ours:.6f} vs HF "
            f"{hf:.6f}, expected agreement to {rtol:g} relative"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for f in dataclasses.fields(XLNetStepConfig):
        parser.add_argument(f"--{f.name}", type=type(f.default), default=f.default)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps_per_round", type=int, default=2)
    parser.add_argument("--warmup_steps", type=int, default=1, help="after the two checked")
    parser.add_argument(
        "--torch_spin_wait",
        action="store_true",
        help="leave torch's OpenMP threads spin-waiting, libgomp's default (the docstring)",
    )
    args = parser.parse_args()
    if "torch" in sys.modules:
        raise RuntimeError(
            "torch was imported before main() could choose libgomp's wait policy, which it "
            "reads once, when torch loads it"
        )
    if not args.torch_spin_wait:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    import transformers

    wait_policy = os.environ.get("OMP_WAIT_POLICY", "libgomp's default: spin, then sleep")
    config = XLNetStepConfig(
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(XLNetStepConfig)}
    )
    if args.rounds <= 0 or args.steps_per_round <= 0 or args.warmup_steps < 0:
        raise ValueError(
            f"rounds={args.rounds} and steps_per_round={args.steps_per_round} must be "
            f"positive, warmup_steps={args.warmup_steps} not negative"
        )
    threads = len(os.sched_getaffinity(0))  # XLA:CPU's intra-op pool takes these cores
    torch.set_num_threads(threads)

    batch_np = make_batch(config)
    hf_model = build_hf(config)
    converted = from_hf(hf_model)
    model_config = gin_model_config(config)
    check_same_config(model_config, converted.config)
    ours_params = sum(x.size for x in jax.tree.leaves(converted.params))
    hf_params = sum(p.numel() for p in hf_model.parameters())
    if ours_params != hf_params:
        raise ValueError(f"lmsuite has {ours_params:,} parameters, HF {hf_params:,}")

    ours_step, ours_state = build_ours(config, model_config, converted.params, batch_np)
    hf_step, hf_state = build_hf_step(config, hf_model, batch_np)
    ours_loss = lambda s: float(s[1]["loss"])
    hf_loss = lambda s: float(s[1])
    start = time.perf_counter()
    ours_state = ours_step(ours_state)
    first = ours_loss(ours_state)
    ours_state = ours_step(ours_state)
    compiled_s = time.perf_counter() - start
    hf_state = hf_step(hf_state)
    check_losses("first", first, hf_loss(hf_state), FIRST_LOSS_RTOL)
    hf_state = hf_step(hf_state)
    check_losses("second", ours_loss(ours_state), hf_loss(hf_state), SECOND_LOSS_RTOL)
    if args.warmup_steps:
        _, ours_state = time_steps(ours_step, ours_state, args.warmup_steps, jax.block_until_ready)
        _, hf_state = time_steps(hf_step, hf_state, args.warmup_steps, lambda _: None)
    print(
        f"{ours_params:,} params; lmsuite compiled and ran 2 steps in {compiled_s:.1f}s; "
        f"torch on {threads} threads, OMP_WAIT_POLICY {wait_policy}",
        flush=True,
    )

    times = {"lmsuite": [], "HF torch": []}
    sides = {
        "lmsuite": [ours_step, ours_state, jax.block_until_ready],
        "HF torch": [hf_step, hf_state, lambda _: None],
    }
    show = lambda t: f"{t['seconds'] * 1e3:.0f} ms/step ({t['cpu_seconds'] * 1e3:.0f} ms CPU)"
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            run, state, block = sides[name]
            t, sides[name][1] = time_steps(run, state, args.steps_per_round, block)
            times[name].append({k: v / args.steps_per_round for k, v in t.items()})
        print(
            f"round {r}: lmsuite {show(times['lmsuite'][-1])}, HF {show(times['HF torch'][-1])}",
            flush=True,
        )
    print(
        f"losses after the rounds: lmsuite {ours_loss(sides['lmsuite'][1]):.4f}, "
        f"HF {hf_loss(sides['HF torch'][1]):.4f}"
    )

    print(f"\nconfig: {config}")
    print(
        f"lmsuite on jax {jax.__version__}, HF on transformers {transformers.__version__} + "
        f"torch {torch.__version__}; {args.rounds} rounds of {args.steps_per_round} steps, "
        "medians over rounds"
    )
    print_medians(
        times,
        tokens_per_step=config.tokens_per_step,
        side="lmsuite",
        against="HF torch",
        label="lmsuite / HF (target >= 1.5)",
    )


if __name__ == "__main__":
    main()
