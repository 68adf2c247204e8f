"""The recipe rows of language models on one stack: GPT-2's causal LM and T5's decoder-only prefix
LM over SeqIO's packed converters, and the two that carry a memory from step to step over rows
of streams, XLNet's permutation LM and Transformer-XL's LM (their row checks and stream layout:
`recipe_checks`).

How a run picks a row is in `recipes`, whose `RECIPES` lists these rows with the other families'.
"""

import seqio

from lmsuite import objectives as losses
from lmsuite.data import feature_converters as fc
from lmsuite.training import recipe_checks
from lmsuite.training.recipe_types import Recipe

CAUSAL_LM = Recipe(
    name="causal_lm",
    summary="left-to-right LM, packed (GPT-2)",
    task_objectives=("causal_lm",),
    length_keys=("targets",),
    lengths_for=lambda n: {"targets": n},
    task_features=("targets",),
    converter=seqio.LMFeatureConverter,
    pack=True,
    loss=losses.causal_lm,
    architectures=("decoder",),
    example_model="gpt2_tiny",
    task_ids_along=("targets",),
    reference="t5 preprocessors (causal LM); seqio LMFeatureConverter",
)

DECODER_PREFIX_LM = Recipe(
    name="decoder_prefix_lm",
    summary="prefix LM on a decoder-only model: bidirectional prefix, causal rest (T5)",
    task_objectives=("prefix_lm",),
    length_keys=("inputs", "targets"),
    lengths_for=lambda n: {"inputs": n // 2, "targets": n // 2},
    task_features=("inputs", "targets"),
    converter=seqio.PrefixLMFeatureConverter,
    pack=True,
    # No per-task metrics: SeqIO's converter adds a padding target to an example with
    # no targets, which would shift task ids against the tokens of the packed row.
    task_ids_along=(),
    loss=losses.prefix_lm,
    architectures=("prefix_lm",),
    example_model="gpt2_tiny",
    example_bindings=("ModelConfig.architecture = 'prefix_lm'",),
    reference="t5 preprocessors.prefix_lm; seqio PrefixLMFeatureConverter",
)

XLNET_PLM = Recipe(
    name="xlnet_plm",
    summary="XLNet permutation LM: two streams, 1/6 of the tokens predicted, "
    "Transformer-XL memory carried from step to step",
    task_objectives=("xlnet_plm",),
    length_keys=("input_k", "target"),
    lengths_for=recipe_checks.xlnet_lengths,
    task_features=("input_k", "target"),
    converter=lambda pack: fc.PermutationLmFeatureConverter(pack=pack),
    pack=False,
    loss=losses.permutation_lm,
    architectures=("xlnet",),
    example_model="xlnet_tiny",
    example_bindings=("XLNetOptions.mem_len = 48", "XLNetOptions.reuse_len = 32"),
    check_model=recipe_checks.xlnet_model_problems,
    rows_task=recipe_checks.xlnet_rows,
    reference="zihangdai/xlnet train_gpu.py, function_builder.two_stream_loss, modeling.lm_loss",
    differences="a row's memory is reset to zeros (the reference's initial memory) "
    "where its stream starts; the reference never resets; no bi_data",
)

TXL_LM = Recipe(
    name="txl_lm",
    summary="Transformer-XL LM: next-token prediction over contiguous segments, "
    "relative positions, memory of the previous segment carried from step to step",
    task_objectives=("txl_lm",),
    length_keys=("inputs", "targets"),
    lengths_for=lambda n: {"inputs": n, "targets": n},
    task_features=("inputs", "targets"),
    converter=lambda pack: fc.StreamLmFeatureConverter(pack=pack),
    pack=False,
    loss=losses.stream_lm,
    architectures=("transformer_xl",),
    example_model="txl_tiny",
    check_model=recipe_checks.txl_model_problems,
    rows_task=recipe_checks.txl_rows,
    reference="kimiyoung/transformer-xl pytorch/mem_transformer.py (MemTransformerLM, "
    "RelPartialLearnableMultiHeadAttn, _update_mems), pytorch/train.py, "
    "pytorch/data_utils.py (LMOrderedIterator); tf/model.py",
    differences="a full softmax over the vocabulary (no adaptive softmax or adaptive "
    "input); rows continue for steps_per_block steps, then start new text with their "
    "memory reset to zeros (the reference: one stream per row for the whole corpus, "
    "never reset); documents end with </s>; no variable-length segments (--varlen)",
)
