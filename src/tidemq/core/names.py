"""The one rule for topic and group names, checked by the client at the call and again by
the broker (clients of other languages, or a raw request, skip the first check).

A *user name*, the name of a topic or group a user creates, is 1 to 127 characters (120
for a group, so that its retry topic ``%RETRY%<group>`` is a valid topic name) from
``A-Z a-z 0-9 _ . -`` that does not begin with ``.`` or ``-``. So it is safe as a directory
name (never ``.`` or ``..``), as a command-line argument (never ``-rf``) and in logs.

``%`` is reserved: a name containing it is *internal*, made by tidemq itself from user
names, and only in these forms::

    topics   %RETRY%<group>   %DLQ%<group>   %SYS%<NAME>
    groups   %REDRIVE%<group>   <group>%BROADCAST%<member>

Clients cannot create internal topics (the broker creates them when a group first needs
one), but may read them and commit offsets under internal group names (the admin's
redrive, broadcasting consumers).
"""

from __future__ import annotations

import re
from typing import Final

from tidemq.core import limits

__all__ = [
    "GROUP_NAME_PATTERN",
    "MEMBER_PATTERN",
    "NAME_RULE",
    "USER_NAME_PATTERN",
    "is_group_name",
    "is_internal_topic",
    "is_topic_name",
    "is_user_name",
    "tag_problem",
    "user_name_problem",
]

#: A user-chosen topic name (see the module docstring), and a group name.
USER_NAME_PATTERN: Final = rf"[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{limits.MAX_TOPIC_NAME_BYTES - 1}}}"
GROUP_NAME_PATTERN: Final = rf"[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{limits.MAX_GROUP_NAME_BYTES - 1}}}"
#: A broadcasting member's stable name (it appears only inside an internal group name).
MEMBER_PATTERN: Final = r"[A-Za-z0-9_.:-]{1,100}"
#: The rule in words, for error messages and documentation.
NAME_RULE: Final = (
    f"1-{limits.MAX_TOPIC_NAME_BYTES} characters ({limits.MAX_GROUP_NAME_BYTES} for a group) "
    "from A-Z a-z 0-9 _ . -, "
    "not starting with '.' or '-' ('%' is reserved for tidemq's internal names)"
)

_USER: Final = re.compile(USER_NAME_PATTERN)
_GROUP: Final = re.compile(GROUP_NAME_PATTERN)
#: The group part of a per-group internal name. Looser than GROUP_NAME_PATTERN (it may
#: start with "." or "-"), so that the retry and dead-letter topics of groups made before
#: the rule, which the broker's pop service still serves, can be created.
_GROUP_PART: Final = rf"[A-Za-z0-9_.-]{{1,{limits.MAX_GROUP_NAME_BYTES}}}"
_INTERNAL_TOPIC: Final = re.compile(rf"%(?:RETRY|DLQ)%{_GROUP_PART}|%SYS%[A-Z][A-Z_]{{0,31}}")
_INTERNAL_GROUP: Final = re.compile(
    rf"%REDRIVE%{_GROUP_PART}|{GROUP_NAME_PATTERN}%BROADCAST%{MEMBER_PATTERN}"
)


def is_user_name(name: str) -> bool:
    """A name a user may give a topic or group."""
    return _USER.fullmatch(name) is not None


def is_internal_topic(name: str) -> bool:
    """One of tidemq's own topic names (%RETRY%g, %DLQ%g, %SYS%X)."""
    return _INTERNAL_TOPIC.fullmatch(name) is not None


def is_topic_name(name: str) -> bool:
    """A name a topic may have: a user name or an internal one."""
    return is_user_name(name) or is_internal_topic(name)


def is_group_name(name: str) -> bool:
    """A name a group may have: a user name or an internal one (%REDRIVE%g,
    g%BROADCAST%member)."""
    return _GROUP.fullmatch(name) is not None or _INTERNAL_GROUP.fullmatch(name) is not None


def user_name_problem(name: str, *, group: bool = False) -> str | None:
    """Why `name` is not a valid user topic name (or group name, with `group`): a phrase
    to put after the name; None if it is valid."""
    if (_GROUP if group else _USER).fullmatch(name) is not None:
        return None  # the common case, in one regex call (this runs on every send)
    return _name_problem(name, group=group)


def _name_problem(name: str, *, group: bool) -> str:
    if not name:
        return "is empty"
    longest = limits.MAX_GROUP_NAME_BYTES if group else limits.MAX_TOPIC_NAME_BYTES
    if len(name) > longest:
        return f"is longer than {longest} characters"
    if "%" in name:
        return "contains '%', which is reserved for tidemq's internal names"
    if name[0] in ".-":
        return f"starts with {name[0]!r}"
    bad = next((c for c in name if not re.fullmatch(r"[A-Za-z0-9_.-]", c)), None)
    if bad is not None:
        return f"contains {bad!r}"
    return "does not follow the rule"


def tag_problem(tag: str) -> str | None:
    """Why `tag` can never be matched by a tag subscription (a phrase to put after the
    tag), or None: the tags a subscription can name (core/filters/tag_expression.py) are
    exactly those for which this is None. Subscriptions split on "||" and strip blanks,
    and refuse "|" inside a tag, so a tag holding either would be stored but unreachable.
    The empty tag is allowed (only "*" matches it, as it matches no tag)."""
    if "|" in tag:
        return "contains '|' (subscriptions separate tags with '||')"
    if any(c.isspace() for c in tag):
        return "contains whitespace, which a subscription strips"
    if not tag.isprintable():
        return "contains a control character"
    if len(tag.encode(errors="surrogatepass")) > limits.MAX_TAG_BYTES:
        return f"is longer than {limits.MAX_TAG_BYTES} bytes in UTF-8"
    return None
