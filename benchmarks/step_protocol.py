"""What both sides of the step benchmarks share: the config flags, the seeded batches, the FLOP
counts, the timing loop, the line-JSON protocol between the driver and the peer process, and the
driver's alternating rounds and report.

    model_step.py    lmsuite's BERT MLM step   vs  peer_flax_bert.py: FlaxBertForMaskedLM
    seq2seq_step.py  lmsuite's T5 1.1 step     vs  peer_flax_t5.py: FlaxT5ForConditionalGeneration

The peer side runs in another virtual environment (`.venv-peers`), so this module imports only
the standard library and numpy at module level (the driver's `build_ceiling` imports jax when
called), and the peer scripts import it from their own directory.

Protocol: the driver starts `peer_python benchmarks/peer_*.py <config flags>`. The peer builds
and compiles its step, then writes one JSON line `{"ready": ...}` to stdout (with `num_params`,
`loss`, `warmup_s` and `versions`). Each request line `{"steps": n}` on its stdin is answered by
`{"seconds": t, "cpu_seconds": c, "loss": x}`, the wall and CPU time of n steps and the last
loss. An empty line or end of input ends the peer. Anything else the peer prints goes to stderr.
"""

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

MASK_ID = 103  # BERT's [MASK] in the uncased WordPiece vocabulary
FIRST_REGULAR_ID = 999  # ids below are [PAD], [unused*], [CLS], [SEP], [MASK] in that vocabulary
# T5's SentencePiece vocabulary: 0 pad, 1 </s>, 2 unk, pieces up to 31999, then 100 sentinels
# <extra_id_0> = 32099 down to <extra_id_99> = 32000 (the table is padded to 32128 rows).
T5_EOS_ID = 1
T5_FIRST_REGULAR_ID = 3
T5_FIRST_SENTINEL_ID = 32099
T5_NUM_SENTINELS = 100
# The z-loss weight both sides add, z * (log Z)^2 per target token: T5X's default and the
# `t5_span_corruption` recipe's (seq2seq_step.py checks that the recipe still uses it).
T5_Z_LOSS = 1e-4


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepConfig:
    """The model and batch both sides build: BERT-style post-norm encoder with the MLM head."""

    num_layers: int = 4
    d_model: int = 256
    num_heads: int = 4
    d_ff: int = 1024
    vocab_size: int = 30522
    length: int = 128
    batch: int = 16
    mask_rate: float = 0.15
    dropout: float = 0.0
    learning_rate: float = 1e-4
    weight_decay: float = 0.01
    seed: int = 0

    @property
    def num_predictions(self) -> int:
        """P, the masked positions per sequence: BERT's max(1, round(rate * length)), e.g. 19."""
        return max(1, int(round(self.mask_rate * self.length)))

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.length

    def to_args(self) -> list[str]:
        """The command-line flags that rebuild this config, e.g. ["--num_layers=4", ...]."""
        return [f"--{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)]

    def check(self) -> None:
        """Raises ValueError for a config neither side can build."""
        _check_sizes(self)
        if not 0 < self.num_predictions <= self.length:
            raise ValueError(
                f"mask_rate={self.mask_rate} gives {self.num_predictions} predictions per "
                f"sequence; expected 1..length={self.length}"
            )
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by heads={self.num_heads}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Seq2SeqConfig:
    """The model and batch both sides build: a T5 1.1 encoder-decoder (pre-norm RMSNorm, no
    biases, gated-GELU FFN, relative position buckets, untied output projection).

    `num_layers` is the depth of the encoder and of the decoder each. The lengths are T5's span
    corruption pair: inputs 512, targets 114 (`random_spans_helper(inputs_length=512)`).
    `learning_rate` is a constant (T5's rsqrt schedule is 0.01 for the first 10k steps).
    """

    num_layers: int = 4
    d_model: int = 256
    num_heads: int = 4
    head_dim: int = 64
    d_ff: int = 1024
    vocab_size: int = 32128
    relative_buckets: int = 32
    relative_max_distance: int = 128
    inputs_length: int = 512
    targets_length: int = 114
    batch: int = 8
    dropout: float = 0.0
    learning_rate: float = 0.01
    seed: int = 0

    @property
    def tokens_per_step(self) -> int:
        """Encoder inputs plus decoder targets: 8 x (512 + 114) = 5,008 by default."""
        return self.batch * (self.inputs_length + self.targets_length)

    to_args = StepConfig.to_args

    def check(self) -> None:
        """Raises ValueError for a config neither side can build."""
        _check_sizes(self)
        if self.targets_length < 2:
            raise ValueError(
                f"targets_length={self.targets_length}: the targets need a token and </s>"
            )
        if self.vocab_size <= T5_FIRST_SENTINEL_ID:
            raise ValueError(
                f"vocab_size={self.vocab_size} has no room for T5's sentinels "
                f"(ids {T5_FIRST_SENTINEL_ID - T5_NUM_SENTINELS + 1}..{T5_FIRST_SENTINEL_ID})"
            )


def _check_sizes(config) -> None:
    """Every integer field but the seed is a size or a count, so must be positive."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.type is int and f.name != "seed" and value <= 0:
            raise ValueError(f"--{f.name} must be positive, got {value}")


def add_config_flags(parser: argparse.ArgumentParser, config_cls=StepConfig) -> None:
    """One `--name` flag per field of `config_cls`, defaulting to the field's default."""
    for f in dataclasses.fields(config_cls):
        parser.add_argument(f"--{f.name}", type=type(f.default), default=f.default)


def config_from_args(args: argparse.Namespace, config_cls=StepConfig):
    """The checked `config_cls` that `add_config_flags`' flags describe."""
    config = config_cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(config_cls)})
    config.check()
    return config


def make_batch(config: StepConfig) -> dict[str, np.ndarray]:
    """The seeded MLM batch, in both forms: gathered (ours) and dense (HF's labels).

    Every sequence is full (no padding, as in packed pretraining) with two segments; P positions
    per row, sorted, are replaced by [MASK].

    Example (length 4, P 1): ids [[1500, 2001, 3002, 4003]], position 2 chosen ->
      input_ids [[1500, 2001, 103, 4003]], masked_positions [[2]], masked_ids [[3002]],
      masked_weights [[1.]], labels [[-100, -100, 3002, -100]], label_weights [[0, 0, 1, 0]].
    """
    rng = np.random.default_rng(config.seed)
    shape = (config.batch, config.length)
    ids = rng.integers(FIRST_REGULAR_ID, config.vocab_size, size=shape, dtype=np.int32)
    scores = rng.random(shape)
    positions = np.sort(np.argsort(scores, axis=1)[:, : config.num_predictions], axis=1)
    positions = positions.astype(np.int32)
    rows = np.arange(config.batch)[:, None]
    masked_ids = ids[rows, positions]
    input_ids = ids.copy()
    input_ids[rows, positions] = MASK_ID
    labels = np.full(shape, -100, np.int32)
    labels[rows, positions] = masked_ids
    token_type_ids = np.zeros(shape, np.int32)
    token_type_ids[:, config.length // 2 :] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": np.ones(shape, np.int32),
        "token_type_ids": token_type_ids,
        "masked_positions": positions,
        "masked_ids": masked_ids,
        "masked_weights": np.ones(positions.shape, np.float32),
        "labels": labels,
        "label_weights": (labels >= 0).astype(np.float32),
    }


def make_seq2seq_batch(config: Seq2SeqConfig) -> dict[str, np.ndarray]:
    """The seeded span-corruption-like batch as SeqIO's unpacked `EncDecFeatureConverter` emits
    it, and the same values under HF's names.

    Every row is full (no padding): regular ids with a sentinel every 8th position, </s> last;
    the targets likewise, and the decoder inputs are the targets shifted right after a 0 (T5's
    decoder start id). The step's cost does not depend on the values.

    Example (inputs 4, targets 3, one row, seed 0): encoder_input_tokens [[32099, 20383, 16357,
      1]], decoder_target_tokens [[32099, 1314, 1]], decoder_input_tokens [[0, 32099, 1314]],
      decoder_loss_weights [[1., 1., 1.]]; input_ids = encoder_input_tokens, decoder_input_ids =
      decoder_input_tokens, labels = decoder_target_tokens.
    """
    rng = np.random.default_rng(config.seed)

    def rows(length: int) -> np.ndarray:
        ids = rng.integers(
            T5_FIRST_REGULAR_ID,
            T5_FIRST_SENTINEL_ID - T5_NUM_SENTINELS + 1,
            size=(config.batch, length),
            dtype=np.int32,
        )
        starts = np.arange(0, length - 1, 8)
        ids[:, starts] = T5_FIRST_SENTINEL_ID - np.arange(len(starts)) % T5_NUM_SENTINELS
        ids[:, -1] = T5_EOS_ID
        return ids

    inputs, targets = rows(config.inputs_length), rows(config.targets_length)
    decoder_inputs = np.zeros_like(targets)
    decoder_inputs[:, 1:] = targets[:, :-1]
    return {
        "encoder_input_tokens": inputs,
        "decoder_input_tokens": decoder_inputs,
        "decoder_target_tokens": targets,
        "decoder_loss_weights": np.ones(targets.shape, np.float32),
        "input_ids": inputs,
        "decoder_input_ids": decoder_inputs,
        "labels": targets,
    }


def step_flops(config: StepConfig, *, vocab_rows_per_sequence: int) -> float:
    """Model matmul FLOPs of one training step (forward + backward = 3 x forward).

    Per sequence, with S = length, D = d_model, F = d_ff, V = vocab_size and N rows through the
    MLM head (N = P masked positions for lmsuite, N = S for HF, which scores every position):

        forward = num_layers * (2 S (4 D^2 + 2 D F) + 4 S^2 D) + 2 N (D^2 + D V)

    (Q, K, V and output projections; the two FFN matmuls; attention scores and the weighted sum
    of values, 2 S^2 D each; the head's D x D transform and the tied D x V vocabulary
    projection.) The step is 3 * forward * batch. Embedding lookups, norms, softmax, GELU and the
    optimizer are not counted. For the default config: 56.2 GFLOP (P = 19) vs 138.7 GFLOP.
    """
    s, d, f, v = config.length, config.d_model, config.d_ff, config.vocab_size
    per_layer = 2 * s * (4 * d * d + 2 * d * f) + 4 * s * s * d
    head = 2 * vocab_rows_per_sequence * (d * d + d * v)
    return float(3 * config.batch * (config.num_layers * per_layer + head))


def seq2seq_step_flops(config: Seq2SeqConfig) -> float:
    """Model matmul FLOPs of one encoder-decoder training step (forward + backward = 3 x forward).

    Per sequence, with L = inputs length, M = targets length, D = d_model, A = heads x head_dim
    (the attention width), F = d_ff, V = vocab_size and n = num_layers in each stack:

        encoder layer = 2 L (4 D A) + 4 L^2 A + 2 L (3 D F)
        decoder layer = 2 M (4 D A) + 4 M^2 A                    self-attention
                      + 2 M (2 D A) + 2 L (2 D A) + 4 M L A      cross-attention
                      + 2 M (3 D F)
        forward       = n (encoder layer + decoder layer) + 2 M D V

    (Q, K, V and output projections; attention scores and the weighted sum of values, 2 x query
    length x key length x A each; the gated FFN's three matmuls; cross-attention projects its
    queries and output on the M decoder rows, its keys and values on the L encoder rows in every
    decoder layer; the untied D x V output projection of every target position.) The step is
    3 * forward * batch. Embedding lookups, relative-position biases, norms, softmax, GELU, the
    loss and the optimizer are not counted. For the default config: 219.6 GFLOP.
    """
    length, m = config.inputs_length, config.targets_length
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    a = config.num_heads * config.head_dim
    encoder = 2 * length * 4 * d * a + 4 * length * length * a + 2 * length * 3 * d * f
    self_attention = 2 * m * 4 * d * a + 4 * m * m * a
    cross_attention = 2 * m * 2 * d * a + 2 * length * 2 * d * a + 4 * m * length * a
    decoder = self_attention + cross_attention + 2 * m * 3 * d * f
    forward = config.num_layers * (encoder + decoder) + 2 * m * d * v
    return float(3 * config.batch * forward)


def time_steps(step, state, num_steps: int, block) -> tuple[dict[str, float], object]:
    """Runs `state = step(state)` num_steps times; returns ({"seconds", "cpu_seconds"}, state).

    `block` waits for a state's arrays, so the time covers the computation, not the dispatch.
    `cpu_seconds` is this process's CPU time (all threads): unlike wall time it barely grows
    when other processes compete for the cores, so it gives a load-robust second reading.
    """
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(num_steps):
        state = step(state)
    block(state)
    return {"seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu}, state


class PeerChannel:
    """The peer's end of the protocol: JSON lines on the real stdout; fd 1 then points to stderr
    so that library chatter cannot corrupt the protocol."""

    def __init__(self):
        self._out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def send(self, message: dict) -> None:
        self._out.write(json.dumps(message) + "\n")

    def requests(self):
        """Yields each request dict until an empty line or end of input."""
        for line in sys.stdin:
            if not line.strip():
                return
            yield json.loads(line)


# ------------------------------------------------------------------------- the driver's side
class Peer:
    """The driver's end of the protocol: the peer process and its JSON lines."""

    def __init__(self, python: str, script, config, warmup_steps: int, extra_args=()):
        self.name = os.path.basename(str(script))
        cmd = [python, str(script), *config.to_args(), f"--warmup_steps={warmup_steps}"]
        cmd += list(extra_args)
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self._read()

    def _read(self) -> dict:
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait()
            raise RuntimeError(f"peer {self.name} exited with code {code} (stderr above)")
        return json.loads(line)

    def run(self, steps: int) -> dict:
        self._proc.stdin.write(json.dumps({"steps": steps}) + "\n")
        self._proc.stdin.flush()
        return self._read()

    def close(self):
        self._proc.stdin.write("\n")
        self._proc.stdin.close()
        self._proc.wait(timeout=60)


def add_driver_flags(parser: argparse.ArgumentParser, *, rounds: int, steps_per_round: int):
    """The driver's flags: the peers' python, the rounds and the matmul ceiling's shape."""
    parser.add_argument("--peer_python", required=True, help="python of the peers' venv")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--steps_per_round", type=int, default=steps_per_round)
    parser.add_argument("--warmup_steps", type=int, default=2)
    parser.add_argument("--ceiling_rows", type=int, default=2048)
    parser.add_argument("--ceiling_width", type=int, default=1024)
    parser.add_argument("--ceiling_depth", type=int, default=4)


def build_ceiling(*, rows: int, width: int, depth: int):
    """(run, flops): a jitted chain of `depth` (rows, width) x (width, width) f32 matmuls."""
    import jax
    import jax.numpy as jnp

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ours:
    """lmsuite's side, built by the driver: `step(state) -> state`, its warmed-up state, how to
    wait for a state, and the parameter count and last loss of a state."""

    step: Callable
    state: object
    block: Callable
    num_params: Callable[[object], int]
    loss: Callable[[object], float]


def compare(
    args: argparse.Namespace,
    config,
    ours: Ours,
    *,
    peer_script,
    flops: dict[str, float],
    what: str,
    jax_version: str,
    peer_args: tuple[str, ...] = (),
) -> None:
    """Warms up both sides, checks they built the same model, alternates rounds and reports.

    `flops` is each side's model FLOPs per step ("lmsuite", "HF Flax"); `what` names the model
    in the error raised when the parameter counts differ; `peer_args` are flags for the peer
    script beyond the config's. After both sides have compiled and
    warmed up, rounds alternate: matmul ceiling, ours, peer, so that load from other processes
    hits both alike.
    """
    if args.rounds <= 0 or args.steps_per_round <= 0:
        raise ValueError(
            f"rounds={args.rounds} and steps_per_round={args.steps_per_round} must be positive"
        )
    start = time.perf_counter()
    _, state = time_steps(ours.step, ours.state, max(args.warmup_steps, 1), ours.block)
    ours_params = ours.num_params(state)
    print(
        f"ours: compiled and warmed up in {time.perf_counter() - start:.1f}s, "
        f"{ours_params:,} params, loss {ours.loss(state):.3f}",
        flush=True,
    )
    ceiling, ceiling_flops = build_ceiling(
        rows=args.ceiling_rows, width=args.ceiling_width, depth=args.ceiling_depth
    )
    peer = Peer(args.peer_python, peer_script, config, args.warmup_steps, peer_args)
    if peer.ready["num_params"] != ours_params:
        peer.close()
        raise ValueError(
            f"the sides build different models: lmsuite has {ours_params:,} parameters, "
            f"HF Flax {peer.ready['num_params']:,}; expected the same {what} config on both"
        )
    print(
        f"peer: compiled and warmed up in {peer.ready['warmup_s']:.1f}s, "
        f"{peer.ready['num_params']:,} params, loss {peer.ready['loss']:.3f}, "
        f"{peer.ready['versions']}",
        flush=True,
    )

    ours_times, peer_times, ceiling_times = [], [], []
    per_step = lambda t: {k: v / args.steps_per_round for k, v in t.items()}
    show = lambda t: f"{t['seconds'] * 1e3:.0f} ms/step ({t['cpu_seconds'] * 1e3:.0f} ms CPU)"
    for r in range(args.rounds):
        ceiling_times.append(best_times(ceiling, 3))
        times, state = time_steps(ours.step, state, args.steps_per_round, ours.block)
        ours_times.append(per_step(times))
        reply = peer.run(args.steps_per_round)
        peer_times.append(per_step({k: reply[k] for k in ("seconds", "cpu_seconds")}))
        ceiling_gflops = ceiling_flops / ceiling_times[-1]["seconds"] / 1e9
        print(
            f"round {r}: ceiling {ceiling_gflops:.1f} GFLOP/s, ours {show(ours_times[-1])}, "
            f"peer {show(peer_times[-1])}",
            flush=True,
        )
    peer.close()
    print(f"losses after the rounds: ours {ours.loss(state):.3f}, peer {reply['loss']:.3f}")
    report(
        config,
        ours_times,
        peer_times,
        ceiling_times,
        ceiling_flops,
        flops=flops,
        jax_version=jax_version,
        peer_versions=peer.ready["versions"],
    )


def report(
    config,
    ours,
    peer,
    ceiling,
    ceiling_flops: float,
    *,
    flops: dict[str, float],
    jax_version: str,
    peer_versions: dict,
) -> None:
    """Prints tokens/s, the ratio, and model FLOP/s against the ceiling, by wall and CPU time.

    Each side's step time is its median over rounds; the ceiling is its best round.
    """
    print(f"\nconfig: {config}")
    print(
        f"lmsuite on jax {jax_version}, HF Flax on {peer_versions}; "
        f"{len(ours)} rounds, medians over rounds"
    )
    if peer_versions["jax"] != jax_version:
        print(
            f"  note: the sides run different jax versions: {jax_version} vs {peer_versions['jax']}"
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


def serve(channel, step, state, *, warmup_steps: int, block, leaves, versions: dict) -> None:
    """The peer's whole protocol: warm up, send `ready` (with the parameter count and library
    versions), then answer each `{"steps": n}` request with the time of n steps.

    `state` is (params, opt_state, rng, loss); `block` waits for a state's arrays and `leaves`
    lists a tree's arrays (jax's, passed in so that this module imports no jax). `channel` is
    the `PeerChannel` the peer opened before building its model (so that library chatter while
    building goes to stderr).
    """
    start = time.perf_counter()
    _, state = time_steps(step, state, max(warmup_steps, 1), block)
    channel.send(
        {
            "ready": True,
            "warmup_s": time.perf_counter() - start,
            "loss": float(state[3]),
            "num_params": int(sum(x.size for x in leaves(state[0]))),
            "versions": versions,
        }
    )
    for request in channel.requests():
        times, state = time_steps(step, state, int(request["steps"]), block)
        channel.send({**times, "loss": float(state[3])})
