"""SeqIO preprocessors: pure tf.data functions that turn tokenized documents into objectives.

Masking family (BERT MLM, whole-word, n-gram, SpanBERT, ERNIE, ELECTRA, sentence pairs,
StructBERT) and the seq2seq/LM family live in modules named for their concept.
"""
