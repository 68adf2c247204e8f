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
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

# The sibling protocol module, and lmsuite itself when the checkout is not pip-installed.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from step_protocol import (  # noqa: E402
    StepConfig,
    add_config_flags,
    config_from_args,
    make_batch,
    step_flops,
    time_steps,
)

from lmsuite.models import ModelConfig, Transformer  # noqa: E402

PEER_SCRIPT = Path(__file__).resolve().parent / "peer_flax_bert.py"


def build_ours(config: StepConfig):
    """(step, state): a jitted state -> state update and its initial (params, opt_state, rng)."""
    model_config = ModelConfig(
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


def build_ceiling(*, rows: int, width: int, depth: int):
    """(run, flops): a jitted chain of `depth` (rows, width) x (width, width) f32 matmuls."""
    rng = np.random.default_rng(0)
    w_NDD = jnp.asarray(rng.standard_normal((depth, width, width), np.float32) / np.sqrt(width))
    x_RD = jnp.asarray(rng.standard_normal((rows, width), np.float32))

    @jax.jit
    def chain(x_RD, w_NDD):
        for i in range(depth):
            x_RD = x_RD @ w_NDD[i]
        return x_RD

    chain(x_RD, w_NDD).block_until_ready()
    return (lambda: chain(x_RD, w_NDD).block_until_ready()), 2.0 * rows * width * width * depth


def best_times(run, repeats: int) -> dict[str, float]:
    """The smallest wall and CPU seconds of `repeats` calls of run()."""
    best = {"seconds": float("inf"), "cpu_seconds": float("inf")}
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        best["seconds"] = min(best["seconds"], time.perf_counter() - wall)
        best["cpu_seconds"] = min(best["cpu_seconds"], time.process_time() - cpu)
    return best


class Peer:
    """The driver's end of the protocol: the peer process and its JSON lines."""

    def __init__(self, python: str, config: StepConfig, warmup_steps: int):
        cmd = [python, str(PEER_SCRIPT), *config.to_args(), f"--warmup_steps={warmup_steps}"]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self._read()

    def _read(self) -> dict:
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait()
            raise RuntimeError(f"peer {PEER_SCRIPT.name} exited with code {code} (stderr above)")
        return json.loads(line)

    def run(self, steps: int) -> dict:
        self._proc.stdin.write(json.dumps({"steps": steps}) + "\n")
        self._proc.stdin.flush()
        return self._read()

    def close(self):
        self._proc.stdin.write("\n")
        self._proc.stdin.close()
        self._proc.wait(timeout=60)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_config_flags(parser)
    parser.add_argument("--peer_python", required=True, help="python of the peers' venv")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps_per_round", type=int, default=3)
    parser.add_argument("--warmup_steps", type=int, default=2)
    parser.add_argument("--ceiling_rows", type=int, default=2048)
    parser.add_argument("--ceiling_width", type=int, default=1024)
    parser.add_argument("--ceiling_depth", type=int, default=4)
    args = parser.parse_args()
    config = config_from_args(args)
    if args.rounds <= 0 or args.steps_per_round <= 0:
        raise ValueError(
            f"rounds={args.rounds} and steps_per_round={args.steps_per_round} must be positive"
        )

    start = time.perf_counter()
    ours_step, state = build_ours(config)
    _, state = time_steps(ours_step, state, max(args.warmup_steps, 1), jax.block_until_ready)
    ours_params = sum(x.size for x in jax.tree.leaves(state[0]))
    print(
        f"ours: compiled and warmed up in {time.perf_counter() - start:.1f}s, "
        f"{ours_params:,} params, loss {float(state[3]):.3f}",
        flush=True,
    )
    ceiling, ceiling_flops = build_ceiling(
        rows=args.ceiling_rows, width=args.ceiling_width, depth=args.ceiling_depth
    )
    peer = Peer(args.peer_python, config, args.warmup_steps)
    if peer.ready["num_params"] != ours_params:
        peer.close()
        raise ValueError(
            f"the sides build different models: lmsuite has {ours_params:,} parameters, "
            f"HF Flax {peer.ready['num_params']:,}; expected the same BERT config on both"
        )
    print(
        f"peer: compiled and warmed up in {peer.ready['warmup_s']:.1f}s, "
        f"{peer.ready['num_params']:,} params, loss {peer.ready['loss']:.3f}, "
        f"{peer.ready['versions']}",
        flush=True,
    )

    ours, peer_times, ceiling_times = [], [], []
    per_step = lambda t: {k: v / args.steps_per_round for k, v in t.items()}
    for r in range(args.rounds):
        ceiling_times.append(best_times(ceiling, 3))
        times, state = time_steps(ours_step, state, args.steps_per_round, jax.block_until_ready)
        ours.append(per_step(times))
        reply = peer.run(args.steps_per_round)
        peer_times.append(per_step({k: reply[k] for k in ("seconds", "cpu_seconds")}))
        show = lambda t: f"{t['seconds'] * 1e3:.0f} ms/step ({t['cpu_seconds'] * 1e3:.0f} ms CPU)"
        ceiling_gflops = ceiling_flops / ceiling_times[-1]["seconds"] / 1e9
        print(
            f"round {r}: ceiling {ceiling_gflops:.1f} GFLOP/s, ours {show(ours[-1])}, "
            f"peer {show(peer_times[-1])}",
            flush=True,
        )
    peer.close()
    report(config, ours, peer_times, ceiling_times, ceiling_flops, peer.ready["versions"])


def report(config: StepConfig, ours, peer, ceiling, ceiling_flops: float, peer_versions: dict):
    """Prints tokens/s, the ratio, and model FLOP/s against the ceiling, by wall and CPU time.

    Each side's step time is its median over rounds; the ceiling is its best round.
    """
    flops = {
        "lmsuite": step_flops(config, vocab_rows_per_sequence=config.num_predictions),
        "HF Flax": step_flops(config, vocab_rows_per_sequence=config.length),
    }
    print(f"\nconfig: {config}")
    print(
        f"lmsuite on jax {jax.__version__}, HF Flax on {peer_versions}; "
        f"{len(ours)} rounds, medians over rounds"
    )
    if peer_versions["jax"] != jax.__version__:
        print(
            f"  note: the sides run different jax versions: "
            f"{jax.__version__} vs {peer_versions['jax']}"
        )
    for clock, unit in (("seconds", "s"), ("cpu_seconds", "CPU-s")):
        top = ceiling_flops / min(c[clock] for c in ceiling) / 1e9
        print(
            f"by {'wall' if clock == 'seconds' else 'CPU'} time (matmul ceiling "
            f"{top:.1f} GFLOP/{unit}):"
        )
        medians = {}
        for name, times in (("lmsuite", ours), ("HF Flax", peer)):
            t = medians[name] = statistics.median(x[clock] for x in times)
            achieved = flops[name] / t / 1e9
            print(
                f"  {name:8s} {config.tokens_per_step / t:8.0f} tokens/{unit:5s} "
                f"{t * 1e3:7.0f} ms/step  {flops[name] / 1e9:6.1f} GFLOP/step  "
                f"{achieved:6.1f} GFLOP/{unit} = {100 * achieved / top:5.1f}% of ceiling"
            )
        print(
            f"  ratio lmsuite / HF = {medians['HF Flax'] / medians['lmsuite']:.2f} (target >= 1.5)"
        )


if __name__ == "__main__":
    main()
