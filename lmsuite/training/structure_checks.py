"""Row-specific checks of the `unilm` and `structbert` recipes (`encoder_recipes.py`): what each
needs of the model and the lengths beyond its features, architecture and heads."""

from collections.abc import Mapping

from lmsuite.models import ModelConfig
from lmsuite.objectives import structbert, unilm


def unilm_model_problems(config: ModelConfig, lengths: Mapping[str, int] | None) -> list[str]:
    """UniLM's token types 0..5 tell the model the mode (`preprocessors.unilm`); a smaller type
    table would fail on the first batch with an out-of-range id."""
    del lengths
    if config.type_vocab_size >= unilm.TYPE_VOCAB_SIZE:
        return []
    return [
        f"UniLM feeds token types 0..5 (bidirectional 0/1, left-to-right 2, right-to-left 3, "
        f"seq2seq 4/5), so the model needs ModelConfig.type_vocab_size >= "
        f"{unilm.TYPE_VOCAB_SIZE}, got {config.type_vocab_size} (e.g. models/unilm_tiny.gin)"
    ]


def structbert_model_problems(config: ModelConfig, lengths: Mapping[str, int] | None) -> list[str]:
    """The sentence-structure head classifies three relations (next, previous, other document)."""
    del lengths
    if config.num_labels == structbert.NUM_RELATIONS:
        return []
    return [
        f"the sentence-structure term is a {structbert.NUM_RELATIONS}-way classification (next / "
        f"previous / other document), so the model needs ModelConfig.num_labels = "
        f"{structbert.NUM_RELATIONS}, got {config.num_labels}"
    ]


def structbert_max_trigrams(input_length: int) -> int:
    """The word-structure budget of the structbert task: 5% of L trigrams, at least one (as
    `lmsuite.data.task_objectives._structbert_mlm` passes it to the preprocessor)."""
    return max(1, round(0.05 * input_length))


def structbert_lengths_fit(lengths: Mapping[str, int]) -> list[str]:
    """The converter pads the 3 * max_trigrams shuffled slots to the prediction length P
    (`masked_ids`): they must fit, or every example fails in the converter."""
    width = 3 * structbert_max_trigrams(int(lengths["input_ids"]))
    if width <= int(lengths["masked_ids"]):
        return []
    return [
        f"input_ids length {lengths['input_ids']} gives 3 * {width // 3} = {width} shuffled "
        f"word-structure slots, more than masked_ids = {lengths['masked_ids']} (the converter "
        f"pads them to that length); set masked_ids >= {width}"
    ]
