"""Task arguments to JSON: the framework's normalisation, and nothing that comes back different."""

import collections
import datetime as dt
import enum
import json
import math
import random
import types

import pytest

from django_rdbtasks.arguments import encode_arguments_and_values
from django_rdbtasks.compat import normalize_json
from django_rdbtasks.exceptions import ArgumentsNotJSON


class Colour(enum.StrEnum):
    RED = "red"


class Size(enum.IntEnum):
    LARGE = 3


def framework_round_trip(args, kwargs):
    """What enqueue did before: the framework's normalize_json, then a JSON round trip."""
    normalized = normalize_json([list(args), dict(kwargs)])
    text = (json.dumps(normalized[0], allow_nan=False), json.dumps(normalized[1], allow_nan=False))
    decoded = [json.loads(text[0]), json.loads(text[1])]
    return text, decoded, decoded == normalized


ACCEPTED = [
    ((), {}),
    ((1, "two", 3.5, True, None), {}),
    ((), {"invoice_id": 42, "email": "a@example.com"}),
    (((1, 2), [3, (4,)]), {"nested": {"k": (5, 6)}}),
    ((b"bytes",), {"b": b"\xc3\xa9"}),
    ((collections.OrderedDict(a=1),), {"m": types.MappingProxyType({"x": [1]})}),
    ((range(3), collections.deque([1, 2])), {}),
    ((Colour.RED, Size.LARGE), {"c": {Colour.RED: Size.LARGE}}),
    (("quote ' \" \\ \n 漢字 🎉", 2**70, -1.5e-300, -0.0), {"": ""}),
]


@pytest.mark.parametrize("args, kwargs", ACCEPTED)
def test_accepted_arguments_encode_as_the_framework_normalises_them(args, kwargs):
    _text, decoded, survived = framework_round_trip(args, kwargs)
    assert survived
    encoded_args, encoded_kwargs, (values, keywords) = encode_arguments_and_values(args, kwargs)
    assert (json.loads(encoded_args), json.loads(encoded_kwargs)) == (decoded[0], decoded[1])
    # What the result carries is what the task will be called with.
    assert [values, keywords] == decoded


def circular():
    value: list = []
    value.append(value)
    return value


@pytest.mark.parametrize(
    "args, kwargs, reason",
    [
        ((dt.date(2026, 1, 1),), {}, "Unsupported type"),
        (({1, 2},), {}, "Unsupported type"),
        ((object(),), {}, "Unsupported type"),
        ((), {"data": {1: "int key"}}, "dict keys must be strings"),
        (({True: "bool key"},), {}, "dict keys must be strings"),
        (({None: "None key"},), {}, "dict keys must be strings"),
        (({Size.LARGE: "IntEnum key"},), {}, "dict keys must be strings"),
        (({(1, 2): "tuple key"},), {}, "dict keys must be strings"),
        ((math.nan,), {}, "Out of range float"),
        ((), {"x": [math.inf]}, "Out of range float"),
        ((b"\xff",), {}, "Unsupported value"),
        ((circular(),), {}, "recursion"),
    ],
    ids=[
        "date",
        "set",
        "object",
        "int-key",
        "bool-key",
        "none-key",
        "intenum-key",
        "tuple-key",
        "nan",
        "inf",
        "bad-utf8",
        "circular",
    ],
)
def test_arguments_that_would_not_come_back_equal_are_refused(args, kwargs, reason):
    with pytest.raises(ArgumentsNotJSON, match=reason):
        encode_arguments_and_values(args, kwargs)
    # The framework's walk and a JSON round trip refuse or change each of them
    # too (its walk recurses without end on a circular value).
    if reason != "recursion":
        try:
            _text, _decoded, survived = framework_round_trip(args, kwargs)
        except (TypeError, ValueError):
            survived = False
        assert not survived


def itself_inside():
    value: dict = {}
    value["self"] = [value]
    return value


@pytest.mark.parametrize(
    "args, kwargs, culprit",
    [
        ((1, dt.date(2026, 1, 1)), {}, "args[1] is a datetime.date ("),
        ((), {"when": dt.datetime(2026, 1, 1)}, "kwargs['when'] is a datetime.datetime ("),
        ((object(),), {}, "args[0] is an object ("),
        ((), {"data": {"ok": 1, 2: "int key"}}, "kwargs['data'] has a key 2 of type int ("),
        ((), {"x": [1, [math.inf]]}, "kwargs['x'][1][0] is inf ("),
        ((b"\xff",), {}, "args[0] is bytes that are not UTF-8 ("),
        ((), {"d": itself_inside()}, "kwargs['d'] contains itself at kwargs['d']['self'][0] ("),
        (("ok", {"tags": {1, 2}}), {}, "args[1]['tags'] is a set ("),
    ],
    ids=["date", "datetime", "object", "int-key", "inf", "bad-utf8", "circular", "nested-set"],
)
def test_a_refused_argument_is_named_with_its_type(args, kwargs, culprit):
    with pytest.raises(ArgumentsNotJSON) as refused:
        encode_arguments_and_values(args, kwargs)
    assert culprit in str(refused.value)


def random_value(rng: random.Random, depth: int = 0):
    kinds = ["str", "int", "float", "bool", "none", "bytes"]
    if depth < 3:
        kinds += ["list", "tuple", "dict", "dict"]
    kind = rng.choice(kinds)
    if kind == "str":
        return "".join(rng.choice("aé漢 '\"\\\n🎉") for _ in range(rng.randrange(6)))
    if kind == "int":
        return rng.choice([0, -1, 2**63, rng.randrange(-(10**6), 10**6)])
    if kind == "float":
        return rng.choice([0.1, -2.5e-10, 1e300, float(rng.randrange(100))])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "bytes":
        return "ü".encode() * rng.randrange(3)
    items = [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == "list":
        return items
    if kind == "tuple":
        return tuple(items)
    return {f"k{i}": item for i, item in enumerate(items)}


def test_random_nested_arguments_agree_with_the_framework_round_trip():
    rng = random.Random(20261124)
    for _ in range(2000):
        args = [random_value(rng) for _ in range(rng.randrange(4))]
        kwargs = {f"p{i}": random_value(rng) for i in range(rng.randrange(4))}
        _text, decoded, survived = framework_round_trip(args, kwargs)
        assert survived
        encoded_args, encoded_kwargs, values = encode_arguments_and_values(args, kwargs)
        assert [json.loads(encoded_args), json.loads(encoded_kwargs)] == decoded
        assert list(values) == decoded


def test_the_json_text_holds_no_tab_newline_or_carriage_return():
    # PostgreSQL's bulk enqueue writes it into COPY's text format escaping
    # only backslashes (db/postgresql/inserts.py): these three would end a value or
    # a row there.
    awkward = ["\t", "\n", "\r", "a\r\nb", "\\", "\u2028 \x01 \x7f é 🎉"]
    args_json, kwargs_json, _ = encode_arguments_and_values(
        [awkward, {"\t\n": "\r"}], {"k\n": awkward}
    )
    for text in (args_json, kwargs_json):
        assert not {"\t", "\n", "\r"} & set(text), text
        assert json.loads(text)  # and it is still the same JSON
    assert json.loads(args_json) == [awkward, {"\t\n": "\r"}]
