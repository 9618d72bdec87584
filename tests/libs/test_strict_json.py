"""The strict JSON reader of request bodies: what json.loads takes and later code cannot is
refused with a message saying what and where; JSON that is text is read as json.loads reads it."""

from __future__ import annotations

import json

import pytest
from gearshift.strict_json import MAX_DEPTH, json_kind, read_json


def refusal(body: bytes) -> str:
    with pytest.raises(json.JSONDecodeError) as refused:
        read_json(body)
    return refused.value.msg


def nested(levels: int) -> bytes:
    return b'{"a": ' + b"[" * levels + b"]" * levels + b"}"


@pytest.mark.parametrize("body", [
    b'{"model": "m", "messages": [{"role": "user", "content": "caf\xc3\xa9 \\u00e9 \\ud83d\\ude00"}], "n": 2, "t": 0.5}',
    b'{"text": "\\\\ud800"}',  # a backslash, then the letters: no surrogate
    b'\xef\xbb\xbf{"a": 1}',  # a UTF-8 byte order mark may be ignored
    b'{"big": 9223372036854775807, "small": -9223372036854775808, "tiny": 1e-400, "huge": 1.7e308}',
    b'[' * 3 + b']' * 3,
])
def test_json_that_is_text_reads_as_json_loads_reads_it(body):
    assert read_json(body) == json.loads(body.decode("utf-8-sig"))


def test_a_surrogate_pair_is_one_character():
    assert read_json(b'{"s": "\\ud83d\\ude00"}') == {"s": "\U0001f600"}


@pytest.mark.parametrize("body, message", [
    (b'{"messages": [{"content": "\\ud800"}]}', "messages.0.content holds \\ud800, a lone UTF-16 surrogate"),
    (b'{"s": "x\\udfff"}', "s holds \\udfff"),
    (b'{"s": "\\ude00\\ud83d"}', "s holds \\ude00"),  # a pair in the wrong order is two lone halves
    (b'{"k\\ud800": 1}', "the key k\\ud800 holds \\ud800"),
    (b'"\\ud800"', "the body holds \\ud800"),
])
def test_a_lone_surrogate_is_refused_where_it_is(body, message):
    assert message in refusal(body)


@pytest.mark.parametrize("body, message", [
    (b'{"a": "\xff"}', "not UTF-8 text (byte 0xff at offset 7)"),
    (b'{"a": "\xed\xa0\x80"}', "not UTF-8 text"),  # a surrogate encoded as UTF-8 bytes (CESU-8)
    ('{"a": 1}'.encode("utf-16"), "not UTF-8 text"),
    (b'{"t": NaN}', "NaN is not a JSON number"),
    (b'{"t": Infinity}', "Infinity is not a JSON number"),
    (b'{"t": -Infinity}', "-Infinity is not a JSON number"),
    (b'{"t": 1e400}', "the number 1e400 is beyond the range of a double"),
    (b'{"n": 9223372036854775808}', "the integer 9223372036854775808 does not fit in 64 bits"),
    (b'{"n": -9223372036854775809}', "does not fit in 64 bits"),
    (b'{"n": 1' + b"0" * 5000 + b"}", "(5001 characters) does not fit in 64 bits"),
    (b'{"a": 1', "Expecting"),
])
def test_what_later_code_cannot_take_is_refused(body, message):
    assert message in refusal(body)


def test_nesting_is_refused_past_the_limit_whether_or_not_the_parser_would_recurse_that_deep():
    assert read_json(nested(MAX_DEPTH - 1)) is not None  # the object around the arrays is a level too
    assert refusal(nested(MAX_DEPTH)) == f"a is nested deeper than {MAX_DEPTH} levels"
    assert refusal(nested(100_000)) == f"nested deeper than {MAX_DEPTH} levels"  # json.loads' RecursionError


def test_many_brackets_that_do_not_nest_are_read():
    body = b'{"a": [' + b",".join([b"[]"] * 500) + b'], "s": "' + b"[" * 200 + b'"}'
    assert len(read_json(body)["a"]) == 500


@pytest.mark.parametrize("value, kind", [
    (None, "null"), (True, "a boolean"), (1, "a number"), (1.5, "a number"), ("s", "a string"), ([], "an array"), ({}, "an object"),
])
def test_json_kinds_are_named_in_jsons_words(value, kind):
    assert json_kind(value) == kind
