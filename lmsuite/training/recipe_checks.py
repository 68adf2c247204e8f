"""Row-specific checks and layouts of the `xlnet_plm` and `txl_lm` recipes (`decoder_recipes.py`):
what each row needs beyond its features and architecture."""

from collections.abc import Mapping

import seqio

from lmsuite.data.preprocessors import xlnet
from lmsuite.models import ModelConfig


def xlnet_lengths(length: int) -> dict[str, int]:
    # The reference's num_predict for seq_len 512 is 85: (L - 3) tokens of A + B, 1 in 6.
    return {"input_k": length, "target": max(1, round((length - 3) / 6))}


def xlnet_rows(task: str, rows: int) -> str:
    return xlnet.stream_task(seqio.get_mixture_or_task(task), batch_size=rows).name


def txl_rows(task: str, rows: int) -> str:
    """The B-row task of a `*_txl_lm` task (`xlnet.stream_task`: the same row layout)."""
    return xlnet.stream_task(seqio.get_mixture_or_task(task), batch_size=rows).name


def txl_model_problems(config: ModelConfig, lengths: Mapping[str, int] | None) -> list[str]:
    del lengths  # every position of a segment enters the memory, whatever its length
    if config.xlnet is None:  # not a Transformer-XL: the architecture check names it
        return []
    if config.xlnet.mem_len is None:
        return [
            "the train state carries a fixed memory: set XLNetOptions.mem_len (the reference's "
            "WikiText-103 base: 150 for tgt_len 150), got None"
        ]
    return []


def xlnet_model_problems(config: ModelConfig, lengths: Mapping[str, int] | None) -> list[str]:
    if config.xlnet is None:  # not an XLNet: the architecture check names it
        return []
    opts, out = config.xlnet, []
    if opts.mem_len is None:
        out.append(
            "the train state carries a fixed memory: set XLNetOptions.mem_len (the reference: "
            "384 for seq_len 512), got None"
        )
    if opts.bi_data:
        out.append(
            "XLNetOptions.bi_data = True reads half the batch backwards, but the xlnet_plm data "
            "has no reversed rows; set XLNetOptions.bi_data = False"
        )
    if lengths and "input_k" in lengths:
        reuse = int(lengths["input_k"]) // 2
        if opts.reuse_len != reuse:
            out.append(
                f"XLNetOptions.reuse_len = {opts.reuse_len}, but the data's windows reuse their "
                f"first input_k // 2 = {reuse} positions (the next window starts there, so only "
                f"they belong in the memory); set XLNetOptions.reuse_len = {reuse}"
            )
    return out
