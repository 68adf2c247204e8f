"""Examples/s of lmsuite's span corruption against t5 0.9.4's, on identical input, same run.

Each side runs in its own process: lmsuite in this interpreter's venv, t5 in the peers venv
(`.venv-peers`, built by `make bench` from benchmarks/peers-requirements.txt). The processes
alternate, round after round; each warms up before it is timed. Both read the same documents
(600 random token ids each, a fixed seed) and produce T5's span-corruption examples for inputs
length 512 / targets length 114 (568 raw tokens per chunk). Afterwards the lmsuite process also
times each of the other seq2seq/LM-family preprocessors, and then every objective's full pipeline:
`seqio.get_dataset` of each `wiki_sample_{objective}` task (and `peoples_daily_ernie`) at length
128, end to end (corpus source, tokenization, preprocessing, the feature converter training uses),
on one iterator after a warm-up, capped at `--objective_rows` rows per objective.

    .venv/bin/python benchmarks/data_pipeline.py --peer_python=.venv-peers/bin/python
    .venv/bin/python benchmarks/data_pipeline.py --full_only   # that table alone
    .venv/bin/python benchmarks/data_pipeline.py --full_only --tasks=xlnet,ernie   # some rows

The pipeline is drained inside tf.data (`take(n).reduce`), so Python iteration does not cap the
rate. Rates are medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VOCAB_SIZE = 32100
DOC_LENGTH = 600
NUM_DOCS = 2048
SEQUENCE_LENGTH = {"inputs": 512, "targets": 114}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _documents():
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.integers(10, VOCAB_SIZE - 100, size=(NUM_DOCS, DOC_LENGTH), dtype=np.int32)


def _source():
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices({"targets": _documents()}).repeat()


def _time(ds, *, num_examples: int, warmup: int) -> list[float]:
    """[examples/s, CPU microseconds per example] draining `num_examples` after `warmup`.

    CPU time (all threads of the process) is the steadier figure on a busy machine.
    """
    import tensorflow as tf

    count = lambda n: ds.take(n).reduce(tf.constant(0, tf.int64), lambda c, _: c + 1)
    count(warmup)
    start, cpu = time.perf_counter(), time.process_time()
    got = int(count(num_examples))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return [got / wall, 1e6 * cpu / got]


def _t5_pipeline():
    import seqio
    import t5.data.preprocessors as t5_prep

    vocabulary = seqio.PassThroughVocabulary(size=VOCAB_SIZE)
    features = {k: seqio.Feature(vocabulary) for k in ("inputs", "targets")}
    return t5_prep.span_corruption(
        _source(), sequence_length=SEQUENCE_LENGTH, output_features=features
    )


def _span_corruption():
    sys.path.insert(0, REPO)
    from lmsuite.data.preprocessors import span_corruption

    sentinels = [VOCAB_SIZE - 1 - i for i in range(100)]
    return span_corruption.span_corruption(
        _source(), sequence_length=SEQUENCE_LENGTH, sentinel_ids=sentinels
    )


def _lmsuite_pipelines():
    """name -> zero-argument builder of each lmsuite objective on the benchmark documents."""
    sys.path.insert(0, REPO)
    import tensorflow as tf

    from lmsuite.data.preprocessors import bart, lm, mass, span_corruption, unilm, xlnet

    sentinels = [VOCAB_SIZE - 1 - i for i in range(100)]
    src = _source

    def sentences():
        # The same documents as 30 sentences of 20 tokens, for sentence permutation.
        split = lambda x: tf.RaggedTensor.from_uniform_row_length(x["targets"], 20)
        return src().map(lambda x: {"sentence_ids": split(x)})

    return {
        "span_corruption": _span_corruption,
        "iid_denoising": lambda: span_corruption.iid_denoising(
            src(), sequence_length=SEQUENCE_LENGTH, sentinel_ids=sentinels
        ),
        "prefix_lm": lambda: lm.prefix_lm(src(), sequence_length={"inputs": 512}),
        "full_lm": lambda: lm.full_lm(src(), sequence_length={"targets": 512}, eos_id=6),
        "causal_lm": lambda: lm.causal_lm(src(), sequence_length={"targets": 512}),
        "bart_text_infilling": lambda: bart.text_infilling(
            lm.split_documents(src(), chunk_length=511), mask_id=4
        ),
        "bart_sentence_permutation": lambda: bart.sentence_permutation(sentences()),
        "bart_denoising": lambda: bart.bart_denoising(
            sentences(), sequence_length={"targets": 512}, mask_id=4
        ),
        "mass": lambda: mass.mass(
            src(), sequence_length={"inputs": 512}, mask_id=4, eos_id=6, vocab_size=VOCAB_SIZE
        ),
        "unilm": lambda: unilm.unilm(
            src(),
            sequence_length={"targets": 512},
            cls_id=2,
            sep_id=3,
            mask_id=4,
            vocab_size=VOCAB_SIZE,
            special_ids=(0, 1, 2, 3, 4, 5, 6),
        ),
        "xlnet": lambda: xlnet.permutation_lm(
            sentences(), sequence_length={"input_k": 512}, cls_id=2, sep_id=3, eod_id=6
        ),
    }


def _full_pipelines():
    """label -> (task, task feature lengths, feature converter, token features), length 128.

    Converters and lengths are the ones training uses: each trainable objective's recipe
    (`lmsuite/training/recipes.py`, its default packing) and, for the objectives that have data
    but no recipe yet, the converter `recipes.DATA_ONLY` names.
    """
    sys.path.insert(0, REPO)
    from lmsuite.data import tasks
    from lmsuite.models import ModelConfig
    from lmsuite.training import recipes

    token_keys = {
        "input_ids": ("input_ids",),
        "encoder_input_tokens": ("encoder_input_tokens", "decoder_target_tokens"),
        "input_k": ("input_k",),
        "targets": ("targets",),  # Transformer-XL's streams
    }

    def tokens_of(converter):
        features = converter.MODEL_FEATURES
        for first, keys in token_keys.items():
            if first in features:
                return keys
        return ("decoder_target_tokens",)

    def label_fill(recipe):
        """A multi-task row's labels, -1 where a task lacks one, as training fills them."""
        built = recipes.build(
            recipes.make_recipe(name=recipe.name), model_config=ModelConfig(type_vocab_size=2)
        )
        return dict(built.objective.label_heads) or None

    rows = {}
    for recipe in recipes.RECIPES.values():
        fill = label_fill(recipe)
        for objective in recipe.task_objectives:
            converter = recipe.converter(pack=recipe.pack)
            label = objective if objective not in rows else f"{objective} ({recipe.name})"
            rows[label] = (
                objective,
                recipe.lengths_for(128),
                converter,
                tokens_of(converter),
                fill,
            )
    for entry in recipes.DATA_ONLY.values():
        converter = entry.converter()
        rows[entry.objective] = (
            entry.objective,
            entry.lengths_for(128),
            converter,
            tokens_of(converter),
            None,
        )
    out = {}
    for label, (objective, lengths, converter, keys, fill) in rows.items():
        zh_only = tasks.OBJECTIVES[objective].languages == ("zh",)
        corpus = "peoples_daily" if zh_only else "wiki_sample"
        out[f"{corpus}_{label}"] = (f"{corpus}_{objective}", lengths, converter, keys, fill)
    # The packed MLM converter (not the training default), for its cost and its gain.
    mlm = recipes.RECIPES["bert_mlm"]
    for name in ("wiki_sample_bert_mlm", "peoples_daily_ernie"):
        converter = mlm.converter(pack=True)
        out[f"{name} (packed)"] = (name, mlm.lengths_for(128), converter, ("input_ids",), None)
    return out


def _time_full(
    task, lengths, converter, token_keys, label_fill, *, rows: int, warmup: int
) -> list[float]:
    """[rows/s, examples/s, tokens/s, CPU microseconds per row] of one task's full pipeline.

    Rows are what the converter emits; a packed row holds several examples (its largest
    segment id). Tokens are the non-padding entries of `token_keys`. `label_fill`: a
    multi-task recipe's labels, filled with -1 where the task has none (as training does).
    """
    import tensorflow as tf

    from lmsuite.data import mixtures

    ds = mixtures.get_dataset(
        task,
        task_feature_lengths=lengths,
        feature_converter=converter,
        along=None,
        dataset_split="train",
        shuffle=False,
        num_epochs=None,
        seed=0,
        label_fill=label_fill,
    )
    segments = [k for k in ds.element_spec if k.endswith("_segment_ids")]

    def stats(ex):
        tokens = sum(tf.reduce_sum(tf.cast(ex[k] != 0, tf.int64)) for k in token_keys)
        examples = tf.reduce_max(tf.cast(ex[segments[0]], tf.int64)) if segments else 1
        return tf.stack([tf.constant(1, tf.int64), tf.cast(examples, tf.int64), tokens])

    batch = 32
    batches = iter(ds.map(stats).batch(batch))
    for _ in range(max(1, warmup // batch)):
        next(batches)
    start, cpu = time.perf_counter(), time.process_time()
    total = sum(next(batches).numpy().sum(axis=0) for _ in range(max(1, rows // batch)))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return [total[0] / wall, total[1] / wall, total[2] / wall, 1e6 * cpu / total[0]]


def worker(side: str, *, num_examples: int, warmup: int, tasks: str = "") -> dict[str, list[float]]:
    import seqio

    if side == "objectives_full":
        pipelines = _full_pipelines()
        wanted = [t for t in tasks.split(",") if t]
        chosen = {k: v for k, v in pipelines.items() if not wanted or any(t in k for t in wanted)}
        if not chosen:
            raise ValueError(f"--tasks={tasks!r} matches none of {sorted(pipelines)}")
        return {
            label: _time_full(*spec, rows=num_examples, warmup=warmup)
            for label, spec in chosen.items()
        }
    if side == "t5":
        builders = {"span_corruption": _t5_pipeline}
    elif side == "lmsuite":
        builders = {"span_corruption": _span_corruption}
    else:
        builders = _lmsuite_pipelines()
    rates = {}
    for name, build in builders.items():
        with seqio.utils.map_seed_manager(0):
            ds = build()
        rates[name] = _time(ds, num_examples=num_examples, warmup=warmup)
    return rates


def _run_worker(python: str, side: str, args) -> dict[str, list[float]]:
    cmd = [python, os.path.abspath(__file__), f"--worker={side}"]
    cmd += [f"--num_examples={args.num_examples}", f"--warmup={args.warmup}"]
    cmd += [f"--tasks={getattr(args, 'tasks', '')}"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer_python", default=os.path.join(REPO, ".venv-peers/bin/python"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num_examples", type=int, default=4000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--objective_rows", type=int, default=1024)
    parser.add_argument("--objective_warmup", type=int, default=64)
    parser.add_argument("--full_only", action="store_true", help="only the full-pipeline table")
    parser.add_argument(
        "--tasks", default="", help="full-pipeline rows whose label has one of these substrings"
    )
    parser.add_argument("--worker", choices=["lmsuite", "t5", "objectives", "objectives_full"])
    args = parser.parse_args()
    if args.worker:
        rates = worker(
            args.worker, num_examples=args.num_examples, warmup=args.warmup, tasks=args.tasks
        )
        print(json.dumps(rates))
        return
    if args.full_only:
        _print_full(args)
        return
    if not os.path.exists(args.peer_python):
        raise ValueError(f"--peer_python={args.peer_python} does not exist; run `make bench`")

    ours, theirs = [], []
    for r in range(args.rounds):
        ours.append(_run_worker(sys.executable, "lmsuite", args)["span_corruption"])
        theirs.append(_run_worker(args.peer_python, "t5", args)["span_corruption"])
        print(
            f"round {r}: lmsuite {ours[-1][0]:8.1f} ex/s ({ours[-1][1]:5.0f} us CPU/ex)"
            f"   t5 0.9.4 {theirs[-1][0]:8.1f} ex/s ({theirs[-1][1]:5.0f} us CPU/ex)"
        )
    rate_a, rate_b = (statistics.median(x[0] for x in runs) for runs in (ours, theirs))
    cpu_a, cpu_b = (statistics.median(x[1] for x in runs) for runs in (ours, theirs))
    print(
        f"span_corruption (inputs 512, targets 114, 600-token documents), median of {args.rounds}:"
    )
    print(f"  lmsuite   {rate_a:9.1f} examples/s  {cpu_a:6.0f} us CPU/example")
    print(f"  t5 0.9.4  {rate_b:9.1f} examples/s  {cpu_b:6.0f} us CPU/example")
    print(f"  ratio lmsuite / t5 = {rate_a / rate_b:.2f}x examples/s, {cpu_b / cpu_a:.2f}x CPU")
    print("lmsuite objectives (one run each):")
    for name, (rate, cpu) in _run_worker(sys.executable, "objectives", args).items():
        print(f"  {name:26s} {rate:9.1f} examples/s  {cpu:6.0f} us CPU/example")
    _print_full(args)


def _print_full(args) -> None:
    full = argparse.Namespace(
        num_examples=args.objective_rows, warmup=args.objective_warmup, tasks=args.tasks
    )
    print(
        f"examples/s of every objective's full pipeline (source -> converter, length 128, "
        f"{args.objective_rows} rows after {args.objective_warmup} warm-up, one run each):"
    )
    print(
        f"  {'task':36s} {'rows/s':>9s} {'examples/s':>11s} {'tokens/s':>10s} {'us CPU/row':>11s}"
    )
    for name, (rows, examples, tokens, cpu) in _run_worker(
        sys.executable, "objectives_full", full
    ).items():
        print(f"  {name:36s} {rows:9.1f} {examples:11.1f} {tokens:10.0f} {cpu:11.0f}")


if __name__ == "__main__":
    main()
