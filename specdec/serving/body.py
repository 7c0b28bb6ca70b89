"""A request body parsed as JSON within bounds, every refusal a 400 naming the field.

The body must be UTF-8 JSON text (no NaN or Infinity) holding an object, nested at most
``MAX_DEPTH`` deep, whose integers fit in 64 bits and whose other numbers are finite and at
most ``MAX_NUMBER_CHARS`` characters long, and whose strings (keys too) are Unicode text: a
lone surrogate such as ``"\\ud800"`` is refused. An out-of-range number is kept as a marker
while parsing, so that the error can name the field that holds it.
"""

from __future__ import annotations

import json
import math
import re

from specdec.serving.errors import bad

MAX_DEPTH = 32  # a chat with content parts is 5 deep
MAX_INT = 2**63  # integers in [-2**63, 2**63)
MAX_NUMBER_CHARS = 64
_SURROGATE = re.compile("[\ud800-\udfff]")
# a long string is searched in slices, each short enough not to hold up the others
_SEARCH_CHARS = 1 << 18


def _has_surrogate(text: str) -> bool:
    if text.isascii():
        return False
    return any(
        _SURROGATE.search(text, start, start + _SEARCH_CHARS)
        for start in range(0, len(text), _SEARCH_CHARS)
    )


class _Refused:
    """A number that parsing kept out: its literal (shortened) and why."""

    __slots__ = ("literal", "why")

    def __init__(self, literal: str, why: str):
        self.literal = (
            literal if len(literal) <= 24 else f"{literal[:20]}... ({len(literal)} characters)"
        )
        self.why = why


def _parse_int(literal: str):
    if len(literal) > 20:
        return _Refused(literal, "is out of range (integers must fit in 64 bits)")
    value = int(literal)
    return (
        value
        if -MAX_INT <= value < MAX_INT
        else _Refused(literal, "is out of range (integers must fit in 64 bits)")
    )


def _parse_float(literal: str):
    if len(literal) > MAX_NUMBER_CHARS:
        return _Refused(literal, f"is longer than {MAX_NUMBER_CHARS} characters")
    value = float(literal)
    return value if math.isfinite(value) else _Refused(literal, "is out of range")


def _parse_constant(literal: str):
    return _Refused(literal, "is not a JSON number")


def path_text(path: tuple) -> str:
    """``messages[0].content`` for ("messages", 0, "content")."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _field(path: tuple) -> str | None:
    return str(path[0]) if path else None


def parse(raw: bytes) -> dict:
    """The JSON object of a request body, or an APIError (400) saying what is wrong and where."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise bad(
            f"the request body is not valid UTF-8 (byte {error.start})", code="invalid_json"
        ) from None
    try:
        body = json.loads(
            text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant
        )
    except json.JSONDecodeError as error:
        raise bad(
            f"the request body is not valid JSON: {error.msg} at line {error.lineno} column "
            f"{error.colno}",
            code="invalid_json",
        ) from None
    except RecursionError:
        raise bad(
            f"the request body is nested deeper than {MAX_DEPTH} levels", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    check(body)
    return body


def check(body: dict) -> None:
    """Walk ``body`` depth first for depth, refused numbers and lone surrogates, holding one
    iterator per level (no recursion, and no memory beyond ``MAX_DEPTH`` entries)."""
    stack = [(iter(body.items()), ())]
    while stack:
        items, path = stack[-1]
        for key, item in items:
            if isinstance(key, str) and _has_surrogate(key):
                raise bad(
                    f"a key of {path_text(path) or 'the request body'} holds a lone surrogate, "
                    "which is not Unicode text",
                    _field(path),
                )
            if isinstance(item, (dict, list)):
                where = path + (key,)
                if len(stack) >= MAX_DEPTH:
                    raise bad(
                        f"{path_text(where)} is nested deeper than {MAX_DEPTH} levels",
                        _field(where),
                    )
                stack.append(
                    (iter(item.items()) if isinstance(item, dict) else enumerate(item), where)
                )
                break
            if isinstance(item, str):
                if _has_surrogate(item):
                    where = path + (key,)
                    raise bad(
                        f"{path_text(where)} holds a lone surrogate (an unpaired \\ud800-\\udfff "
                        "escape), which is not Unicode text",
                        _field(where),
                    )
            elif isinstance(item, _Refused):
                where = path + (key,)
                raise bad(
                    f"{path_text(where)}: the number {item.literal} {item.why}", _field(where)
                )
        else:
            stack.pop()
