"""Feature converters SeqIO lacks: encoder MLM, MASS, classification probes and stream rows.

Seq2seq and decoder tasks use SeqIO's own converters (`EncDecFeatureConverter`,
`LMFeatureConverter`, `PrefixLMFeatureConverter`, packing with segment ids and positions
included). The rest, one module each, with its features and a worked example:

  encoder_mlm      `EncoderMlmFeatureConverter`: BERT-style MLM rows, L tokens and P gathered
                   predictions, padded or packed (not with sentence-level or per-token labels)
  mass             `MassFeatureConverter`: MASS's encoder-decoder rows, whose decoder inputs and
                   positions come from the task, padded or packed
  classification   `ClassificationFeatureConverter`: a probe's tokens and int label, padded
  streams          `PermutationLmFeatureConverter` (XLNet), `StreamLmFeatureConverter`
                   (Transformer-XL): stream rows, checked and cast
  task_ids         `with_task_ids`: a converter that also carries a mixture's task ids
  padding          what they share: pad to a static length after one check that nothing is cut

  >>> from lmsuite.data import feature_converters as fc
  >>> fc.EncoderMlmFeatureConverter(pack=True)(dataset, {"input_ids": 128, "masked_ids": 20})
"""

from lmsuite.data.feature_converters.classification import ClassificationFeatureConverter
from lmsuite.data.feature_converters.encoder_mlm import EncoderMlmFeatureConverter
from lmsuite.data.feature_converters.mass import MassFeatureConverter
from lmsuite.data.feature_converters.streams import (
    PermutationLmFeatureConverter,
    StreamLmFeatureConverter,
)
from lmsuite.data.feature_converters.task_ids import with_task_ids

__all__ = [
    "ClassificationFeatureConverter",
    "EncoderMlmFeatureConverter",
    "MassFeatureConverter",
    "PermutationLmFeatureConverter",
    "StreamLmFeatureConverter",
    "with_task_ids",
]
