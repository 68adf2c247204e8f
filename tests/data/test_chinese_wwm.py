"""Chinese whole-word masking on People's Daily (`peoples_daily_wwm`): a word is the corpus's
segmentation unit, so a masked character always comes with the rest of its word (Cui et al.,
"Pre-Training with Whole Word Masking for Chinese BERT": words from a segmenter, here the
corpus's own gold segmentation)."""

import numpy as np
import seqio

import lmsuite.data.tasks  # noqa: F401  (registers the tasks)
from lmsuite.data import vocab

LENGTHS = {"input_ids": 128, "masked_ids": 20}


def _words(input_ids: np.ndarray, word_starts: np.ndarray) -> list[range]:
    """Units as whole_word.py defines them: a unit begins where `word_starts` is 1 or right
    after a token that is never masked ([CLS], [SEP], <unk>: a sentence split inside a segmented
    word leaves its tail with word_starts 0 after [CLS] or [SEP]). [MASK] is not among them: in
    these outputs it stands for a masked token."""
    never = (vocab.PAD_ID, vocab.UNK_ID, vocab.CLS_ID, vocab.SEP_ID, vocab.BOS_ID, vocab.EOS_ID)
    special = np.isin(input_ids, never)
    real = len(input_ids)
    starts = [i for i in range(real) if word_starts[i] or (i and special[i - 1]) or special[i]]
    return [range(a, b) for a, b in zip(starts, [*starts[1:], real], strict=True)]


def test_masked_characters_come_with_their_whole_segmented_word():
    task = seqio.get_mixture_or_task("peoples_daily_wwm")
    dataset = task.get_dataset(LENGTHS, split="validation", shuffle=False, seed=0)
    rows = multi_piece_words_masked = 0
    for example in dataset.take(300).as_numpy_iterator():
        masked = set(example["masked_positions"][example["masked_weights"] > 0].tolist())
        for word in _words(example["input_ids"], example["word_starts"]):
            hit = masked.intersection(word)
            assert not hit or hit == set(word), (example, word)
            multi_piece_words_masked += bool(hit) and len(word) > 1
        rows += 1
    assert rows == 300
    # The test means something only if multi-character words were masked.
    assert multi_piece_words_masked > 100, multi_piece_words_masked
