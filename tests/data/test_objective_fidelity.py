"""The registered encoder tasks produce their papers' data: ELECTRA's masking and count, ALBERT's
cap of 20 predictions, BERT's two-segment sentence-aligned rows, SpanBERT's single segments."""

import numpy as np
import pytest

from lmsuite.data import tasks
from lmsuite.data import vocab as vocab_lib


def _rows(objective, vocab, lengths, *, take, split="train"):
    task = tasks.build_task("wiki_sample", objective, vocab=vocab, register=False)
    ds = task.get_dataset(lengths, split=split, shuffle=False, seed=0)
    return list(ds.take(take).as_numpy_iterator())


def _segments(row):
    ids, types = row["input_ids"], row["token_type_ids"]
    seps = np.where(ids == vocab_lib.SEP_ID)[0]
    assert ids[0] == vocab_lib.CLS_ID and ids[-1] == vocab_lib.SEP_ID and len(seps) in (1, 2)
    want = [0] * (seps[0] + 1) + [1] * (len(ids) - seps[0] - 1)
    np.testing.assert_array_equal(types, want)
    return len(seps)


def test_electra_task_masks_as_electra(tiny_vocab):
    # Reference: google-research/electra pretrain_helpers.mask() with configure_pretraining's
    # mask_prob 0.15 and max_predictions_per_seq = int((0.15 + 0.005) * L) = 19 at L=128:
    # per row max(1, min(19, round(0.15 * len(row)))) predictions ([CLS]/[SEP] counted), each
    # [MASK] with probability 0.85, else kept; never a random id.
    length = 128
    out = _rows("electra", tiny_vocab, {"input_ids": length}, take=1400)
    ids = vocab_lib.special_ids(tiny_vocab)
    masks = kept = total = two = 0
    for row in out:
        k = int(row["masked_weights"].sum())
        assert k == max(1, min(19, round(0.15 * len(row["input_ids"]))))
        assert row["masked_weights"].shape == (19,)
        positions = row["masked_positions"][:k]
        new, original = row["input_ids"][positions], row["masked_ids"][:k]
        masks += int((new == ids.mask).sum())
        kept += int((new == original).sum())
        total += k
        two += _segments(row) == 2
    assert total >= 20_000, total
    assert masks + kept == total  # no random replacements
    sigma = np.sqrt(0.85 * 0.15 / total)
    assert abs(masks / total - 0.85) < 5 * sigma, (masks / total, sigma)
    assert two > len(out) / 2  # ELECTRA's builder makes mostly two-segment rows


def test_albert_sop_predicts_at_most_20_at_length_512(tiny_vocab):
    # Reference: google-research/albert run_pretraining.py / create_pretraining_data.py flag
    # max_predictions_per_seq = 20 at max_seq_length 512; a full row (0.15 * ~500 > 20) gets 20.
    out = _rows("albert_sop", tiny_vocab, {"input_ids": 512}, take=60)
    counts = np.array([int(r["masked_weights"].sum()) for r in out])
    assert counts.max() <= 20 and out[0]["masked_weights"].shape == (20,)
    long_rows = np.array([len(r["input_ids"]) >= 140 for r in out])
    assert long_rows.sum() > 10 and (counts[long_rows] == 20).all()


def test_albert_cap_holds_under_a_wider_width(tiny_vocab):
    # The recipes pass masked_ids = int(0.155 * L) (79 at 512): the width, not ALBERT's cap.
    out = _rows("albert_sop", tiny_vocab, {"input_ids": 256, "masked_ids": 39}, take=30)
    counts = np.array([int(r["masked_weights"].sum()) for r in out])
    assert out[0]["masked_weights"].shape == (39,) and counts.max() == 20


@pytest.mark.parametrize("objective", ["bert_mlm", "wwm"])
def test_bert_tasks_use_sentence_aligned_pairs(objective, tiny_vocab):
    out = _rows(objective, tiny_vocab, {"input_ids": 128}, take=300)
    segments = [_segments(r) for r in out]
    assert all(len(r["input_ids"]) <= 128 for r in out)
    assert np.mean(np.array(segments) == 2) > 0.8  # one-sentence chunks alone have no B
    # No row is shorter than BERT allows: [CLS] A [SEP] B [SEP] has >= 5 tokens, a lone A >= 3.
    assert min(len(r["input_ids"]) for r in out) >= 3


def test_spanbert_task_uses_single_segments_of_whole_sentences(tiny_vocab):
    out = _rows("spanbert", tiny_vocab, {"input_ids": 128}, take=200)
    for row in out:
        assert _segments(row) == 1 and len(row["input_ids"]) <= 128
