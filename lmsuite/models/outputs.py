"""The heads every single-stack family may carry, applied to its final states: one place that
names each head's submodule (`mlm_head`, `lm_head`, `classifier`, `rtd_head`, span boundary,
`label_<name>` for each `LabelHead`)."""

from lmsuite.models import span_boundary
from lmsuite.models.config import ModelConfig
from lmsuite.models.heads import (
    Classifier,
    ReplacedTokenHead,
    TokenClassifier,
    VocabHead,
    gather_positions,
)


def head_outputs(
    config: ModelConfig,
    token_embedder,
    hidden,
    *,
    deterministic: bool,
    initializing: bool,
    masked_positions=None,
    spans=None,
    mlm_in=None,
) -> dict:
    """{"hidden", and one "<head>_logits" per configured head}; call inside a compact method.

    mlm_in: the MLM head's own input where it differs from `hidden` (DeBERTa's enhanced mask
    decoder); spans: the "sbo" head's inputs (`span_boundary.span_inputs`).
    """
    cfg = config
    outputs = {"hidden": hidden}
    if "mlm" in cfg.heads:
        h = hidden if mlm_in is None else mlm_in
        h = h if masked_positions is None else gather_positions(h, masked_positions)
        head = VocabHead(
            config=cfg, token_embedder=token_embedder, transform=cfg.mlm_transform, name="mlm_head"
        )
        outputs["mlm_logits"] = head(h)
    if "lm" in cfg.heads:
        head = VocabHead(config=cfg, token_embedder=token_embedder, transform=False, name="lm_head")
        outputs["lm_logits"] = head(hidden)
    if "classifier" in cfg.heads:
        outputs["classifier_logits"] = Classifier(config=cfg, name="classifier")(
            hidden, deterministic=deterministic
        )
    if "rtd" in cfg.heads:
        outputs["rtd_logits"] = ReplacedTokenHead(config=cfg, name="rtd_head")(hidden)
    if "sbo" in cfg.heads:
        outputs |= span_boundary.outputs(
            cfg, token_embedder, hidden, spans, initializing=initializing
        )
    for label in cfg.label_heads:
        kind = TokenClassifier if label.per_token else Classifier
        head = kind(config=cfg, num_labels=label.num_labels, name=f"label_{label.name}")
        outputs[f"{label.name}_logits"] = head(hidden, deterministic=deterministic)
    return outputs
