"""Tag expressions: ``"*"`` (every message) or ``"TagA || TagB"`` (a message whose tag is
one of these).

The broker filters in two steps. `TagExpression.summary_mask()` is the OR of the batch
tag-summary bits (`tidemq.core.batch.tag_bit`) of the wanted tags, so a batch whose
``tag_summary & mask == 0`` holds no matching message and is skipped from the queue index
alone. The summary is a Bloom word (64 bits, one per tag hash), so a batch that passes may
still hold none: `TagExpression.matches` then checks each message's tag exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from tidemq.core import limits
from tidemq.core.batch import tag_summary_for
from tidemq.core.filters.errors import FilterSyntaxError

__all__ = [
    "MAX_TAG_EXPRESSION_LENGTH",
    "MAX_TAG_EXPRESSION_TAGS",
    "TagExpression",
    "parse_tag_expression",
]

#: Characters in one tag expression. With tags of at most `limits.MAX_TAG_BYTES` this still
#: leaves room for dozens of alternatives, and bounds the work of parsing what a client sends.
MAX_TAG_EXPRESSION_LENGTH: Final = 4096
#: Alternatives in one expression. The summary has 64 bits, so a few dozen tags already set
#: most of them and skip few batches; past this a SQL92 ``TAGS IN (...)`` filter is the tool.
MAX_TAG_EXPRESSION_TAGS: Final = 256

_LANGUAGE: Final = "tag"
_SEPARATOR: Final = "||"
_ALL: Final = "*"


@dataclass(frozen=True, slots=True)
class TagExpression:
    """A parsed tag expression. ``tags`` is None for "every message" (``"*"`` or empty),
    else the set of wanted tags; a message without a tag matches only "every message"."""

    text: str
    tags: frozenset[str] | None
    _mask: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_mask", 0 if self.tags is None else tag_summary_for(self.tags))

    def matches(self, tag: str | None) -> bool:
        """Whether a message with this tag (None: no tag) is wanted."""
        return self.tags is None or tag in self.tags

    def summary_mask(self) -> int:
        """The batch tag-summary bits of the wanted tags: a batch whose ``tag_summary`` shares
        no bit with it cannot hold a matching message. 0 for "every message", which is the
        store's and the fetch request's "do not skip" (never skip on a 0 mask)."""
        return self._mask


def parse_tag_expression(text: str) -> TagExpression:
    """Parse ``"*"``, ``""`` (both: every message) or ``"A || B || ..."``.

    Whitespace around tags is ignored. A tag is 1 to `limits.MAX_TAG_BYTES` UTF-8 bytes of
    printable characters other than whitespace and ``|``. Raises `FilterSyntaxError` (an
    `InvalidRequest`) naming the problem and its column for an empty alternative
    (``"A || "``), a bad character, a tag too long, ``*`` among other tags, or an expression
    over `MAX_TAG_EXPRESSION_LENGTH` characters or `MAX_TAG_EXPRESSION_TAGS` alternatives.
    """
    if len(text) > MAX_TAG_EXPRESSION_LENGTH:
        raise FilterSyntaxError(
            _LANGUAGE,
            f"expression is longer than {MAX_TAG_EXPRESSION_LENGTH} characters",
            MAX_TAG_EXPRESSION_LENGTH + 1,
        )
    stripped = text.strip()
    if not stripped or stripped == _ALL:
        return TagExpression(text, None)
    pieces = text.split(_SEPARATOR)
    if len(pieces) > MAX_TAG_EXPRESSION_TAGS:
        raise FilterSyntaxError(
            _LANGUAGE,
            f"more than {MAX_TAG_EXPRESSION_TAGS} tags",
            _nth_separator(text, MAX_TAG_EXPRESSION_TAGS) + 1,
        )
    tags: set[str] = set()
    offset = 0  # of the current piece in text
    for i, piece in enumerate(pieces):
        tag = piece.strip()
        start = offset + len(piece) - len(piece.lstrip())
        if not tag:
            if i == 0:
                raise FilterSyntaxError(_LANGUAGE, "expected a tag before '||'", start + 1)
            raise FilterSyntaxError(_LANGUAGE, "expected a tag after '||'", start + 1)
        _check_tag(tag, start)
        tags.add(tag)
        offset += len(piece) + len(_SEPARATOR)
    return TagExpression(text, frozenset(tags))


def _check_tag(tag: str, start: int) -> None:
    if tag == _ALL:
        raise FilterSyntaxError(
            _LANGUAGE, "'*' (every tag) cannot be combined with other tags", start + 1
        )
    bar = tag.find("|")
    if bar >= 0:
        raise FilterSyntaxError(
            _LANGUAGE,
            "'|' is not allowed in a tag (alternatives are separated by '||')",
            start + bar + 1,
        )
    for j, char in enumerate(tag):
        if char.isspace() or not char.isprintable():
            raise FilterSyntaxError(
                _LANGUAGE, f"character {char!r} is not allowed in a tag", start + j + 1
            )
    size = len(tag.encode())  # printable: no lone surrogates, so this cannot fail
    if size > limits.MAX_TAG_BYTES:
        raise FilterSyntaxError(
            _LANGUAGE,
            f"tag {tag[:40]!r} is {size} bytes, over the limit of {limits.MAX_TAG_BYTES}",
            start + 1,
        )


def _nth_separator(text: str, n: int) -> int:
    """The offset of the n-th (1-based) '||' in text."""
    at = -len(_SEPARATOR)
    for _ in range(n):
        at = text.index(_SEPARATOR, at + len(_SEPARATOR))
    return at
