"""The user's own text: files -> documents (formats, splitting, errors), the deterministic
hold-out, text-file tasks that run each objective's own pipeline, vocabularies from files."""

import gzip
import json

import pytest
import sentencepiece as spm
import seqio

from lmsuite.data import tasks, text_files
from lmsuite.data import vocab as vocab_lib
from lmsuite.data.corpora import base, user_files
from lmsuite.data.preprocessors import ul2
from tests.data.generated_text import write_text_files

TEXT = "Dr. Ada came. She won.\n  The end.\n\n\nNext story.\n"
LENGTHS = {
    tasks.ENCODER: {"input_ids": 64},
    tasks.SEQ2SEQ: {"inputs": 64, "targets": 32},
    tasks.DECODER: {"targets": 64},
    tasks.PERMUTATION: {"input_k": 64},
}


def _lengths(objective: str) -> dict[str, int]:
    """The objective kind's lengths; UL2's denoisers need targets as long as the inputs."""
    if objective in ul2.BY_NAME:
        return ul2.lengths(64)
    return LENGTHS[tasks.OBJECTIVES[objective].kind]


ENGLISH = [o for o, spec in tasks.OBJECTIVES.items() if "en" in spec.languages]
# One per kind of source use: sentence pairs, documents (seq2seq, decoder), XLNet's streams.
FAST = ("bert_mlm_nsp", "t5_span_corruption", "causal_lm", "xlnet_plm")


def _docs(path, **reading):
    return [
        (d.doc_id.removeprefix(f"{path}:"), d.text, d.sentences)
        for d in user_files.read_documents(str(path), **reading)
    ]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("text")
    write_text_files(directory)
    return directory


@pytest.fixture(scope="module")
def vocab_path(corpus_dir, tmp_path_factory):
    return text_files.train_vocab_from_files(
        text_files=f"{corpus_dir}/*.txt", size=412, out_dir=tmp_path_factory.mktemp("vocab")
    )


# ------------------------------------------------------------------------ files -> documents
def test_text_documents_per_file_block_and_line(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text(TEXT)
    assert _docs(path) == [  # default: one per file
        ("1", "Dr. Ada came. She won.\nThe end.\nNext story.",
         ("Dr. Ada came.", "She won.", "The end.", "Next story.")),
    ]  # fmt: skip
    assert _docs(path, split_documents="blank_line") == [
        ("1", "Dr. Ada came. She won.\nThe end.", ("Dr. Ada came.", "She won.", "The end.")),
        ("5", "Next story.", ("Next story.",)),
    ]
    assert _docs(path, split_documents="line") == [
        ("1", "Dr. Ada came. She won.", ("Dr. Ada came.", "She won.")),
        ("2", "The end.", ("The end.",)),
        ("5", "Next story.", ("Next story.",)),
    ]


def test_gzip_and_crlf_read_as_the_plain_file(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT)
    (tmp_path / "b.txt.gz").write_bytes(gzip.compress(TEXT.replace("\n", "\r\n").encode()))
    for split in user_files.SPLIT_DOCUMENTS:
        plain = _docs(tmp_path / "a.txt", split_documents=split)
        assert _docs(tmp_path / "b.txt.gz", split_documents=split) == plain


def test_jsonl_records_are_documents(tmp_path):
    records = [{"text": "One. Two.\n\nThree.", "id": 1}, {"text": "Four."}]
    lines = [json.dumps(records[0]), "", json.dumps(records[1])]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    (tmp_path / "c.txt").write_text(json.dumps({"body": "Five."}) + "\n")
    one_per_record = [("1", "One. Two.\nThree.", ("One.", "Two.", "Three.")),
                      ("3", "Four.", ("Four.",))]  # fmt: skip
    assert _docs(tmp_path / "a.jsonl") == one_per_record  # auto: JSON lines, a record each
    assert _docs(tmp_path / "b.jsonl.gz") == one_per_record
    assert _docs(tmp_path / "a.jsonl", split_documents="blank_line") == [
        ("1.1", "One. Two.", ("One.", "Two.")),
        ("1.2", "Three.", ("Three.",)),
        ("3.1", "Four.", ("Four.",)),
    ]
    assert _docs(tmp_path / "a.jsonl", split_documents="file") == [
        ("1", "One. Two.\nThree.\nFour.", ("One.", "Two.", "Three.", "Four."))
    ]
    assert _docs(tmp_path / "c.txt", format="jsonl", jsonl_field="body") == [
        ("1", "Five.", ("Five.",))
    ]
    assert _docs(tmp_path / "c.txt") == [("1", '{"body": "Five."}', ('{"body": "Five."}',))]


def test_jsonl_problems_name_the_file_and_line(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "ok"}\n\n{"body": "no text"}\n')
    with pytest.raises(ValueError, match=rf"{path}:3: the record has no field 'text'; its "
                       r"fields are \['body'\]"):  # fmt: skip
        user_files.read_documents(str(path))
    path.write_text('{"text": "ok"}\n{"text": 3}\n')
    with pytest.raises(ValueError, match=rf"{path}:2: field 'text' holds a int"):
        user_files.read_documents(str(path))
    path.write_text('{"text": "ok"}\n{"text": "unclosed\n')
    with pytest.raises(ValueError, match=rf"{path}:2: not a JSON line"):
        user_files.read_documents(str(path))
    path.write_text('["a list"]\n')
    with pytest.raises(ValueError, match=rf"{path}:1: a JSON list"):
        user_files.read_documents(str(path))


def test_file_problems_name_the_file_or_glob(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=rf"train_files: 'nothing/\*.txt' matches no file "
                       rf"\(looked for {tmp_path}/nothing/\*.txt\)"):  # fmt: skip
        user_files.expand_files("nothing/*.txt", flag="train_files")
    (tmp_path / "sub").mkdir()
    with pytest.raises(ValueError, match=rf"matches the directory {tmp_path}/sub"):
        user_files.expand_files(f"{tmp_path}/*")
    with pytest.raises(ValueError, match="no file or glob given"):
        user_files.expand_files(" , ")
    (tmp_path / "bad.txt.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=rf"{tmp_path}/bad.txt.gz is not a readable gzip file"):
        user_files.read_documents(str(tmp_path / "bad.txt.gz"))


def test_globs_are_expanded_sorted_deduplicated_and_absolute(tmp_path, monkeypatch):
    for name in ("b.txt", "a.txt", "c.jsonl"):
        (tmp_path / name).write_text("x\n")
    monkeypatch.chdir(tmp_path)
    expected = (f"{tmp_path}/a.txt", f"{tmp_path}/b.txt", f"{tmp_path}/c.jsonl")
    assert user_files.expand_files("*.txt,c.jsonl,a.txt") == expected
    assert user_files.expand_files(["*.txt", "*.jsonl"]) == expected


# ------------------------------------------------------------------------------ hold-out
def _doc(doc_id, text):
    return base.Document(doc_id=doc_id, text=text, sentences=(text,))


def test_hold_out_follows_text_digests_and_keeps_equal_texts_together():
    documents = [_doc("f:1", "a"), _doc("f:2", "b"), _doc("f:3", "c"), _doc("f:4", "a")]
    split = user_files.hold_out(documents, fraction=0.5, where="x")
    assert [d.text for d in split["validation"]] == ["b", "c"]  # sha256: "c" < "b" < "a"
    assert [d.text for d in split["train"]] == ["a", "a"]
    # 1 of 4 wanted, "c" is smallest; order and ids do not matter
    again = user_files.hold_out(documents[::-1], fraction=0.25, where="x")
    assert [d.doc_id for d in again["validation"]] == ["f:3"]
    with pytest.raises(ValueError, match=r"x hold 1 document\(s\): too few to hold out"):
        user_files.hold_out(documents[:1], fraction=0.05, where="x")
    with pytest.raises(ValueError, match="all 2 documents have the same text"):
        user_files.hold_out([documents[0], documents[3]], fraction=0.05, where="x")


# ------------------------------------------------------------------------------ tasks
def test_a_text_task_runs_the_embedded_corpus_pipeline_for_every_objective(corpus_dir, tiny_vocab):
    def steps(task):  # each step's function and options; the corpus is the source's own
        options = lambda s: {k: v for k, v in getattr(s, "keywords", {}).items() if k != "corpus"}
        return [(getattr(s, "func", s), options(s)) for s in task.preprocessors]

    for objective in ENGLISH:
        name = text_files.register_text_task(
            objective=objective, train_files=f"{corpus_dir}/*.txt", vocabulary=tiny_vocab
        )
        embedded = tasks.build_task("wiki_sample", objective, vocab=tiny_vocab, register=False)
        text_task = seqio.get_mixture_or_task(name)
        assert steps(text_task) == steps(embedded), objective
        assert text_task.output_features == embedded.output_features


# slow (5-8 s each): the fast suite builds FAST; every objective's steps are compared above
@pytest.mark.parametrize(
    "objective", [o if o in FAST else pytest.param(o, marks=pytest.mark.slow) for o in ENGLISH]
)
def test_every_objective_yields_the_embedded_tasks_features(objective, corpus_dir, tiny_vocab):
    lengths = _lengths(objective)
    name = text_files.register_text_task(
        objective=objective,
        train_files=f"{corpus_dir}/*.txt",
        split_documents="blank_line",
        vocabulary=tiny_vocab,
    )
    task = seqio.get_mixture_or_task(name)
    dataset = task.get_dataset(lengths, split="validation", shuffle=False)
    embedded = tasks.build_task("wiki_sample", objective, vocab=tiny_vocab, register=False)
    assert dataset.element_spec == embedded.get_dataset(lengths, shuffle=False).element_spec
    assert next(iter(dataset))  # a held-out example exists


def test_validation_files_are_the_validation_split(corpus_dir, vocab_path, tmp_path):
    held = tmp_path / "held.txt"
    held.write_text("The lantern was bright.\n")
    name = text_files.register_text_task(
        objective="causal_lm",
        train_files=f"{corpus_dir}/doc[0-2].txt",
        validation_files=str(held),
        vocabulary=vocab_path,
    )
    spec = text_files.TEXT_TASKS[name]
    assert text_files.read_corpus(spec) == {"train": 3, "validation": 1}
    task = seqio.get_mixture_or_task(name)
    (example,) = task.get_dataset({"targets": 64}, split="validation", shuffle=False)
    vocab = task.output_features["targets"].vocabulary
    assert vocab.decode(example["targets"].numpy().tolist()) == "The lantern was bright."
    with pytest.raises(ValueError, match=r"\['.*doc0.txt'\] are both train_files and validation"):
        text_files.register_text_task(
            objective="causal_lm", train_files=f"{corpus_dir}/*.txt",
            validation_files=f"{corpus_dir}/doc0.txt",
        )  # fmt: skip


def test_without_validation_files_five_percent_is_held_out(corpus_dir, vocab_path):
    name = text_files.register_text_task(
        objective="bert_mlm",
        train_files=f"{corpus_dir}/*.txt",
        split_documents="blank_line",
        vocabulary=vocab_path,
    )
    corpus = text_files.corpus_of(text_files.TEXT_TASKS[name])
    train, validation = corpus.documents("train"), corpus.documents("validation")
    assert (len(train), len(validation)) == (57, 3)  # 6 files x 10 blocks, round(0.05 * 60)
    assert not {d.text for d in train} & {d.text for d in validation}


def test_task_names_are_digests_of_the_arguments(corpus_dir, vocab_path):
    kwargs = dict(objective="t5_span_corruption", train_files=f"{corpus_dir}/*.txt")
    first = text_files.register_text_task(**kwargs, vocabulary=vocab_path)
    assert first.startswith("text_t5_span_corruption_")
    assert text_files.register_text_task(**kwargs, vocabulary=str(vocab_path)) == first
    assert text_files.register_text_task(**kwargs) != first  # the default vocabulary
    assert text_files.register_text_task("mine", **kwargs) == "mine"
    spec = text_files.TEXT_TASKS[first]
    assert text_files.TextTaskSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert spec.vocabulary == str(vocab_path) and spec.train_files[0].endswith("/doc0.txt")


def test_task_arguments_are_checked_before_reading(corpus_dir, tmp_path):
    files = f"{corpus_dir}/*.txt"
    with pytest.raises(ValueError, match="unknown objective 'bert'"):
        text_files.register_text_task(objective="bert", train_files=files)
    with pytest.raises(ValueError, match="objective 'ernie' needs segmented Chinese text"):
        text_files.register_text_task(objective="ernie", train_files=files)
    with pytest.raises(ValueError, match="format must be one of"):
        text_files.register_text_task(objective="bert_mlm", train_files=files, format="csv")
    with pytest.raises(ValueError, match="split_documents must be one of"):
        text_files.register_text_task(objective="bert_mlm", train_files=files,
                                      split_documents="paragraph")  # fmt: skip
    with pytest.raises(ValueError, match=rf"vocabulary {tmp_path}/none.model: no such file"):
        text_files.register_text_task(objective="bert_mlm", train_files=files,
                                      vocabulary=tmp_path / "none.model")  # fmt: skip
    (tmp_path / "junk.model").write_bytes(b"junk")
    with pytest.raises(ValueError, match="junk.model is not an lmsuite SentencePiece model"):
        text_files.register_text_task(objective="bert_mlm", train_files=files,
                                      vocabulary=tmp_path / "junk.model")  # fmt: skip


def test_a_missing_field_fails_when_the_files_are_read_naming_file_and_line(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "One."}\n{"text": "Two."}\n{"txt": "Three."}\n')
    name = text_files.register_text_task(objective="causal_lm", train_files=f"{tmp_path}/*")
    with pytest.raises(ValueError, match=rf"{tmp_path}/a.jsonl:3: the record has no field"):
        text_files.read_corpus(text_files.TEXT_TASKS[name])


# ------------------------------------------------------------------------------ vocabulary
def test_a_vocabulary_from_files_has_lmsuites_special_ids_and_sentinels(vocab_path, corpus_dir):
    vocab = seqio.SentencePieceVocabulary(str(vocab_path), extra_ids=vocab_lib.NUM_SENTINELS)
    ids = vocab_lib.special_ids(vocab)  # raises unless [PAD] [UNK] [CLS] [SEP] [MASK] <s> </s>
    assert (ids.pad, ids.mask, ids.eos, vocab.vocab_size) == (0, 4, 6, 512)
    assert ids.sentinels[0] == 511 and vocab.decode([511]) == "<extra_id_0>"
    assert spm.SentencePieceProcessor(model_file=str(vocab_path)).get_piece_size() == 412
    again = text_files.train_vocab_from_files(
        text_files=f"{corpus_dir}/*.txt", size=412, out_dir=vocab_path.parent
    )
    assert again == vocab_path and again.read_bytes() == vocab_path.read_bytes()


def test_the_same_sentences_as_jsonl_give_the_same_vocabulary(corpus_dir, vocab_path, tmp_path):
    records = [json.dumps({"text": line}) for path in sorted(corpus_dir.glob("*.txt"))
               for line in [path.read_text()]]  # fmt: skip
    (tmp_path / "all.jsonl.gz").write_bytes(gzip.compress("\n".join(records).encode()))
    path = text_files.train_vocab_from_files(
        text_files=str(tmp_path / "all.jsonl.gz"), size=412, out_dir=tmp_path
    )
    assert path.read_bytes() == vocab_path.read_bytes()


def test_a_size_the_text_cannot_reach_names_the_files(tmp_path):
    (tmp_path / "a.txt").write_text("Tiny text. Very tiny.\n")
    with pytest.raises(ValueError, match=rf"4000-piece vocabulary on the 1 file\(s\) "
                       rf"{tmp_path}/a.txt \(2 training lines\)"):  # fmt: skip
        text_files.train_vocab_from_files(text_files=f"{tmp_path}/a.txt", size=4000)
    with pytest.raises(ValueError, match="must exceed the 7 special pieces"):
        text_files.train_vocab_from_files(text_files=f"{tmp_path}/nothing", size=5)
