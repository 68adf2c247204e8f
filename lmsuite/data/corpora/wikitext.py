"""Turn MediaWiki markup into plain paragraphs of prose.

A deliberately small stripper for article text, in the spirit of wikiextractor: it keeps what a
reader sees as running prose and drops navigation, references and layout.

  - HTML comments, `<ref>` footnotes and the content of non-prose tags (`<math>`, `<gallery>`,
    ...) are removed; other tags (`<small>`, `<span>`, `<br/>`) are unwrapped.
  - Templates `{{...}}`, nested to any depth, are removed, except a few that render inline text:
    `{{nowrap|x}}` -> x, `{{lang|fr|x}}` / `{{lang-fr|x}}` -> x, `{{convert|5|km|mi}}` -> 5 km.
  - Tables `{| ... |}` (nested too) are removed.
  - Links: `[[a|b]]` -> b, `[[a]]s` -> as, `[[File:...|...[[x]]...]]`, `[[Category:...]]` and
    interlanguage links are dropped; `[http://x label]` -> label, `[http://x]` is dropped.
  - Headings end a paragraph and are dropped; sections such as "References" or "External links"
    are dropped whole. List markers (`*`, `#`, `:`, `;`) are removed, keeping the item text.
  - Bold/italic quotes are removed and HTML entities decoded.

Example:
  >>> wikitext_to_paragraphs("{{Infobox|a={{b}}}}'''Ada''' was a [[mathematics|mathematician]]"
  ...                        "<ref>x</ref>.\\n== See also ==\\n* [[Babbage]]")
  ['Ada was a mathematician.']
"""

import html
import re

_DROPPED_SECTIONS = frozenset(
    {
        "references",
        "external links",
        "see also",
        "further reading",
        "notes",
        "bibliography",
        "sources",
        "footnotes",
        "citations",
        "notes and references",
        "works cited",
    }
)
_DROPPED_LINK_NAMESPACES = frozenset(
    {"file", "image", "media", "category", "wikipedia", "wp", "help", "portal", "template", "wikt"}
)
_DROPPED_TAGS = (
    "math",
    "gallery",
    "timeline",
    "syntaxhighlight",
    "source",
    "score",
    "imagemap",
    "chem",
    "ce",
    "hiero",
    "graph",
    "templatedata",
)

_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)
_REF_SELF_CLOSING = re.compile(r"<ref\b[^>]*/>", re.IGNORECASE)
_REF = re.compile(r"<ref\b[^>]*>.*?(?:</ref\s*>|\Z)", re.IGNORECASE | re.DOTALL)
_DROPPED_TAG = re.compile(
    r"<(" + "|".join(_DROPPED_TAGS) + r")\b[^>]*>.*?(?:</\1\s*>|\Z)",
    re.IGNORECASE | re.DOTALL,
)
_INNERMOST_TEMPLATE = re.compile(r"\{\{([^{}]*)\}\}")
_INNERMOST_LINK = re.compile(r"\[\[([^\[\]]*)\]\]")
_FILE_LINK_START = re.compile(r"\[\[\s*(?:file|image|media)\s*:", re.IGNORECASE)
_DOUBLE_BRACKET = re.compile(r"\[\[|\]\]")
_EXTERNAL_LINK = re.compile(r"\[(?:https?:|ftp:|//)[^\s\]]*(?:\s+([^\]]*))?\]")
_HEADING = re.compile(r"^(={1,6})\s*(.*?)\s*\1\s*$")
_BOLD_ITALIC = re.compile(r"'{2,}")
_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9]*\b[^<>]*/?>")
_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_LANGUAGE_CODE = re.compile(r"^[a-z]{2,3}(?:-[a-z]{2,8})*$")
_REDIRECT = re.compile(r"^\s*#redirect\b", re.IGNORECASE)
_SPACES = re.compile(r"[ \t\u00a0]+")
_EMPTY_PARENS = re.compile(r"\(\s*[,;]?\s*\)")
_SPACE_BEFORE_PUNCT = re.compile(r" +([,.;:!?])")


def is_redirect(wikitext: str) -> bool:
    """True for a redirect page (`#REDIRECT [[Target]]`, any case)."""
    return bool(_REDIRECT.match(wikitext))


def wikitext_to_paragraphs(wikitext: str) -> list[str]:
    """Strip markup from one article; returns its non-empty prose paragraphs in order."""
    text = _COMMENT.sub("", wikitext)
    text = _REF_SELF_CLOSING.sub("", text)
    text = _REF.sub("", text)
    text = _DROPPED_TAG.sub("", text)
    text = _substitute_innermost(_INNERMOST_TEMPLATE, _render_template, text)
    text = text.replace("{{", "").replace("}}", "")
    text = _remove_tables(text)
    text = _EXTERNAL_LINK.sub(lambda m: m.group(1) or "", text)
    text = _substitute_innermost(_INNERMOST_LINK, _render_link, text)
    text = _remove_unbalanced_file_links(text)
    text = text.replace("[[", "").replace("]]", "")
    text = _MAGIC_WORD.sub("", text)
    text = _BR.sub(" ", text)
    paragraphs = []
    for line in _prose_lines(text):
        line = _BOLD_ITALIC.sub("", line)
        line = _TAG.sub("", line)
        line = html.unescape(line)
        line = _EMPTY_PARENS.sub("", line)
        line = _SPACES.sub(" ", line).strip()
        line = _SPACE_BEFORE_PUNCT.sub(r"\1", line)
        if line and any(c.isalnum() for c in line):
            paragraphs.append(line)
    return paragraphs


def _substitute_innermost(pattern: re.Pattern, render, text: str) -> str:
    # Replacing innermost constructs first handles any nesting depth without a parser.
    while True:
        new_text = pattern.sub(lambda m: render(m.group(1)), text)
        if new_text == text:
            return text
        text = new_text


def _render_template(body: str) -> str:
    args = [a.strip() for a in body.split("|")]
    name = args[0].lower().replace("_", " ")
    positional = [a for a in args[1:] if "=" not in a]
    if name in ("nowrap", "nobr", "ill", "small") and positional:
        return positional[0]
    if name == "lang" and len(positional) >= 2:
        return positional[1]
    if name.startswith("lang-") and positional:
        return positional[0]
    if name in ("convert", "cvt") and len(positional) >= 2:
        return f"{positional[0]} {positional[1]}"
    if name in ("ndash", "snd"):
        return "\u2013"
    if name == "mdash":
        return "\u2014"
    return ""


def _render_link(body: str) -> str:
    target, _, label = body.partition("|")
    target = target.strip()
    namespace, colon, _ = target.lstrip(":").partition(":")
    namespace = namespace.strip().lower()
    if colon and (namespace in _DROPPED_LINK_NAMESPACES or _LANGUAGE_CODE.match(namespace)):
        if not target.startswith(":") or namespace in ("file", "image", "media"):
            return ""
    if "|" in body:
        # The "pipe trick" `[[Paris, Texas|]]` shows the target without its qualifier.
        return label.rsplit("|", 1)[-1] if label else re.sub(r"\s*[(,].*$", "", target)
    return target.lstrip(":")


def _remove_unbalanced_file_links(text: str) -> str:
    # A caption holding a lone "[" or "]" defeats the innermost rule; count "[[" / "]]" instead.
    while (start := _FILE_LINK_START.search(text)) is not None:
        depth, end = 0, len(text)
        for token in _DOUBLE_BRACKET.finditer(text, start.start()):
            depth += 1 if token.group() == "[[" else -1
            if depth == 0:
                end = token.end()
                break
        text = text[: start.start()] + text[end:]
    return text


def _remove_tables(text: str) -> str:
    kept, depth = [], 0
    for line in text.split("\n"):
        stripped = line.lstrip()
        if stripped.startswith("{|"):
            depth += 1
        elif depth and stripped.startswith("|}"):
            depth -= 1
        elif depth == 0:
            kept.append(line)
    return "\n".join(kept)


def _prose_lines(text: str):
    """Yields the lines of prose, dropping headings, unwanted sections and list markers."""
    dropping_level = 0
    for line in text.split("\n"):
        heading = _HEADING.match(line.strip())
        if heading:
            level = len(heading.group(1))
            if dropping_level and level > dropping_level:
                continue
            title = _BOLD_ITALIC.sub("", heading.group(2)).strip().lower()
            dropping_level = level if title in _DROPPED_SECTIONS else 0
            continue
        if dropping_level:
            continue
        stripped = line.strip()
        if stripped.startswith("----"):
            continue
        yield stripped.lstrip("*#:;").strip()
