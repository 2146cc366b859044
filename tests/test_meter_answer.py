"""The meter's answer format: exact SFT targets and a strict parser that never raises and never guesses."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltattg.data.trajectory import MeterOutput
from deltattg.meter.answer import LOGIT_PREFIX, MAX_TOKENS_TO_GO, format_answer, parse_answer

counts = st.integers(min_value=0, max_value=MAX_TOKENS_TO_GO)
answers = st.one_of(st.tuples(st.just(True), counts), st.just((False, None)))
json_space = st.text(alphabet=" \t\n\r", max_size=3)


def canonical_reading(text: str) -> MeterOutput | None:
    """An independent oracle: the reading of ``text`` iff the stock JSON decoder sees exactly the answer object."""
    try:
        pairs = json.loads(text, object_pairs_hook=list, parse_constant=float)
    except ValueError:
        return None
    if not isinstance(pairs, list) or [k for k, _ in pairs] != ["can_complete", "tokens_to_go"]:
        return None
    if not all(isinstance(p, tuple) for p in pairs):  # a JSON array of arrays, not an object
        return None
    (_, b), (_, v) = pairs
    if b is True and type(v) is int and 0 <= v <= MAX_TOKENS_TO_GO and "-" not in text:
        return MeterOutput(True, v)
    if b is False and v is None:
        return MeterOutput(False, None)
    return None


def test_format_is_the_documented_json_with_the_logit_prefix():
    assert format_answer(True, 412) == '{"can_complete": true, "tokens_to_go": 412}'
    assert format_answer(True, 0) == '{"can_complete": true, "tokens_to_go": 0}'
    assert format_answer(False, None) == '{"can_complete": false, "tokens_to_go": null}'
    assert format_answer(True, 7).startswith(LOGIT_PREFIX) and format_answer(False, None).startswith(LOGIT_PREFIX)
    assert format_answer(True, np.int64(412)) == format_answer(True, 412)  # labels computed with NumPy


@pytest.mark.parametrize(
    "can_complete, tokens_to_go",
    [(True, None), (True, -1), (True, 2.0), (True, True), (True, MAX_TOKENS_TO_GO + 1), (False, 0), (1, 5)],
)
def test_format_rejects_labels_outside_the_format(can_complete, tokens_to_go):
    with pytest.raises((TypeError, ValueError)):
        format_answer(can_complete, tokens_to_go)


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"can_complete": true, "tokens_to_go": 412}', MeterOutput(True, 412)),
        ('{"can_complete":true,"tokens_to_go":0}', MeterOutput(True, 0)),
        ('\n\t {"can_complete" :\nfalse , "tokens_to_go": null}\r\n ', MeterOutput(False, None)),
        (f'{{"can_complete": true, "tokens_to_go": {MAX_TOKENS_TO_GO}}}', MeterOutput(True, MAX_TOKENS_TO_GO)),
    ],
)
def test_parse_accepts_the_answer_with_any_json_whitespace(text, expected):
    assert parse_answer(text) == expected


MALFORMED = [
    "",
    "   ",
    "true",
    "null",
    "412",
    '"{\\"can_complete\\": true, \\"tokens_to_go\\": 4}"',  # the answer as a JSON string
    "{}",
    '{"can_complete": true}',  # missing key
    '{"can_complete": false}',
    '{"tokens_to_go": 4, "can_complete": true}',  # wrong order
    '{"can_complete": true, "tokens_to_go": 4, "confidence": 0.9}',  # extra key
    '{"can_complete": true, "can_complete": true, "tokens_to_go": 4}',  # duplicated key
    '{"can_complete": true, "tokens_to_go": 4, "tokens_to_go": 5}',
    '{"can_complete": true, "tokens_to_go": null}',  # true with null
    '{"can_complete": false, "tokens_to_go": 0}',  # false with a number
    '{"can_complete": "true", "tokens_to_go": 4}',  # wrong types
    '{"can_complete": 1, "tokens_to_go": 4}',
    '{"can_complete": null, "tokens_to_go": null}',
    '{"can_complete": true, "tokens_to_go": "412"}',
    '{"can_complete": true, "tokens_to_go": true}',
    '{"can_complete": true, "tokens_to_go": [412]}',
    '{"can_complete": true, "tokens_to_go": {"n": 412}}',
    '{"can_complete": true, "tokens_to_go": -1}',  # negative
    '{"can_complete": true, "tokens_to_go": -0}',
    '{"can_complete": true, "tokens_to_go": 412.0}',  # fraction or exponent
    '{"can_complete": true, "tokens_to_go": 4.12e2}',
    '{"can_complete": true, "tokens_to_go": 1E3}',
    '{"can_complete": true, "tokens_to_go": NaN}',
    '{"can_complete": true, "tokens_to_go": Infinity}',
    '{"can_complete": true, "tokens_to_go": 0412}',  # leading zero
    f'{{"can_complete": true, "tokens_to_go": {MAX_TOKENS_TO_GO + 1}}}',  # beyond exact floats
    '{"can_complete": true, "tokens_to_go": ' + "9" * 5000 + "}",  # beyond Python's int-parsing limit
    '{"can_complete": True, "tokens_to_go": 4}',  # Python, not JSON
    "{'can_complete': true, 'tokens_to_go': 4}",
    '{"can_complete": true, "tokens_to_go": 4,}',
    '{"can_complete": true, "tokens_to_go": 4}.',  # trailing garbage
    '{"can_complete": true, "tokens_to_go": 4}<|im_end|>',
    '{"can_complete": true, "tokens_to_go": 4} {"can_complete": true, "tokens_to_go": 5}',  # two objects
    'Answer: {"can_complete": true, "tokens_to_go": 4}',
    '```json\n{"can_complete": true, "tokens_to_go": 4}\n```',  # Markdown fence
    '[{"can_complete": true, "tokens_to_go": 4}]',
    '[["can_complete", true], ["tokens_to_go", 4]]',  # the pairs as an array
    '\u00a0{"can_complete": true, "tokens_to_go": 4}',  # not JSON whitespace
    '{"can_complete": true, "tokens_to_go": 4',  # truncated generation
    "[" * 100_000,  # deep nesting
]


@pytest.mark.parametrize("text", MALFORMED)
def test_parse_rejects_anything_else(text):
    assert parse_answer(text) is None


@pytest.mark.parametrize("value", [None, b'{"can_complete": false, "tokens_to_go": null}', 412, ["x"]])
def test_parse_rejects_non_strings_without_raising(value):
    assert parse_answer(value) is None


@given(answers, json_space, json_space)
def test_every_formatted_answer_round_trips(answer, before, after):
    assert parse_answer(before + format_answer(*answer) + after) == MeterOutput(*answer)


@given(st.text())
def test_arbitrary_text_never_raises_and_agrees_with_the_oracle(text):
    assert parse_answer(text) == canonical_reading(text)


# Values that come close to the answer: the right keys and types, and their typical corruptions.
json_values = st.one_of(
    st.booleans(),
    st.none(),
    st.integers(min_value=-5, max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["412", "true", ""]),
    st.lists(st.integers(0, 9), max_size=2),
)
near_objects = st.one_of(
    st.tuples(st.tuples(st.just("can_complete"), json_values), st.tuples(st.just("tokens_to_go"), json_values)),
    st.lists(st.tuples(st.sampled_from(["can_complete", "tokens_to_go", "confidence"]), json_values), max_size=3),
)


@settings(max_examples=300)
@given(near_objects, st.booleans())
def test_near_miss_objects_are_read_exactly_when_they_are_the_answer(pairs, compact):
    separators = (",", ":") if compact else (", ", ": ")
    body = ", ".join(f"{json.dumps(k)}{separators[1]}{json.dumps(v)}" for k, v in pairs)
    text = "{" + body + "}"
    assert parse_answer(text) == canonical_reading(text)


@settings(max_examples=300)
@given(answers, st.data())
def test_single_character_edits_of_an_answer_never_yield_a_wrong_reading(answer, data):
    text = format_answer(*answer)
    position = data.draw(st.integers(0, len(text)))
    edit = data.draw(st.sampled_from(["insert", "delete", "replace"]))
    char = data.draw(st.sampled_from(list('{}[]":,.-+e0123456789 tfnulrx`\n') + [chr(0)]))
    if edit == "insert":
        edited = text[:position] + char + text[position:]
    elif edit == "delete":
        edited = text[:position] + text[position + 1 :]
    else:
        edited = text[:position] + char + text[position + 1 :]
    assert parse_answer(edited) == canonical_reading(edited)
