"""Reads a JSON body a client sent, refusing what json.loads lets through and later code cannot
take: json.loads guesses UTF-16 and UTF-32 (JSON is UTF-8, RFC 8259), keeps a lone surrogate
escape such as \\ud800 as a str that no UTF-8 encoder takes (protobuf, tokenizers and JSON
replies then fail), reads NaN and Infinity (not JSON), reads integers too long for protobuf's
int64 or torch's seeds, and recurses as deep as the body nests. Every refusal is a
json.JSONDecodeError whose message says what is wrong, and where when it can."""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 64  # levels of arrays and objects; a tool's JSON schema needs a handful
INT64 = range(-(2**63), 2**63)
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")  # the only way a surrogate gets into UTF-8 JSON
_SURROGATE = re.compile("[\ud800-\udfff]")


class _Refused(ValueError):
    """A number json.loads would have taken."""


def read_json(body: bytes) -> Any:
    """The value of a JSON body; json.JSONDecodeError when it is not one this server takes."""
    text = _utf8(body)
    try:
        value = json.loads(text, parse_constant=_not_a_number, parse_float=_finite, parse_int=_int64)
    except _Refused as exc:
        raise json.JSONDecodeError(str(exc), text, 0) from None
    except RecursionError:
        raise json.JSONDecodeError(f"nested deeper than {MAX_DEPTH} levels", text, 0) from None
    # Walking the value costs little, but most bodies can skip it: without enough brackets they
    # cannot nest too deep, and without a surrogate escape they hold no surrogate.
    if text.count("[") + text.count("{") > MAX_DEPTH or _ESCAPED_SURROGATE.search(text):
        _check_strings_and_depth(value, text)
    return value


def json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words (for messages)."""
    if value is None:
        return "null"
    kinds = ((bool, "a boolean"), (dict, "an object"), (list, "an array"), (str, "a string"), ((int, float), "a number"))
    return next(name for kind, name in kinds if isinstance(value, kind))


def _utf8(body: bytes) -> str:
    try:
        return body.decode("utf-8-sig")  # a byte order mark may be ignored (RFC 8259, 8.1)
    except UnicodeDecodeError as exc:
        raise json.JSONDecodeError(f"the body is not UTF-8 text (byte 0x{body[exc.start]:02x} at offset {exc.start})", "", 0) from None


def _not_a_number(name: str) -> float:
    raise _Refused(f"{name} is not a JSON number: numbers must be finite")


def _finite(digits: str) -> float:
    value = float(digits)
    if not math.isfinite(value):
        raise _Refused(f"the number {_shortened(digits)} is beyond the range of a double")
    return value


def _int64(digits: str) -> int:
    # The length check comes first: int() of thousands of digits is slow, and refused past 4300.
    if len(digits) > 20 or int(digits) not in INT64:
        raise _Refused(f"the integer {_shortened(digits)} does not fit in 64 bits")
    return int(digits)


def _shortened(digits: str) -> str:
    return digits if len(digits) <= 24 else f"{digits[:12]}... ({len(digits)} characters)"


def _check_strings_and_depth(value: Any, text: str) -> None:
    stack = [(value, "", 0)]
    while stack:
        node, where, depth = stack.pop()
        if isinstance(node, str):
            _check_text(node, where or "the body", text)
            continue
        if not isinstance(node, (dict, list)):
            continue
        if depth == MAX_DEPTH:  # named by its top-level field: the full path would be levels long
            raise json.JSONDecodeError(f"{where.split('.')[0]} is nested deeper than {MAX_DEPTH} levels", text, 0)
        for key, child in node.items() if isinstance(node, dict) else enumerate(node):
            path = f"{where}.{_visible(key)}" if where else _visible(key)
            if isinstance(key, str):
                _check_text(key, f"the key {path}", text)
            stack.append((child, path, depth + 1))


def _check_text(string: str, where: str, text: str) -> None:
    found = _SURROGATE.search(string)
    if found:
        escape = f"\\u{ord(found.group()):04x}"
        raise json.JSONDecodeError(
            f"{where} holds {escape}, a lone UTF-16 surrogate (half of a pair), which is no character: strings must be "
            "valid Unicode", text, 0)


def _visible(key: str | int) -> str:
    """A key as a message can show it: a surrogate written as its escape."""
    return str(key).encode("utf-8", "backslashreplace").decode("utf-8")
