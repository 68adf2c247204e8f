"""Extractive QA: HF parity of the span head, SQuAD reading and windows, the official v1.1
metric on hand-computed cases, and a tiny model that learns a fixed answer pattern."""

import json

import numpy as np
import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

import lmsuite
from lmsuite.evaluation import qa, squad, text_offsets, tokenizer_export
from tests.convert.parity import assert_close, make_inputs

ANSWERS = "red blue green black white pink brown gray gold silver orange purple".split()
FILLER = [
    "the cat sat on the mat .",
    "a dog ran in the park .",
    "birds sing in the tall trees .",
    "we like to eat apples .",
    "he walked to the old station .",
]


def pattern_context(i: int) -> tuple[str, str]:
    """(context, answer): filler sentences around "the colour is <answer> ."."""
    answer = ANSWERS[i % len(ANSWERS)]
    before, after = FILLER[i % 5], FILLER[(i + 2) % 5]
    return f"{before} the colour is {answer} . {after}", answer


def squad_json(indices) -> dict:
    paragraphs = []
    for i in indices:
        context, answer = pattern_context(i)
        qas = [
            {
                "id": f"q{i}",
                "question": "what is the colour ?",
                "answers": [{"text": answer, "answer_start": context.index(f"is {answer}") + 3}],
            }
        ]
        paragraphs.append({"context": context, "qas": qas})
    return {"version": "1.1", "data": [{"title": "colours", "paragraphs": paragraphs}]}


def make_bert_dir(directory, texts: list[str], *, initializer_range: float = 0.02) -> str:
    """A random tiny BertForMaskedLM (no dropout) with a WordPiece tokenizer trained on
    `texts`, saved to `directory` as HF saves them."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(
        texts * 4, trainers.WordPieceTrainer(vocab_size=120, special_tokens=specials)
    )
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        num_hidden_layers=2,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=initializer_range,
    )
    transformers.BertForMaskedLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    text = [pattern_context(i)[0] for i in range(len(ANSWERS))] + ["what is the colour ?"]
    return make_bert_dir(tmp_path_factory.mktemp("bert_qa"), text)


# ------------------------------------------------------------------------------ parity
def test_span_logits_match_hf_bert_for_question_answering():
    torch.manual_seed(3)
    config = transformers.BertConfig(
        vocab_size=101,
        hidden_size=30,
        num_attention_heads=3,
        intermediate_size=37,
        num_hidden_layers=2,
        max_position_embeddings=40,
        initializer_range=0.2,
    )
    hf = transformers.BertForQuestionAnswering(config).eval()
    with torch.no_grad():  # a non-zero bias, so a dropped bias would show
        hf.qa_outputs.bias.copy_(torch.tensor([0.3, -0.7]))
    ids, mask, types = make_inputs(vocab_size=101, length=13)
    with torch.no_grad():
        out = hf(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            token_type_ids=torch.from_numpy(types),
        )
    start, end = qa.qa_from_hf(hf).logits(ids, mask, types)
    assert_close(start, out.start_logits.numpy(), "BertForQuestionAnswering start_logits")
    assert_close(end, out.end_logits.numpy(), "BertForQuestionAnswering end_logits")


def test_qa_from_hf_refuses_other_classes():
    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=8,
        num_attention_heads=2,
        intermediate_size=8,
        num_hidden_layers=1,
    )
    with pytest.raises(ValueError, match="BertForMaskedLM"):
        qa.qa_from_hf(transformers.BertForMaskedLM(config))


# ------------------------------------------------------------------------------ metric
@pytest.mark.parametrize(
    "prediction, gold, em, f1",
    [
        ("The Eiffel Tower!", "eiffel tower", 1.0, 1.0),  # case, punctuation, article
        ("big cat", "the big dog", 0.0, 0.5),  # 1 shared of 2 and 2 tokens
        ("a cat cat", "cat", 0.0, 2 / 3),  # precision 1/2, recall 1
        ("an apple", "the", 0.0, 0.0),  # gold normalises to nothing
        ("Paris, France", "paris  france", 1.0, 1.0),
    ],
)
def test_exact_match_and_f1_follow_squad_v1_1(prediction, gold, em, f1):
    assert squad.exact_match(prediction, gold) == em
    assert squad.f1(prediction, gold) == pytest.approx(f1)


def test_metric_takes_the_best_gold_and_averages_times_100():
    examples = [
        squad.QAExample("a", "q", "c", (("paris france", 0), ("Paris", 0))),
        squad.QAExample("b", "q", "c", (("the big dog", 0),)),
    ]
    scores = squad.exact_match_and_f1({"a": "paris", "b": "big cat"}, examples)
    assert scores == {"exact_match": pytest.approx(50.0), "f1": pytest.approx(75.0)}
    with pytest.raises(ValueError, match="'b'"):
        squad.exact_match_and_f1({"a": "paris"}, examples)


# ------------------------------------------------------------------------------ reading
def _one(qa_record=None, context="Paris is in France."):
    record = qa_record or {
        "id": "q1",
        "question": "Where?",
        "answers": [{"text": "France", "answer_start": 12}],
    }
    return {"data": [{"paragraphs": [{"context": context, "qas": [record]}]}]}


def test_parse_squad_reads_records():
    (example,) = squad.parse_squad(_one())
    assert example == squad.QAExample("q1", "Where?", "Paris is in France.", (("France", 12),))


@pytest.mark.parametrize(
    "dataset, message",
    [
        ({"version": "1.1"}, "missing key 'data'"),
        (
            {"data": [{"paragraphs": [{"qas": []}]}]},
            r"data\[0\]\.paragraphs\[0\]: missing key 'context'",
        ),
        (_one({"question": "Where?", "answers": []}), r"qas\[0\]: missing key 'id'"),
        (
            _one(
                {
                    "id": "q7",
                    "question": "Where?",
                    "answers": [{"text": "France", "answer_start": 3}],
                }
            ),
            r"id 'q7'.*answer_start=3 does not point at the answer text 'France'.*'is is '",
        ),
        (
            _one({"id": "q8", "question": "Where?", "answers": [{"text": "France"}]}),
            r"id 'q8'.*missing key 'answer_start'",
        ),
        (_one({"id": "q9", "question": "Where?", "answers": []}), r"id 'q9'.*'answers' is empty"),
    ],
)
def test_malformed_squad_names_the_record(dataset, message):
    with pytest.raises(ValueError, match=message):
        squad.parse_squad(dataset)


def test_a_window_longer_than_the_position_table_is_refused(bert_dir):
    examples = squad.parse_squad(squad_json(range(2)))
    with pytest.raises(ValueError, match="max_length=65 exceeds the model's position table of 64"):
        qa.finetune_qa(bert_dir, train=examples, validation=examples, max_length=65)


# ------------------------------------------------------------------------------ windows
def test_windows_map_answers_back_to_their_characters(bert_dir):
    vocab = lmsuite.load(bert_dir).vocab
    sentences = [pattern_context(i)[0] for i in range(6)]
    context = " ".join(sentences)
    examples = []
    for i, answer in enumerate(("colour is blue", "park", "old station")):
        start = context.index(answer)
        examples.append(
            squad.QAExample(f"q{i}", "what is the colour ?", context, ((answer, start),))
        )
    features = squad.make_features(examples, vocab=vocab, max_length=24, doc_stride=6)
    counts = np.bincount(features.example_index)
    assert counts.min() > 2  # the context needs several windows
    for row, index in enumerate(features.example_index):
        start, end = features.start_positions[row], features.end_positions[row]
        answer = examples[index].answers[0][0]
        if start == 0:
            assert end == 0
            continue
        offsets = features.offsets[row]
        assert context[offsets[start, 0] : offsets[end, 1]] == answer
    for index in range(3):  # each answer is found whole in at least one window
        assert features.start_positions[features.example_index == index].max() > 0
    # The windows cover the context: every context token is in some window.
    ids, spans = text_offsets.encode_with_offsets(vocab, context)
    assert len(ids) > 24
    covered = {tuple(o) for o in features.offsets[features.example_index == 0].reshape(-1, 2)}
    assert covered - {(-1, -1)} == set(spans)


def test_sentencepiece_offsets_point_at_the_original_characters():
    from lmsuite.data import vocab as vocab_lib

    vocab = tokenizer_export.SentencePieceText(
        vocab_lib.get_vocabulary("wiki_sample"), template="cls_sep"
    )
    text = "The  ﬁrst café opened in 1990s Paris."
    ids, spans = text_offsets.encode_with_offsets(vocab, text)
    assert ids == vocab.encode(text, add_special_tokens=False)
    assert "".join(text[s:e] for s, e in spans) == text.replace(" ", "")
    assert all(not text[s:e].startswith(" ") for s, e in spans)
    assert any(text[s:e].startswith("ﬁ") for s, e in spans)  # NFKC folded, offsets are not


# ------------------------------------------------------------------------------ training
def test_a_tiny_model_learns_the_answer_pattern(bert_dir, tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps(squad_json(range(24))))
    train = squad.read_squad(str(path))
    validation = squad.parse_squad(squad_json(range(24, 36)))
    loaded = lmsuite.load(bert_dir)
    config, params = qa.qa_params(loaded.config, loaded.params, seed=0, from_scratch=False)
    features = squad.make_features(validation, vocab=loaded.vocab, max_length=40, doc_stride=8)
    untrained = squad.exact_match_and_f1(
        qa.predict_answers(config, params, features, validation, batch_size=8), validation
    )
    result = qa.finetune_qa(
        loaded,
        train=train,
        validation=validation,
        learning_rate=3e-3,
        epochs=12,
        batch_size=8,
        max_length=40,
        doc_stride=8,
        seed=0,
        progress=False,
    )
    trained = result.metrics
    assert trained["f1"] > untrained["f1"] + 30, (untrained, trained)
    assert trained["exact_match"] >= 50, (untrained, trained)
    assert set(result.params) == {"encoder", "span_head"}
