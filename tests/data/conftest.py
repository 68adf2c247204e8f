"""Shared fixtures for the data tests: tiny vocabularies trained once per session."""

import pytest

from lmsuite.data import vocab as vocab_lib


@pytest.fixture(scope="session")
def tiny_vocab(tmp_path_factory):
    """A 300-piece wiki_sample vocabulary (+100 sentinels) trained on 2000 sentences."""
    return vocab_lib.get_vocabulary(
        "wiki_sample", 300, max_sentences=2000, out_dir=tmp_path_factory.mktemp("vocab")
    )


@pytest.fixture(scope="session")
def tiny_zh_vocab(tmp_path_factory):
    """A 2500-piece peoples_daily vocabulary trained on its first 20000 words."""
    return vocab_lib.get_vocabulary(
        "peoples_daily", 2500, max_sentences=20000, out_dir=tmp_path_factory.mktemp("vocab_zh")
    )
