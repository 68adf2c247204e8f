"""SentencePiece vocabularies trained deterministically on a corpus, with BERT and T5 specials.

Id layout (shared with every preprocessor, see the data contract):

  0 [PAD]   1 [UNK]   2 [CLS]   3 [SEP]   4 [MASK]   5 <s>   6 </s>
  7 .. size-1                      SentencePiece pieces
  size .. size+99                  sentinels <extra_id_99> .. <extra_id_0> (SeqIO's extra ids:
                                   <extra_id_0> = vocab_size - 1)

`train_vocab` writes `{corpus}-sp{size}-seed{seed}-{recipe}.model`; the same corpus and options
always give the same bytes (one thread, corpus order, no sampling). English corpora train on
sentences and mark word starts with "▁"; the Chinese corpus trains on its segmented words
without a dummy prefix, so pieces never cross a word and word starts come from segmentation.

`get_vocabulary(corpus, size)` returns a `CorpusVocabulary` (a `seqio.SentencePieceVocabulary`)
that trains or loads its model only when first used, so tasks can be registered offline.

Example:
  >>> vocab = get_vocabulary("wiki_sample", 8000)     # nothing trained yet
  >>> special_ids(vocab).mask, vocab.vocab_size, special_ids(vocab).sentinels[0]
  (4, 8100, 8099)
"""

import dataclasses
import io
import os
import pathlib
import tempfile
import time

import numpy as np
import sentencepiece as spm
import seqio

from lmsuite.data import corpora
from lmsuite.data.corpora import fetch

PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID, BOS_ID, EOS_ID = range(7)
NUM_SENTINELS = 100
DEFAULT_SIZES = {"wiki_sample": 8000, "shakespeare": 8000, "peoples_daily": 8000}
WORD_START = "\u2581"
# Bump when the trainer options change, so cached models from older options are not reused.
_RECIPE = "r1"
_CONTROL_SYMBOLS = ("[CLS]", "[SEP]", "[MASK]")


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """The special token ids of a vocabulary; `sentinels[i]` is `<extra_id_i>`."""

    pad: int
    unk: int
    cls: int
    sep: int
    mask: int
    bos: int
    eos: int
    sentinels: tuple[int, ...]

    @property
    def all(self) -> tuple[int, ...]:
        """Every special id (never masked, never a random replacement)."""
        return (self.pad, self.unk, self.cls, self.sep, self.mask, self.bos, self.eos,
                *self.sentinels)  # fmt: skip


def vocab_path(
    corpus: str,
    size: int,
    *,
    seed: int = 0,
    out_dir=None,
    max_sentences: int | None = None,
    model_type: str = "unigram",
) -> pathlib.Path:
    """Where `train_vocab` writes (or finds) the model; the name records every option."""
    directory = pathlib.Path(out_dir) if out_dir is not None else fetch.cache_dir() / "vocab"
    name = f"{corpus}-sp{size}-seed{seed}-{_RECIPE}"
    if max_sentences is not None:
        name += f"-n{max_sentences}"
    if model_type != "unigram":
        name += f"-{model_type}"
    return directory / f"{name}.model"


def local_corpora() -> list[str]:
    """The embedded pretraining corpora, which a vocabulary can be trained on."""
    return sorted(n for n, c in corpora.PRETRAINING.items() if isinstance(c, corpora.Corpus))


def training_text(corpus: str, *, max_sentences: int | None = None) -> list[str]:
    """The trainer's input, in corpus order: sentences, or words for the segmented corpus."""
    if corpus not in local_corpora():
        tfds = " (a TFDS corpus)" if corpus in corpora.PRETRAINING else ""
        raise ValueError(
            f"unknown corpus {corpus!r}{tfds}: train_vocab takes an embedded corpus name, one of "
            f"{local_corpora()}; for your own text files use "
            "lmsuite.data.text_files.train_vocab_from_files"
        )
    source = corpora.get_corpus(corpus)
    if corpora.language(corpus) == "zh":
        lines = [str(w) for d in source.documents("train") for w in d.features["words"]]
    else:
        lines = [s for d in source.documents("train") for s in d.sentences]
    return lines[:max_sentences] if max_sentences is not None else lines


def train_vocab(
    *,
    corpus: str,
    size: int,
    out_dir=None,
    seed: int = 0,
    max_sentences: int | None = None,
    model_type: str = "unigram",
) -> pathlib.Path:
    """Trains (once) a SentencePiece model on the train split of `corpus`; returns its path.

    `size` counts every piece of the model, specials included; the SeqIO vocabulary adds the
    100 sentinels on top. `max_sentences` trains on a prefix of the corpus (for tests).
    Retraining with the same arguments yields a byte-identical file.
    """
    check_size(size)
    path = vocab_path(
        corpus, size, seed=seed, out_dir=out_dir, max_sentences=max_sentences, model_type=model_type
    )
    if path.is_file():
        return path
    lines = training_text(corpus, max_sentences=max_sentences)
    train_sentencepiece(
        lines,
        path=path,
        size=size,
        seed=seed,
        model_type=model_type,
        add_dummy_prefix=corpora.language(corpus) != "zh",
        source=repr(corpus),
    )
    return path


def check_size(size: int) -> None:
    """Raises ValueError unless a `size`-piece model has room beyond the 7 special pieces."""
    if size <= len(_CONTROL_SYMBOLS) + 4:
        raise ValueError(f"vocabulary size must exceed the 7 special pieces, got size={size}")


def train_sentencepiece(
    lines: list[str],
    *,
    path: pathlib.Path,
    size: int,
    seed: int = 0,
    model_type: str = "unigram",
    add_dummy_prefix: bool = True,
    source: str,
) -> None:
    """Trains a `size`-piece model on `lines` with lmsuite's special ids and writes it to `path`
    atomically; the same lines and options always give the same bytes (one thread, input order,
    no sampling). `source` names the lines in error messages (e.g. "'wiki_sample'")."""
    check_size(size)
    model = io.BytesIO()
    spm.set_random_generator_seed(seed)
    start = time.perf_counter()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_writer=model,
            vocab_size=size,
            model_type=model_type,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            pad_piece="[PAD]",
            unk_piece="[UNK]",
            bos_piece="<s>",
            eos_piece="</s>",
            control_symbols=list(_CONTROL_SYMBOLS),
            character_coverage=0.9995,
            add_dummy_prefix=add_dummy_prefix,
            num_threads=1,
            shuffle_input_sentence=False,
            input_sentence_size=0,
            minloglevel=2,
        )
    except RuntimeError as e:
        raise ValueError(
            f"SentencePiece could not train a {size}-piece vocabulary on {source} "
            f"({len(lines)} training lines): {e}"
        ) from e
    _write_atomically(path, model.getvalue())
    train_seconds[path.name] = time.perf_counter() - start


train_seconds: dict[str, float] = {}


def _write_atomically(path: pathlib.Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


class CorpusVocabulary(seqio.SentencePieceVocabulary):
    """A SentencePiece vocabulary whose model is trained on first use (see `train_vocab`)."""

    def __init__(
        self,
        *,
        corpus: str,
        size: int,
        seed: int = 0,
        extra_ids: int = NUM_SENTINELS,
        out_dir=None,
        max_sentences: int | None = None,
    ):
        self.corpus, self.size, self.seed = corpus, size, seed
        self._train_kwargs = dict(
            corpus=corpus, size=size, seed=seed, out_dir=out_dir, max_sentences=max_sentences
        )
        path = vocab_path(corpus, size, seed=seed, out_dir=out_dir, max_sentences=max_sentences)
        super().__init__(str(path), extra_ids=extra_ids)

    def _model_context(self):
        if not self._model:
            train_vocab(**self._train_kwargs)
        return super()._model_context()

    @property
    def segmented(self) -> bool:
        """True when word starts come from the corpus segmentation (Chinese)."""
        return corpora.language(self.corpus) == "zh"

    def __repr__(self) -> str:
        return (
            f"CorpusVocabulary(corpus={self.corpus!r}, size={self.size}, seed={self.seed}, "
            f"extra_ids={self.extra_ids})"
        )

    __str__ = __repr__  # SeqIO's __str__ loads the model to print its md5.


def get_vocabulary(
    corpus: str, size: int | None = None, *, extra_ids: int = NUM_SENTINELS, **kwargs
) -> CorpusVocabulary:
    """The (lazily trained) vocabulary of `corpus`; `size` defaults to `DEFAULT_SIZES`."""
    if size is None:
        if corpus not in DEFAULT_SIZES:
            raise ValueError(
                f"no default vocabulary size for corpus {corpus!r}; pass size= or use one of "
                f"{sorted(DEFAULT_SIZES)}"
            )
        size = DEFAULT_SIZES[corpus]
    return CorpusVocabulary(corpus=corpus, size=size, extra_ids=extra_ids, **kwargs)


def special_ids(vocab: seqio.SentencePieceVocabulary) -> SpecialIds:
    """The special ids of `vocab`, checking that its model follows the lmsuite layout."""
    expected = {PAD_ID: "[PAD]", UNK_ID: "[UNK]", CLS_ID: "[CLS]", SEP_ID: "[SEP]",
                MASK_ID: "[MASK]", BOS_ID: "<s>", EOS_ID: "</s>"}  # fmt: skip
    actual = {i: vocab.tokenizer.id_to_piece(i) for i in expected}
    if actual != expected:
        raise ValueError(f"vocabulary {vocab!r} has special pieces {actual}, expected {expected}")
    return SpecialIds(
        pad=PAD_ID,
        unk=UNK_ID,
        cls=CLS_ID,
        sep=SEP_ID,
        mask=MASK_ID,
        bos=BOS_ID,
        eos=EOS_ID,
        sentinels=tuple(vocab.vocab_size - 1 - i for i in range(vocab.extra_ids)),
    )


def require_sentinels(vocab: seqio.Vocabulary, *, needed: int, purpose: str) -> None:
    """Raises ValueError unless `vocab` has `needed` sentinels (checked without loading it)."""
    if vocab.extra_ids < needed:
        raise ValueError(
            f"{purpose} needs {needed} sentinel ids <extra_id_0>..<extra_id_{needed - 1}>, but "
            f"vocabulary {vocab!r} has extra_ids={vocab.extra_ids}: missing "
            f"<extra_id_{vocab.extra_ids}>..<extra_id_{needed - 1}>"
        )


def word_start_table(vocab: seqio.SentencePieceVocabulary) -> np.ndarray:
    """Bool [vocab_size]: True for ids that begin a word (pieces with "▁", specials, sentinels).

    Example: pieces ["[PAD]", ..., "▁the", "s", "▁"] -> [True, ..., True, False, True].
    """
    tokenizer = vocab.tokenizer
    table = np.zeros([vocab.vocab_size], dtype=bool)
    for i in range(tokenizer.get_piece_size()):
        piece = tokenizer.id_to_piece(i)
        table[i] = (
            piece.startswith(WORD_START) or tokenizer.is_control(i) or tokenizer.is_unknown(i)
        )
    table[tokenizer.get_piece_size() :] = True
    return table
