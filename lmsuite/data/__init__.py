"""Data layer: corpora, vocabularies, SeqIO preprocessors, feature converters, tasks (tf only)."""
