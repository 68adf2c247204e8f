"""The text side of a loaded model: its vocabulary, and that vocabulary as HF tokenizer files.

Two vocabularies answer the same small interface (`encode`, `decode`, the special ids):

  SentencePieceText  an lmsuite run's SeqIO SentencePiece vocabulary (`lmsuite.data.vocab`);
                     special tokens written in the text ("[MASK]", "<extra_id_0>") become their
                     ids, for SentencePiece itself never parses control pieces out of text.
  TokenizersText     a HF `tokenizer.json`, read with the `tokenizers` library.

`save_hf` writes tokenizer.json, tokenizer_config.json and special_tokens_map.json. For a
SentencePiece vocabulary it converts the model with transformers' own SentencePiece converter,
keeping every piece at its id (sentinels appended as SeqIO numbers them), and registers the
special pieces as HF special tokens, so that `transformers.pipeline("fill-mask", model=dir)`
tokenizes a text into the ids lmsuite does.

  >>> text = SentencePieceText(get_vocabulary("wiki_sample"), template="cls_sep")
  >>> text.encode("the cat [MASK] .")       # [CLS] ▁the ▁ cat [MASK] ▁ . [SEP]
  [2, 7, 15, 2082, 4, 15, 10, 3]
"""

import json
import os
import re

import numpy as np

from lmsuite import extras
from lmsuite.models import ModelConfig, families

# The HF roles of the lmsuite special pieces (lmsuite.data.vocab's id layout).
_LMSUITE_ROLES = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
    "bos_token": "<s>",
    "eos_token": "</s>",
}
TEMPLATES = ("cls_sep", "eos", "none")
_WORD_START = "\u2581"


def template_for(config: ModelConfig) -> str:
    """How an lmsuite task frames a text: encoders `[CLS] x [SEP]`, the others `x </s>`."""
    return "cls_sep" if families.family(config).bidirectional else "eos"


class SentencePieceText:
    """An lmsuite SeqIO SentencePiece vocabulary as the loaded model's text interface.

    Args:
      vocab: a `seqio.SentencePieceVocabulary` (e.g. `lmsuite.data.vocab.get_vocabulary`).
      template: the special ids `encode` adds: "cls_sep" ([CLS] x [SEP], what the encoder tasks
        feed), "eos" (x </s>, the seq2seq and LM tasks) or "none".
    """

    def __init__(self, vocab, *, template: str):
        if template not in TEMPLATES:
            raise ValueError(f"template must be one of {TEMPLATES}, got {template!r}")
        from sentencepiece import sentencepiece_model_pb2

        self.vocab, self.template = vocab, template
        self._sp = vocab.tokenizer
        self.proto = sentencepiece_model_pb2.ModelProto()
        self.proto.ParseFromString(vocab.sp_model)
        size = self._sp.get_piece_size()
        self.pieces = [self._sp.id_to_piece(i) for i in range(size)] + [
            f"<extra_id_{vocab.vocab_size - 1 - i}>" for i in range(size, vocab.vocab_size)
        ]
        special = [
            i for i in range(size) if self._sp.is_control(i) or self._sp.is_unknown(i)
        ] + list(range(size, vocab.vocab_size))
        self.special_ids = frozenset(special)
        self._special_by_text = {self.pieces[i]: i for i in special}
        self._splitter = _splitter(self._special_by_text)
        self.roles = {r: p for r, p in _LMSUITE_ROLES.items() if p in self._special_by_text}

    def token_id(self, role: str) -> int | None:
        """The id of a role ("mask_token", "pad_token", ...), None if the vocabulary lacks it."""
        return self._special_by_text.get(self.roles.get(role))

    @property
    def mask_token(self) -> str | None:
        return self.roles.get("mask_token")

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Ids of `text`: SentencePiece between the special tokens written in it."""
        ids: list[int] = []
        for chunk in self._splitter.split(text) if self._splitter else [text]:
            if chunk in self._special_by_text:
                ids.append(self._special_by_text[chunk])
            elif chunk:
                ids.extend(self._sp.encode(chunk))
        if add_special_tokens and self.template == "cls_sep":
            ids = [self.token_id("cls_token"), *ids, self.token_id("sep_token")]
        elif add_special_tokens and self.template == "eos":
            ids = [*ids, self.token_id("eos_token")]
        return ids

    def decode(self, ids, *, skip_special_tokens: bool = False) -> str:
        """The pieces joined, "▁" read as a space (what the exported tokenizer decodes too)."""
        kept = [int(i) for i in np.asarray(ids).reshape(-1)]
        if skip_special_tokens:
            kept = [i for i in kept if i not in self.special_ids]
        text = "".join(self.pieces[i] if 0 <= i < len(self.pieces) else "" for i in kept)
        text = text.replace(_WORD_START, " ")
        if self.proto.normalizer_spec.add_dummy_prefix:
            text = text.removeprefix(" ")
        return text

    def tokenizers_tokenizer(self):
        """The vocabulary as a `tokenizers.Tokenizer` with the same pieces, ids and specials."""
        extras.require("transformers", feature="tokenizer export")
        from tokenizers import AddedToken, processors
        from transformers.convert_slow_tokenizer import SpmConverter

        scores = [p.score for p in self.proto.pieces] + [0.0] * (
            len(self.pieces) - len(self.proto.pieces)
        )
        if self.proto.trainer_spec.model_type == 2:  # BPE: a piece -> id map
            table = {piece: i for i, piece in enumerate(self.pieces)}
        else:  # unigram: (piece, score) in id order
            table = list(zip(self.pieces, scores, strict=True))
        tokenizer = SpmConverter.build_tokenizer_from_spm_proto(self.proto, table)
        if tokenizer is None:
            raise ValueError(
                f"cannot convert SentencePiece model type {self.proto.trainer_spec.model_type} "
                "to a `tokenizers` tokenizer; expected unigram (1) or BPE (2)"
            )
        specials = [self.pieces[i] for i in sorted(self.special_ids)]
        tokenizer.add_special_tokens(
            [AddedToken(piece, special=True, normalized=False) for piece in specials]
        )
        pieces = {role: (p, self._special_by_text[p]) for role, p in self.roles.items()}
        if self.template == "cls_sep":
            (cls, _), (sep, _) = pieces["cls_token"], pieces["sep_token"]
            tokenizer.post_processor = processors.TemplateProcessing(
                single=f"{cls} $A {sep}",
                pair=f"{cls} $A {sep} $B:1 {sep}:1",
                special_tokens=[pieces["cls_token"], pieces["sep_token"]],
            )
        elif self.template == "eos":
            eos = pieces["eos_token"]
            tokenizer.post_processor = processors.TemplateProcessing(
                single=f"$A {eos[0]}", pair=f"$A {eos[0]} $B:1 {eos[0]}:1", special_tokens=[eos]
            )
        return tokenizer

    def save_hf(self, out_dir: str) -> list[str]:
        """Writes HF tokenizer files to `out_dir`; returns their paths."""
        return write_hf_tokenizer(self.tokenizers_tokenizer(), self.roles, out_dir)


def _splitter(special_by_text: dict[str, int]) -> re.Pattern | None:
    if not special_by_text:
        return None
    longest_first = sorted(special_by_text, key=len, reverse=True)
    return re.compile("(" + "|".join(map(re.escape, longest_first)) + ")")


class TokenizersText:
    """A `tokenizers.Tokenizer` (HF's tokenizer.json) as the loaded model's text interface.

    Args:
      tokenizer: the tokenizer; padding and truncation are turned off on a copy, as HF's
        pipelines do for one text.
      roles: HF role -> token text, e.g. {"mask_token": "[MASK]", "pad_token": "[PAD]"}.
      clean_up_tokenization_spaces: what the HF tokenizer config says; as in transformers it
        is not applied to BPE models.
    """

    def __init__(self, tokenizer, *, roles: dict[str, str], clean_up_tokenization_spaces=False):
        Tokenizer = extras.require("tokenizers", feature="a HF tokenizer").Tokenizer

        self.tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.roles = {k: v for k, v in roles.items() if v is not None}
        added = self.tokenizer.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, t in added.items() if t.special)
        is_bpe = type(self.tokenizer.model).__name__ == "BPE"
        self._clean_up = bool(clean_up_tokenization_spaces) and not is_bpe

    @classmethod
    def from_dir(cls, path: str) -> "TokenizersText":
        """From a HF directory's tokenizer.json (+ tokenizer_config / special_tokens_map)."""
        Tokenizer = extras.require("tokenizers", feature="a HF tokenizer").Tokenizer

        file = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(file):
            raise ValueError(
                f"{path} has no tokenizer.json (it holds {sorted(os.listdir(path))}); "
                "pass tokenizer= to lmsuite.load, or use ids"
            )
        settings = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):
            if os.path.isfile(os.path.join(path, name)):
                with open(os.path.join(path, name)) as f:
                    settings.update(json.load(f))
        roles = {r: _content(settings.get(r)) for r in _LMSUITE_ROLES}
        return cls(
            Tokenizer.from_file(file),
            roles=roles,
            clean_up_tokenization_spaces=settings.get("clean_up_tokenization_spaces", False),
        )

    @classmethod
    def from_transformers(cls, tokenizer) -> "TokenizersText":
        """From a transformers fast tokenizer (one with `.backend_tokenizer`)."""
        if not hasattr(tokenizer, "backend_tokenizer"):
            raise ValueError(
                f"tokenizer {type(tokenizer).__name__} has no backend_tokenizer: pass a fast "
                "(tokenizers-backed) transformers tokenizer, a tokenizers.Tokenizer or a directory"
            )
        roles = {r: _content(getattr(tokenizer, r, None)) for r in _LMSUITE_ROLES}
        return cls(
            tokenizer.backend_tokenizer,
            roles=roles,
            clean_up_tokenization_spaces=getattr(tokenizer, "clean_up_tokenization_spaces", False),
        )

    def token_id(self, role: str) -> int | None:
        token = self.roles.get(role)
        return None if token is None else self.tokenizer.token_to_id(token)

    @property
    def mask_token(self) -> str | None:
        return self.roles.get("mask_token")

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, *, skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        text = self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        return _clean_up(text) if self._clean_up else text

    def save_hf(self, out_dir: str) -> list[str]:
        return write_hf_tokenizer(self.tokenizer, self.roles, out_dir)


def _content(token) -> str | None:
    """A special token as saved by transformers: a string, an AddedToken or its dict."""
    if token is None or isinstance(token, str):
        return token
    if isinstance(token, dict):
        return token.get("content")
    return str(token)


def _clean_up(text: str) -> str:
    """transformers' `clean_up_tokenization`: no space before punctuation and contractions."""
    for spaced, joined in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                           (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
                           (" 're", "'re")):  # fmt: skip
        text = text.replace(spaced, joined)
    return text


def write_hf_tokenizer(tokenizer, roles: dict[str, str], out_dir: str) -> list[str]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json for `tokenizer`."""
    transformers = extras.require("transformers", feature="tokenizer export")
    PreTrainedTokenizerFast = transformers.PreTrainedTokenizerFast

    os.makedirs(out_dir, exist_ok=True)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **roles)
    written = list(wrapped.save_pretrained(out_dir))
    special_map = os.path.join(out_dir, "special_tokens_map.json")
    with open(special_map, "w") as f:
        json.dump(roles, f, indent=2, sort_keys=True)
    return sorted({os.path.join(out_dir, os.path.basename(p)) for p in [*written, special_map]})
