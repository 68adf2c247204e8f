"""English Wikipedia sample: the 106 articles of the dump excerpt shipped in gensim's tests.

Source: `gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2`
in the gensim 4.4.0 wheel (see `fetch.GENSIM` for the pinned sha256). Pages outside the article
namespace and redirects (`<redirect/>` or `#REDIRECT` text) are dropped; each remaining article
becomes one document whose markup is stripped by `wikitext.wikitext_to_paragraphs`, with its
paragraphs as lines of `text` and its sentences in `sentences`.

Example (one page of XML):
  <page><title>Ada</title><ns>0</ns><revision><text>'''Ada''' was [[a|b]]. She won.</text>...
  -> Document(doc_id="Ada", text="Ada was b. She won.", sentences=("Ada was b.", "She won."))
"""

import bz2
import dataclasses
import xml.etree.ElementTree as ET
from typing import BinaryIO

from lmsuite.data import text as text_lib
from lmsuite.data.corpora import base, fetch, wikitext

MEMBER = (
    "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
)


@dataclasses.dataclass
class PageCounts:
    """What `parse_pages` kept and dropped."""

    pages: int = 0
    redirects_dropped: int = 0
    other_namespaces_dropped: int = 0
    empty_dropped: int = 0
    articles: int = 0


def parse_pages(stream: BinaryIO, *, counts: PageCounts | None = None) -> list[base.Document]:
    """Parses a MediaWiki XML export into one document per non-redirect article."""
    counts = counts if counts is not None else PageCounts()
    documents = []
    for _, element in ET.iterparse(stream, events=("end",)):
        if _local(element.tag) != "page":
            continue
        counts.pages += 1
        fields = {_local(child.tag): child for child in element.iter()}
        wiki = fields["text"].text or "" if "text" in fields else ""
        if "redirect" in fields or wikitext.is_redirect(wiki):
            counts.redirects_dropped += 1
        elif (fields["ns"].text or "").strip() != "0":
            counts.other_namespaces_dropped += 1
        else:
            paragraphs = wikitext.wikitext_to_paragraphs(wiki)
            if not paragraphs:
                counts.empty_dropped += 1
            else:
                counts.articles += 1
                sentences = [s for p in paragraphs for s in text_lib.split_sentences(p)]
                documents.append(
                    base.Document(
                        doc_id=fields["title"].text or "",
                        text="\n".join(paragraphs),
                        sentences=tuple(sentences),
                    )
                )
        element.clear()
    return documents


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _load(stats: text_lib.CleaningStats) -> list[base.Document]:
    del stats  # The XML parser decodes (and would reject) the UTF-8 itself.
    with bz2.open(fetch.fetch_member(fetch.GENSIM, MEMBER), "rb") as stream:
        return parse_pages(stream)


WIKI_SAMPLE = base.Corpus(
    name="wiki_sample",
    load=_load,
    validation_documents=10,
    description="106 English Wikipedia articles (gensim 4.4.0 test data), markup stripped.",
)
