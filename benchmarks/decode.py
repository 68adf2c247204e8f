"""Greedy decoding tokens/s: lmsuite's cached decoder vs HuggingFace's FlaxGPT2LMHeadModel.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/decode.py --peer_python=.venv-peers/bin/python

Both sides decode the same prompts with the same weights: lmsuite builds a random GPT-2
(default L=2 layers, D=128, H=4, V=2048, 256 positions), writes it with `lmsuite.convert.to_hf`
(safetensors + config.json), and the peer (this file run with `--serve`, under the peers'
python: transformers 4.57 is the last release with Flax models) loads that directory into
FlaxGPT2LMHeadModel. Each side jits its whole `generate` (HF Flax's is a lax.while_loop with its
own cache, as lmsuite's is), the outputs are checked to be the same tokens, and after warm-up
rounds alternate: lmsuite cached, lmsuite uncached (full recomputation each step), peer, so
that load from other processes hits all alike. Figures are medians over rounds of
batch * new tokens / wall seconds. No EOS id: every row decodes max_new_tokens.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def add_flags(parser: argparse.ArgumentParser):
    parser.add_argument("--num_layers", type=int, default=2)
    parser.add_argument("--d_model", type=int, default=128)
    parser.add_argument("--num_heads", type=int, default=4)
    parser.add_argument("--vocab_size", type=int, default=2048)
    parser.add_argument("--max_length", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt_length", type=int, default=16)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls_per_round", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)


def _prompts(args):
    import numpy as np

    rng = np.random.default_rng(args.seed)
    return rng.integers(0, args.vocab_size, (args.batch, args.prompt_length)).astype(np.int32)


def _time_calls(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


# ------------------------------------------------------------------------------ the peer
def serve(args):
    """Loads the model directory into FlaxGPT2LMHeadModel; answers {"calls": n} with timings."""
    import jax
    import numpy as np
    import transformers

    model = transformers.FlaxGPT2LMHeadModel.from_pretrained(args.model_dir)
    ids = jax.numpy.asarray(_prompts(args))
    generate = jax.jit(
        lambda params, ids: (
            model.generate(
                ids, params=params, max_new_tokens=args.max_new_tokens, do_sample=False
            ).sequences
        )
    )
    run = lambda: np.asarray(generate(model.params, ids))  # noqa: E731
    start = time.perf_counter()
    tokens = run()
    reply = dict(
        warmup_s=time.perf_counter() - start,
        tokens=tokens.tolist(),
        versions=f"transformers {transformers.__version__}, jax {jax.__version__}",
    )
    print(json.dumps(reply), flush=True)
    for line in sys.stdin:
        calls = json.loads(line)["calls"]
        print(json.dumps({"seconds": _time_calls(run, calls)}), flush=True)


# ---------------------------------------------------------------------------- the driver
def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_flags(parser)
    parser.add_argument("--peer_python", default=None, help="python of .venv-peers")
    parser.add_argument("--serve", action="store_true", help="run as the peer")
    parser.add_argument("--model_dir", default=None)
    args = parser.parse_args()
    if args.serve:
        return serve(args)
    if args.peer_python is None:
        parser.error("--peer_python is required (the python of .venv-peers)")

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import flax.linen as nn
    import jax
    import numpy as np

    from lmsuite.convert import TokenIds, to_hf
    from lmsuite.evaluation.decoding import generate
    from lmsuite.models import ModelConfig, Transformer

    config = ModelConfig(
        architecture="decoder",
        vocab_size=args.vocab_size,
        d_model=args.d_model,
        num_heads=args.num_heads,
        d_ff=4 * args.d_model,
        num_layers=args.num_layers,
        max_length=args.max_length,
        type_vocab_size=0,
        activation="gelu_tanh",
        norm_eps=1e-5,
        norm_position="pre",
        embedding_norm=False,
        final_norm=True,
        heads=("lm",),
        output_bias=False,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        init_stddev=0.2,  # peaked next-token distributions: no near-ties for argmax to split
    )
    ids = _prompts(args)
    init = Transformer(config).init(jax.random.PRNGKey(args.seed), ids[:1])["params"]
    params = jax.tree.map(np.asarray, nn.meta.unbox(init))
    new_tokens = args.batch * args.max_new_tokens

    def ours(use_cache):
        call = lambda: generate(  # noqa: E731
            config,
            params,
            input_ids=ids,
            max_new_tokens=args.max_new_tokens,
            use_cache=use_cache,
        )
        start = time.perf_counter()
        tokens = call()
        print(f"lmsuite use_cache={use_cache}: compiled in {time.perf_counter() - start:.1f}s")
        return call, tokens

    cached, cached_tokens = ours(True)
    uncached, uncached_tokens = ours(False)
    with tempfile.TemporaryDirectory() as model_dir:
        # A random model over no vocabulary: no EOS, so both sides run max_new_tokens.
        no_eos = TokenIds(eos=None, bos=None)
        to_hf(config, params, model_dir, hf_class="GPT2LMHeadModel", special_ids=no_eos)
        flags = [f"--{k}={v}" for k, v in vars(args).items() if k not in ("peer_python", "serve")]
        flags = [f for f in flags if not f.startswith("--model_dir")] + [f"--model_dir={model_dir}"]
        peer = subprocess.Popen(
            [args.peer_python, __file__, "--serve", *flags],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = json.loads(peer.stdout.readline())
    print(f"peer: compiled in {ready['warmup_s']:.1f}s, {ready['versions']}")
    peer_tokens = np.asarray(ready["tokens"])
    same = peer_tokens.shape == cached_tokens.shape and (peer_tokens == cached_tokens).all()
    print(
        f"same tokens: lmsuite cached vs HF Flax {bool(same)}, "
        f"cached vs uncached {bool((cached_tokens == uncached_tokens).all())}"
    )

    times = {"cached": [], "uncached": [], "peer": []}
    for r in range(args.rounds):
        times["cached"].append(_time_calls(cached, args.calls_per_round))
        times["uncached"].append(_time_calls(uncached, args.calls_per_round))
        peer.stdin.write(json.dumps({"calls": args.calls_per_round}) + "\n")
        peer.stdin.flush()
        times["peer"].append(json.loads(peer.stdout.readline())["seconds"])
        print(
            f"round {r}: "
            + ", ".join(f"{k} {new_tokens / v[-1]:.0f} tok/s" for k, v in times.items()),
            flush=True,
        )
    peer.stdin.close()
    peer.wait()
    rate = {k: new_tokens / statistics.median(v) for k, v in times.items()}
    print(
        f"greedy decoding, batch {args.batch}, prompt {args.prompt_length}, "
        f"{args.max_new_tokens} new tokens, L={args.num_layers} D={args.d_model} "
        f"V={args.vocab_size} (jax {jax.__version__}):"
    )
    print(f"  lmsuite cached    {rate['cached']:8.0f} tokens/s")
    print(f"  lmsuite uncached  {rate['uncached']:8.0f} tokens/s")
    print(f"  HF Flax generate  {rate['peer']:8.0f} tokens/s")
    print(f"  ratio lmsuite cached / HF Flax: {rate['cached'] / rate['peer']:.2f}x")
    print(f"  ratio lmsuite cached / uncached: {rate['cached'] / rate['uncached']:.2f}x")


if __name__ == "__main__":
    main()
