"""A mixture's per-token task ids carried through a converter, so the loss can report per task.

SeqIO's converters drop features they do not know, and refuse passthrough features when they
pack; a mixture (`lmsuite.data.mixtures`) needs its `task_ids` to reach the batch aligned with
the tokens the loss weighs. `with_task_ids` turns a converter that has a place for them into one
that carries them.
"""

import seqio

from lmsuite.data import mixtures
from lmsuite.data.feature_converters.encoder_mlm import EncoderMlmFeatureConverter


class _EncDecWithTaskIds(seqio.EncDecFeatureConverter):
    """`EncDecFeatureConverter` also carrying a mixture's `task_ids` [M] (`with_task_ids`)."""

    def __init__(self, *, pack: bool = True, **kwargs):
        super().__init__(pack=pack, **kwargs)
        # SeqIO's constructor refuses passthrough features with packing, but its packer carries
        # them: `trim_and_pack_dataset` packs every feature of the lengths it is given, and an
        # example joins a row only if all fit, so task ids [M] stay aligned with the targets.
        self._passthrough_features = {mixtures.TASK_IDS: mixtures.TASK_IDS_SPEC}


class _LMWithTaskIds(seqio.LMFeatureConverter):
    """`LMFeatureConverter` that also carries a mixture's `task_ids` [L] (see `with_task_ids`)."""

    def __init__(self, *, pack: bool = True, **kwargs):
        super().__init__(pack=pack, **kwargs)
        self._passthrough_features = {mixtures.TASK_IDS: mixtures.TASK_IDS_SPEC}  # as above

    def get_model_feature_lengths(self, task_feature_lengths):
        lengths = dict(super().get_model_feature_lengths(task_feature_lengths))
        lengths[mixtures.TASK_IDS] = task_feature_lengths[mixtures.TASK_IDS]
        return lengths


def with_task_ids(converter: seqio.FeatureConverter) -> seqio.FeatureConverter:
    """The same conversion, also carrying a mixture's per-token `task_ids` along the tokens the
    loss weighs (`lmsuite.data.mixtures`): the targets of `EncDecFeatureConverter` and
    `LMFeatureConverter` (packed or not), the predictions of `EncoderMlmFeatureConverter` (as
    one more span feature).

    Raises:
      ValueError: for any other converter (its features would lose the alignment).
    """
    kind = type(converter)
    if kind is seqio.EncDecFeatureConverter:
        return _EncDecWithTaskIds(pack=converter.pack)
    if kind is seqio.LMFeatureConverter:
        return _LMWithTaskIds(pack=converter.pack)
    if kind is EncoderMlmFeatureConverter:
        return EncoderMlmFeatureConverter(
            labels=converter._labels,
            span_features=(*converter._span_features, mixtures.TASK_IDS),
            token_labels=converter._token_labels,
            sequence_features=converter._sequence_features,
            pack=converter.pack,
        )
    raise ValueError(
        f"{kind.__name__} cannot carry a mixture's task ids; per-task metrics need "
        "EncDecFeatureConverter, LMFeatureConverter or EncoderMlmFeatureConverter"
    )
