"""The encoder objectives' data statistics against their references, in one table (issue 12).

    JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python benchmarks/objective_statistics.py
        [--quick] [--only=electra,bert_mlm,...]

Each statistic is measured here with the lmsuite task or preprocessor that its test in
tests/data/ draws from, against the reference value that test asserts. A statistic is a share
of draws (sigma = sqrt(p (1 - p) / n) under the reference p), a mean (sigma = the reference
law's standard deviation / sqrt(n)), or an exact rule checked on every row (sigma "exact": the
share of rows that keep the rule must be 1, or of draws that break it 0). Each pool holds at
least 20,000 predictions; where the statistic is per row, per document or per sampler draw
(short-sequence, NSP, SOP and sentence-relation shares, UniLM modes, the n-gram and span-length
samplers) at least 20,000 of those; `n` says what was counted. `--quick` divides every pool by
five (a smoke run, below the issue's 20,000). Prints a markdown table; exits 1 if any |z| > 5
or any exact rule is broken. About two minutes on one core.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Callable

import numpy as np
import seqio
import tensorflow as tf

import lmsuite.data.tasks  # noqa: F401  (registers the wiki_sample_* tasks)
from lmsuite.data import vocab as vocab_lib
from lmsuite.data.preprocessors import (
    ernie,
    mlm,
    ngram,
    sentence_pairs,
    spanbert,
    structbert,
    unilm,
)

MIN_POOL = 20_000
LIMIT = 5.0  # the |z| allowed
CLS, SEP, MASK = vocab_lib.CLS_ID, vocab_lib.SEP_ID, vocab_lib.MASK_ID
SPECIALS = tuple(range(7))  # [PAD] [UNK] [CLS] [SEP] [MASK] <s> </s> of the synthetic rows
FIRST_TOKEN = 100  # synthetic token ids start here, clear of the specials
BERT = "google-research/bert create_pretraining_data.py"
ALBERT = "google-research/albert create_pretraining_data.py"


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table; `sigma` 0 marks an exact rule."""

    task: str
    statistic: str
    reference: float
    source: str
    measured: float
    n: int
    sigma: float

    @property
    def z(self) -> float:
        if self.sigma == 0:
            return 0.0 if math.isclose(self.measured, self.reference) else math.inf
        return (self.measured - self.reference) / self.sigma


def shares(task: str, entries) -> list[Row]:
    """Rows of Bernoulli rates: entries (statistic, count, n, reference p, source); a p of 0 or
    1 is an exact rule."""
    rows = []
    for statistic, count, n, p, source in entries:
        if n == 0:
            raise ValueError(f"{task}: {statistic}: nothing was counted")
        sigma = math.sqrt(p * (1 - p) / n)
        rows.append(Row(task, statistic, p, source, count / n, n, sigma))
    return rows


def mean(task, statistic, values, reference, sd, source) -> Row:
    """The mean of `values` against `reference`, sigma = sd / sqrt(n)."""
    values = np.asarray(values, float)
    n = len(values)
    return Row(task, statistic, reference, source, float(values.mean()), n, sd / math.sqrt(n))


def _task_rows(name, length, *, predictions=None, rows=None):
    """Rows of the registered task `name` at {"input_ids": length} (train split, unshuffled),
    until `predictions` are pooled or `rows` are taken; and the task's vocabulary."""
    task = seqio.get_mixture_or_task(name)
    ds = task.get_dataset({"input_ids": length}, split="train", shuffle=False, seed=0)
    out, pooled = [], 0
    for row in ds.as_numpy_iterator():
        out.append(row)
        pooled += int(row["masked_weights"].sum())
        if (predictions is not None and pooled >= predictions) or len(out) == rows:
            return out, task.output_features["input_ids"].vocabulary
    raise ValueError(f"{name}: the split ran out at {len(out)} rows, {pooled} predictions")


def _predictions(row):
    """(count, ids at the predicted positions after corruption, the original ids)."""
    k = int(row["masked_weights"].sum())
    return k, row["input_ids"][row["masked_positions"][:k]], row["masked_ids"][:k]


def _pooled(rows):
    """`_predictions` of many rows: counts per row, new and original ids pooled."""
    counts, new, old = zip(*(_predictions(r) for r in rows), strict=True)
    return np.array(counts), np.concatenate(new), np.concatenate(old)


def electra(scale) -> list[Row]:
    rows, _ = _task_rows("wiki_sample_electra", 128, predictions=MIN_POOL // scale)
    counts, new, old = _pooled(rows)
    randoms = int(((new != MASK) & (new != old)).sum())
    want = [max(1, min(19, round(0.15 * len(r["input_ids"])))) for r in rows]
    counts_ok = int((counts == np.array(want)).sum())
    src = "google-research/electra pretrain/pretrain_helpers.py mask()"
    count_src = f"{src}: round(0.15 sum(input_mask)), N = int((0.15 + 0.005) 128) = 19"
    return shares(
        "wiki_sample_electra L=128",
        [
            ("[MASK] share", int((new == MASK).sum()), len(new), 0.85, f"{src}: uniform < 0.85"),
            ("kept share", int((new == old).sum()), len(new), 0.15, f"{src}: otherwise kept"),
            ("random share", randoms, len(new), 0.0, f"{src}: no random branch"),
            ("rows with k = max(1, min(19, round(0.15 len)))", counts_ok, len(rows), 1, count_src),
        ],
    )


def bert_mlm(scale) -> list[Row]:
    rows, vocab = _task_rows("wiki_sample_bert_mlm", 128, predictions=MIN_POOL // scale)
    special = vocab_lib.special_ids(vocab).all
    pool = vocab.vocab_size - len(set(special) | {MASK})
    counts, new, old = _pooled(rows)
    is_random = (new != MASK) & (new != old)
    budget_ok = 0
    for row, k in zip(rows, counts, strict=True):
        original = row["input_ids"].copy()
        original[row["masked_positions"][:k]] = row["masked_ids"][:k]
        n = int((~np.isin(original, special)).sum())
        budget_ok += k == min(19, max(1, round(0.15 * n)), n)
    src = f"{BERT} create_masked_lm_predictions()"
    budget_src = (
        "tests/data/test_mlm.py test_budget_is_exact...: n = maskable tokens (BERT's "
        "num_to_predict also counts [CLS]/[SEP]); 19 = lmsuite's default width int(0.155 L)"
    )
    return shares(
        "wiki_sample_bert_mlm L=128",
        [
            ("[MASK] share", int((new == MASK).sum()), len(new), 0.8, f"{src}: 80%"),
            (
                "random share", int(is_random.sum()), len(new), 0.1 - 0.1 / pool,
                f"{src}: 10%, less the draws equal to the original (1 in {pool} ids)",
            ),
            (
                "kept share", int((new == old).sum()), len(new), 0.1 + 0.1 / pool,
                f"{src}: 10%, plus the random draws equal to the original",
            ),
            (
                "random ids that are special", int(np.isin(new[is_random], special).sum()),
                int(is_random.sum()), 0.0, "mlm.MlmSpec.replacement_ids: non-special ids only",
            ),
            ("rows with k = min(19, max(1, round(0.15 n)), n)", budget_ok, len(rows), 1.0,
             budget_src),
        ],
    )  # fmt: skip


def _sentence_corpus(sentence_lengths) -> tf.data.Dataset:
    """Documents of sentences of distinct token ids, as the sentence-pair steps read them.

    Example: [[2, 1], [3]] -> sentence_ids [[100, 101], [102]], then [[103, 104, 105]].
    """
    per_doc = np.array([len(d) for d in sentence_lengths], np.int64)
    lengths = np.concatenate([np.asarray(d, np.int64) for d in sentence_lengths])
    tokens = (FIRST_TOKEN + np.arange(lengths.sum()) % 50_000).astype(np.int32)
    ids = tf.RaggedTensor.from_nested_row_lengths(tokens, [per_doc, lengths])
    return tf.data.Dataset.from_tensor_slices({sentence_pairs.IDS_KEY: ids})


def _per_document(docs, objective, feature, **kwargs):
    """`feature` of each document's instances (`sentence_pairs.instances_per_document`)."""
    ds = sentence_pairs.instances_per_document(
        _sentence_corpus(docs), objective=objective, cls_id=CLS, sep_id=SEP, **kwargs
    )
    return ds.map(lambda d: d[feature]).as_numpy_iterator()


def bert_pairs(scale) -> list[Row]:
    num_docs = MIN_POOL // scale
    # 45 one-token sentences per document at max_seq_length 24 (21 tokens): one-token
    # sentences reach a target exactly, so a first row is short iff its target was.
    max_len, k = 24, 21
    short, a_lengths = 0, []
    for rows in _per_document([[1] * 45] * num_docs, "mlm", "input_ids", seed=3, max_seq_length=24):
        first = rows[0]
        short += len(first) < max_len
        if len(first) == max_len:  # k one-token sentences, A = a uniform 1..k-1 of them
            a_lengths.append(int(np.argmax(first == SEP)) - 1)
    # NSP: two short sentences per document make one chunk; its first pair's label is the
    # draw, and a random B sends sentence 1 back as a one-sentence chunk, random again.
    rng = np.random.default_rng(0)
    two = [rng.integers(1, 5, size=2) for _ in range(num_docs)]
    random_first = put_back = 0
    for labels in _per_document(
        two, "nsp", "next_sentence_label", seed=0, max_seq_length=64, short_seq_prob=0.0,
        buffer_size=64,
    ):  # fmt: skip
        random_first += int(labels[0])
        put_back += labels.tolist() == ([1, 1] if labels[0] else [0])
    src = f"{BERT} create_instances_from_document()"
    t = "sentence_pairs (synthetic docs)"
    p_short = 0.1 * (1 - 1 / (k - 1))
    short_src = f"{src}: short_seq_prob 0.1 x P(randint(2, {k}) < {k})"
    a_sd = math.sqrt(((k - 1) ** 2 - 1) / 12)
    return [
        *shares(f"{t}, mlm L=24", [("short first rows", short, num_docs, p_short, short_src)]),
        mean(f"{t}, mlm L=24", "A sentences, full first rows", a_lengths, k / 2, a_sd,
             f"{src}: a_end = randint(1, {k - 1})"),
        *shares(
            f"{t}, nsp",
            [
                ("random next (first pair)", random_first, num_docs, 0.5,
                 f"{src}: rng.random() < 0.5"),
                ("unused sentence put back", put_back, num_docs, 1.0,
                 f"{src}: num_unused_segments"),
            ],
        ),
    ]  # fmt: skip


def albert(scale) -> list[Row]:
    rng = np.random.default_rng(2)
    docs = [rng.integers(1, 5, size=int(rng.integers(8, 21))) for _ in range(8000 // scale)]
    sop = sentence_pairs.sentence_pairs(
        _sentence_corpus(docs), objective="sop", seed=0, max_seq_length=16, cls_id=CLS,
        sep_id=SEP, short_seq_prob=0.0, buffer_size=64,
    )  # fmt: skip
    labels = np.fromiter(sop.map(lambda x: x["sentence_order_label"]).as_numpy_iterator(), int)
    n = 3 * MIN_POOL // scale
    three = ngram.sample_ngram_lengths([n], seed=tf.constant([5, 6])).numpy()
    pvals = f"{ALBERT} create_masked_lm_predictions(): pvals = 1 / arange(1, 4), normalised"
    ngrams = [
        (f"p(n = {m})", int((three == m).sum()), n, p, f"{pvals}: {round(11 * p)}/11")
        for m, p in zip([1, 2, 3], ngram.ngram_probabilities(3), strict=True)
    ]
    # Three one-piece words, budget 2: ALBERT draws n from every length whatever is left of the
    # row and cuts the n-gram at its end, so the last two words are covered 9/22 of the time
    # (a draw among the n-grams that fit: 7/18); worked in docs/objectives.md.
    chosen = tf.data.Dataset.range(n).map(
        lambda i: ngram.choose_ngrams(
            tf.ones([3], tf.bool), tf.ones([3], tf.int32), tf.constant(2), seed=tf.stack([i, 3]),
            max_ngram=3,
        )
    )  # fmt: skip
    last_two = sum(
        int((batch == [False, True, True]).all(axis=1).sum())
        for batch in chosen.batch(2000).as_numpy_iterator()
    )
    cut = f"{ALBERT}: ngrams[:len(cand_index_set)] (all 3), cand_indexes[idx:idx + n]"
    budget_two = [("last two of three words covered, budget 2", last_two, n, 9 / 22, cut)]
    rows, _ = _task_rows("wiki_sample_albert_sop", 512, rows=1000 // scale)
    counts = np.array([int(r["masked_weights"].sum()) for r in rows])
    full = np.array([len(r["input_ids"]) >= 140 for r in rows])  # round(0.15 * 138) > 20
    cap = f"{ALBERT} / run_pretraining.py: max_predictions_per_seq 20 at max_seq_length 512"
    swap = f"{ALBERT} create_instances_from_document(): rng.random() < 0.5"
    return [
        *shares("sentence_pairs sop (synthetic docs) L=16",
                [("swap share", int(labels.sum()), len(labels), 0.5, swap)]),
        *shares("ngram.sample_ngram_lengths", ngrams),
        *shares("ngram.choose_ngrams", budget_two),
        *shares(
            "wiki_sample_albert_sop L=512",
            [
                ("rows over 20 predictions", int((counts > 20).sum()), len(rows), 0.0, cap),
                ("rows of >= 140 tokens with 20", int((counts[full] == 20).sum()),
                 int(full.sum()), 1.0, cap),
            ],
        ),
    ]  # fmt: skip


def _worded_rows(num, *, seed, min_words=10, max_words=200, max_pieces=3):
    """(input_ids, word_starts) of `[CLS] words [SEP] words [SEP]`, words of 1..max_pieces."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(num):
        num_words = int(rng.integers(min_words, max_words + 1))
        cut = int(rng.integers(1, num_words))
        ids, starts = [CLS], [1]
        for w in range(num_words):
            if w == cut:
                ids, starts = ids + [SEP], starts + [1]
            pieces = int(rng.integers(1, max_pieces + 1))
            ids += rng.integers(FIRST_TOKEN, 5000, size=pieces).tolist()
            starts += [1] + [0] * (pieces - 1)
        rows.append((np.array(ids + [SEP], np.int32), np.array(starts + [1], np.int32)))
    return rows


def _map_rows(rows, fn, **kwargs):
    """`fn(features, seed=[0, i], **kwargs)` on each (input_ids, word_starts) row, in order."""
    sig = {k: tf.TensorSpec([None], tf.int32) for k in ("input_ids", "word_starts")}
    gen = lambda: ({"input_ids": i, "word_starts": s} for i, s in rows)
    ds = tf.data.Dataset.from_generator(gen, output_signature=sig).enumerate()
    seed = lambda i: tf.stack([tf.constant(0, tf.int64), i])
    ds = ds.map(lambda i, f: fn(f, seed=seed(i), **kwargs), num_parallel_calls=tf.data.AUTOTUNE)
    return list(ds.as_numpy_iterator())


def _masked_in_groups(rows, masker, **kwargs):
    """A task's dynamic masking, `masker(dataset, **kwargs)` (rows masked a group at a time),
    over the (input_ids, word_starts) rows, in order."""
    sig = {k: tf.TensorSpec([None], tf.int32) for k in ("input_ids", "word_starts")}
    gen = lambda: ({"input_ids": i, "word_starts": s} for i, s in rows)
    with seqio.map_seed_manager(0):
        masked = masker(tf.data.Dataset.from_generator(gen, output_signature=sig), **kwargs)
    return list(masked.as_numpy_iterator())


def span_bert(scale) -> list[Row]:
    paper = "Joshi et al. 2020 (SpanBERT) sec. 3.1"
    n = 3 * MIN_POOL // scale
    lengths = spanbert.sample_span_lengths([n], seed=tf.constant([3, 4])).numpy()
    pmf = spanbert.span_length_probabilities(p=0.2, max_length=10)
    support = np.arange(1, 11)
    mu = spanbert.expected_span_length(p=0.2, max_length=10)
    sd = math.sqrt(float(np.sum(support**2 * pmf)) - mu**2)
    geo = f"{paper}: Geo(0.2) clipped at 10"
    sampler = "spanbert.sample_span_lengths"
    out = [mean(sampler, "span length (words)", lengths, mu, sd, f"{geo}; closed-form mean")]
    pmf_src = lambda m: f"{geo}: 0.2 0.8^{m - 1} / (1 - 0.8^10)"
    out += shares(
        sampler,
        [
            (f"p(l = {m})", int((lengths == m).sum()), n, p, pmf_src(m))
            for m, p in zip(support, pmf, strict=True)
        ],
    )
    spec = mlm.MlmSpec(mask_id=MASK, vocab_size=5000, special_ids=SPECIALS, max_predictions=80)
    rows = _worded_rows(4500 // scale, seed=1)
    budget_ok = runs = all_masked = word_aligned = predictions = 0
    masked = _masked_in_groups(rows, spanbert.spanbert_dynamic_mlm, spec=spec)
    for (ids, starts), x in zip(rows, masked, strict=True):
        m = int((~np.isin(ids, SPECIALS)).sum())
        k = int(x["masked_weights"].sum())
        budget_ok += k == min(80, max(1, round(0.15 * m)), m)
        predictions += k
        chosen = np.zeros(len(ids) + 2, np.int8)
        chosen[x["masked_positions"][:k] + 1] = 1
        edges = np.flatnonzero(np.diff(chosen))  # the runs [s, e) of masked tokens
        for s, e in zip(edges[0::2], edges[1::2], strict=True):
            runs, word_aligned = runs + 1, word_aligned + int(starts[s] == 1)
            all_masked += bool((x["input_ids"][s:e] == MASK).all())
    budget = f"{paper}: 15% of the tokens, the last span cut to fit"
    return out + shares(
        f"spanbert.spanbert_dynamic_mlm (synthetic rows in groups, {predictions:,} predictions)",
        [
            ("rows with k = min(80, max(1, round(0.15 n)), n)", budget_ok, len(rows), 1.0, budget),
            ("masked runs starting at a word start", word_aligned, runs, 1.0, f"{paper}: words"),
            ("masked runs all [MASK]", all_masked, runs, 0.8, f"{paper}: 80/10/10 per span"),
        ],
    )


def _ernie_sentences(num, *, seed):
    """Segmented sentences (word lengths, tags): words of 1-3 characters, tags in runs of 1-3
    (so consecutive entity words of one tag occur)."""
    rng = np.random.default_rng(seed)
    tag_names = np.array(["nr", "ns", "nt", "v", "n", "a"])
    out = []
    for _ in range(num):
        num_words = int(rng.integers(3, 40))
        runs = rng.integers(1, 4, size=num_words)
        tags = np.repeat(tag_names[rng.integers(0, 6, size=num_words)], runs)[:num_words]
        out.append((rng.integers(1, 4, size=num_words), tags))
    return out


def _entity_units(word_lengths, tags):
    """Token positions (after [CLS]) of each entity-level unit: a run of consecutive words
    with one entity tag, or a single word."""
    units, position = [], 1
    for w, (length, tag) in enumerate(zip(word_lengths, tags, strict=True)):
        if not (tag in ernie.ENTITY_TAGS and w > 0 and tags[w - 1] == tag):
            units.append([])
        units[-1] += range(position, position + int(length))
        position += int(length)
    return units


def ernie_units(scale) -> list[Row]:
    sentences = _ernie_sentences(4000 // scale, seed=11)
    words = np.concatenate([w for w, _ in sentences])
    tokens = np.random.default_rng(12).integers(FIRST_TOKEN, 5000, size=int(words.sum()))
    per_sentence = [len(w) for w, _ in sentences]
    ds = tf.data.Dataset.from_tensor_slices({
        "word_ids": tf.RaggedTensor.from_nested_row_lengths(
            tokens.astype(np.int32), [per_sentence, words]
        ),
        "word_tags": tf.RaggedTensor.from_row_lengths(
            np.concatenate([t for _, t in sentences]), per_sentence
        ),
    })  # fmt: skip
    spec = mlm.MlmSpec(mask_id=MASK, vocab_size=5000, special_ids=SPECIALS, max_predictions=512)
    mask = lambda i, f: ernie.mask_ernie(
        f, seed=tf.stack([tf.constant(5, tf.int64), i]), spec=spec, level="entity", cls_id=CLS,
        sep_id=SEP, max_seq_length=512,
    )  # fmt: skip
    ds = ds.enumerate().map(mask, num_parallel_calls=tf.data.AUTOTUNE)
    units = hits = long_units = long_hits = whole = predictions = masks = kept = 0
    for (lengths, tags), x in zip(sentences, ds.as_numpy_iterator(), strict=True):
        k, new, old = _predictions(x)
        chosen = np.zeros(len(x["input_ids"]), bool)
        chosen[x["masked_positions"][:k]] = True
        for unit in _entity_units(lengths, tags):
            inside = int(chosen[unit].sum())
            units, hits, whole = units + 1, hits + (inside > 0), whole + (inside in (0, len(unit)))
            if len(unit) > 3:
                long_units, long_hits = long_units + 1, long_hits + (inside > 0)
        predictions += k
        masks, kept = masks + int((new == MASK).sum()), kept + int((new == old).sum())
    src = "PaddlePaddle ERNIE 1.0 batching.py mask()"
    return shares(
        f"ernie.mask_ernie entity level (synthetic, {predictions:,} predictions)",
        [
            ("units selected", hits, units, 0.15, f"{src}: one draw per unit, <= 0.15"),
            ("units of > 3 tokens selected", long_hits, long_units, 0.15, f"{src}: any length"),
            ("units masked whole", whole, units, 1.0, f"{src}: every token of a selected unit"),
            ("[MASK] share", masks, predictions, 0.8, f"{src}: per token, 0.8"),
            ("kept share", kept, predictions, 0.1, f"{src}: per token, 0.1"),
        ],
    )


def uni_lm(scale) -> list[Row]:
    num, n = MIN_POOL // scale, 20  # chunks of 20 tokens: 3 predictions each
    stream = (np.arange(num * n) % 900 + 50).astype(np.int32).reshape(-1, 100)
    with seqio.map_seed_manager(6):
        ds = unilm.unilm(
            tf.data.Dataset.from_tensor_slices({"targets": stream}),
            sequence_length={"targets": n + 3}, cls_id=CLS, sep_id=SEP, mask_id=MASK,
            vocab_size=1000, special_ids=SPECIALS,
        )  # fmt: skip
        ds = ds.map(lambda x: (x["unilm_mode"], x["input_ids"], x["masked_positions"]))
        out = list(ds.as_numpy_iterator())
    modes = np.bincount([m for m, _, _ in out], minlength=4)
    masks = sum(int((ids[pos] == MASK).sum()) for _, ids, pos in out)
    # The unit sampler alone, as tests/data/test_unilm.py reads it: one long draw, its last
    # unit (trimmed to the budget) left out.
    units = unilm.sample_units(rows=1, budget=3 * MIN_POOL // 2, seed=tf.constant([0, 2]))
    units = units.numpy()[0]
    units = units[units > 0][:-1]
    src = "Dong et al. 2019 (UniLM) sec. 2.3 / microsoft/unilm unilm-v1"
    names = ("bidirectional", "left-to-right", "right-to-left", "seq2seq")
    modes_src = f"{src}: 1/3, 1/6, 1/6, 1/3"
    ngram_src = f"{src}: 80% one token, 20% a bigram or trigram"
    return [
        *shares(
            "unilm.unilm (synthetic stream) L=23",
            [
                *((f"{a} mode", int(c), num, p, modes_src)
                  for a, c, p in zip(names, modes, unilm.MODE_PROBABILITIES, strict=True)),
                ("[MASK] share", masks, 3 * num, 0.8, f"{src}: 80/10/10"),
            ],
        ),
        *shares(
            "unilm.sample_units",
            [(f"{m}-gram units", int((units == m).sum()), len(units), p, ngram_src)
             for m, p in zip([1, 2, 3], unilm.NGRAM_PROBABILITIES, strict=True)],
        ),
    ]  # fmt: skip


def struct_bert(scale) -> list[Row]:
    num_docs = MIN_POOL // scale
    # Two three-token sentences per document: one chunk, its first pair's label the draw.
    firsts, put_back = np.zeros(3, int), 0
    for labels in _per_document(
        [[3, 3]] * num_docs, "structbert", "sentence_relation_label", seed=3, max_seq_length=32,
        short_seq_prob=0.0, buffer_size=64,
    ):  # fmt: skip
        firsts[labels[0]] += 1
        put_back += labels.tolist() == ([2, 2] if labels[0] == 2 else [labels[0]])
    rng, rows = np.random.default_rng(0), []
    for _ in range(2200 // scale):
        m = int(rng.integers(20, 200))
        body = 10_000 + np.arange(m)  # distinct ids: any reordering shows
        cut = int(rng.integers(1, m))
        ids = np.concatenate([[CLS], body[:cut], [SEP], body[cut:], [SEP]]).astype(np.int32)
        rows.append((ids, np.ones_like(ids)))
    spec = mlm.MlmSpec(mask_id=MASK, vocab_size=100_000, special_ids=SPECIALS, max_predictions=40)
    shuffled = _map_rows(rows, structbert.mask_and_shuffle, spec=spec, max_trigrams=20)
    rule = identity = trigrams = 0
    for (ids, _), x in zip(rows, shuffled, strict=True):
        free = ~np.isin(ids, SPECIALS)
        free[x["masked_positions"][: int(x["masked_weights"].sum())]] = False
        positions = int((free[:-2] & free[1:-1] & free[2:]).sum())  # T
        got, want = int(x["shuffled_weights"].sum()) // 3, min(20, round(0.05 * positions))
        rule += got == want if len(ids) >= 40 else got <= want  # a tiny row may run out
        blocks = x["shuffled_positions"][: 3 * got].reshape(-1, 3)
        identity += int((x["input_ids"][blocks] == ids[blocks]).all(axis=1).sum())
        trigrams += got
    src = "Wang et al. 2020 (StructBERT) sec. 2.2"
    relations = ("next", "previous", "other document")
    return [
        *shares(
            "sentence_pairs structbert (synthetic docs)",
            [
                *((f"label {v} ({a})", int(firsts[v]), num_docs, 1 / 3, f"{src}: 1/3 each")
                  for v, a in enumerate(relations)),
                ("unused sentence put back", put_back, num_docs, 1.0,
                 f"{BERT} num_unused_segments"),
            ],
        ),
        *shares(
            f"structbert.mask_and_shuffle (synthetic rows, {3 * trigrams:,} shuffled)",
            [
                ("rows with min(20, round(0.05 T)) trigrams", rule, len(rows), 1.0,
                 f"{src}: 5% of the unmasked trigrams"),
                ("identity shuffles", identity, trigrams, 0.0, f"{src}: the trigram reordered"),
            ],
        ),
    ]  # fmt: skip


GROUPS: dict[str, Callable[[int], list[Row]]] = {
    "electra": electra,
    "bert_mlm": bert_mlm,
    "bert_pairs": bert_pairs,
    "albert": albert,
    "spanbert": span_bert,
    "ernie": ernie_units,
    "unilm": uni_lm,
    "structbert": struct_bert,
}


def table(rows: list[Row]) -> str:
    lines = [
        "| objective / task | statistic | reference value (source: file, function) | measured "
        "| n | sigma | z |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        sigma = "exact" if r.sigma == 0 else f"{r.sigma:.5f}"
        z = ("0" if r.z == 0 else "BROKEN") if r.sigma == 0 else f"{r.z:+.2f}"
        lines.append(
            f"| {r.task} | {r.statistic} | {r.reference:.4f} ({r.source}) | {r.measured:.4f} "
            f"| {r.n:,} | {sigma} | {z} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="every pool divided by five")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {list(GROUPS)}")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(GROUPS)
    unknown = sorted(set(names) - set(GROUPS))
    if unknown:
        parser.error(f"unknown groups {unknown}; expected some of {list(GROUPS)}")
    start, rows = time.perf_counter(), []
    for name in names:
        rows += GROUPS[name](5 if args.quick else 1)
    print(table(rows))
    bad = [r for r in rows if abs(r.z) > LIMIT]
    worst = max((abs(r.z) for r in rows if r.sigma), default=0.0)
    print(
        f"\n{len(rows)} statistics, max |z| {worst:.2f} (limit {LIMIT:g}), {len(bad)} failing; "
        f"{time.perf_counter() - start:.0f} s"
    )
    for r in bad:
        print(f"FAIL {r.task}: {r.statistic}: {r.measured} against {r.reference}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
