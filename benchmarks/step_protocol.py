"""What both sides of `model_step.py` share: the config flags, the seeded batch, the FLOP count,
the timing loop and the line-JSON protocol between the driver and the peer process.

The peer side runs in another virtual environment (`.venv-peers`), so this module imports only
the standard library and numpy, and the peer script imports it from its own directory.

Protocol: the driver starts `peer_python benchmarks/peer_flax_bert.py <config flags>`. The peer
builds and compiles its step, then writes one JSON line `{"ready": ...}` to stdout. Each request
line `{"steps": n}` on its stdin is answered by `{"seconds": t, "cpu_seconds": c, "loss": x}`,
the wall and CPU time of n steps and the last loss. An
empty line or end of input ends the peer. Anything else the peer prints goes to stderr.
"""

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np

MASK_ID = 103  # BERT's [MASK] in the uncased WordPiece vocabulary
FIRST_REGULAR_ID = 999  # ids below are [PAD], [unused*], [CLS], [SEP], [MASK] in that vocabulary


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


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One `--name` flag per StepConfig field, defaulting to the field's default."""
    for f in dataclasses.fields(StepConfig):
        parser.add_argument(f"--{f.name}", type=type(f.default), default=f.default)


def config_from_args(args: argparse.Namespace) -> StepConfig:
    config = StepConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(StepConfig)})
    for name in ("num_layers", "d_model", "num_heads", "d_ff", "vocab_size", "length", "batch"):
        if getattr(config, name) <= 0:
            raise ValueError(f"--{name} must be positive, got {getattr(config, name)}")
    if not 0 < config.num_predictions <= config.length:
        raise ValueError(
            f"mask_rate={config.mask_rate} gives {config.num_predictions} predictions per "
            f"sequence; expected 1..length={config.length}"
        )
    if config.d_model % config.num_heads:
        raise ValueError(f"d_model={config.d_model} is not divisible by heads={config.num_heads}")
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
