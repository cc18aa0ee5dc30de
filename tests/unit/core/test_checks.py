"""helpers.core.checks: one rule for bad arguments (TypeError: wrong kind, ValueError: value
not accepted), and every message names the argument."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers.core.checks import (
    LARGEST,
    choice,
    device_arg,
    flag,
    positive_int,
    real_number,
    shown,
    text,
    whole_number,
)

# anything a caller might pass by mistake
ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**30, max_value=10**4000),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.binary(max_size=8), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.fractions(),
    st.just(object()), st.just(np.int64(3)), st.just(np.float32(0.5)), st.just(np.bool_(True)),
)


def outcome(fn, *args, **kwargs):
    """What ``fn`` did: ("ok", value) or ("TypeError"/"ValueError", message); anything else
    fails the test."""
    try:
        return "ok", fn(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)


def test_whole_numbers():
    assert whole_number(3, "n") == 3 and type(whole_number(np.int64(3), "n")) is int
    with pytest.raises(TypeError, match="n must be a whole number, got bool"):
        whole_number(True, "n")
    with pytest.raises(TypeError, match="n must be a whole number, got float: 2.0"):
        whole_number(2.0, "n")
    with pytest.raises(ValueError, match="n must be at least 0, got -1"):
        whole_number(-1, "n")
    with pytest.raises(ValueError, match=f"n must be at most {LARGEST}"):
        whole_number(LARGEST + 1, "n")


def test_positive_int_follows_the_rule():
    """A non-integer is a TypeError (it used to be a ValueError), zero a ValueError."""
    assert positive_int(1, "batch") == 1
    with pytest.raises(TypeError, match="batch"):
        positive_int(1.5, "batch")
    with pytest.raises(TypeError, match="batch"):
        positive_int("4", "batch")
    with pytest.raises(ValueError, match="batch must be at least 1"):
        positive_int(0, "batch")
    with pytest.raises(ValueError, match="batch must be at most 8"):
        positive_int(9, "batch", 8)


def test_real_numbers():
    assert real_number(Fraction(1, 2), "x") == 0.5 and real_number(np.float32(2), "x") == 2.0
    with pytest.raises(TypeError, match="x must be a number, got str"):
        real_number("1", "x")
    with pytest.raises(ValueError, match="x must be a finite number"):
        real_number(math.inf, "x")
    with pytest.raises(ValueError, match="x is too large"):
        real_number(10**400, "x")
    assert real_number(10**400, "x", finite=False) == math.inf
    assert real_number(-(10**400), "x", finite=False) == -math.inf
    with pytest.raises(ValueError, match="x must be a number, not NaN"):
        real_number(math.nan, "x", finite=False)
    with pytest.raises(ValueError, match="x must be greater than 0"):
        real_number(0, "x", 0, above=True)
    with pytest.raises(ValueError, match="x must be at most 1"):
        real_number(2, "x", maximum=1)


def test_choice_flag_text():
    assert choice("a", "mode", ["a", "b"]) == "a"
    with pytest.raises(ValueError, match=r"mode must be one of \['a', 'b'\], got 'c'"):
        choice("c", "mode", ["a", "b"])
    with pytest.raises(TypeError, match="mode"):
        choice(1, "mode", ["a", "b"])
    assert flag(np.bool_(False), "on") is False
    with pytest.raises(TypeError, match="on must be True or False, got int: 1"):
        flag(1, "on")
    assert text("", "label", empty=True) == ""
    with pytest.raises(ValueError, match="label must not be empty"):
        text("  ", "label")
    with pytest.raises(ValueError, match="label is too long"):
        text("x" * 11, "label", longest=10)
    with pytest.raises(TypeError, match="label must be a string"):
        text(b"x", "label")


def test_device_arg(monkeypatch):
    assert device_arg("cpu", "device") == torch.device("cpu")
    assert device_arg(torch.device("meta"), "device").type == "meta"
    with pytest.raises(TypeError, match="device"):
        device_arg(0, "device")
    with pytest.raises(ValueError, match="device is not a device name"):
        device_arg("cuda:x", "device")
    with pytest.raises(ValueError, match="device is 'xla'"):
        device_arg("xla", "device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="no usable CUDA GPU"):
        device_arg("cuda", "device")


def test_shown_keeps_messages_short_and_printable():
    """Python refuses to turn an int of more than 4,300 digits into a string; messages must
    not fail on one (nor on a broken __repr__)."""
    assert shown(10**5000) == "an integer of about 5000 digits"
    assert len(shown("x" * 10_000)) == 80

    class Broken:
        def __repr__(self):
            raise RuntimeError("no")

    assert shown(Broken()) == "<Broken>"


@given(ANYTHING)
def test_every_check_raises_only_type_or_value_errors_naming_the_argument(value):
    for fn, args in [(whole_number, ()), (positive_int, ()), (real_number, ()),
                     (real_number, (None, None)), (choice, (["a", "b"],)), (flag, ()),
                     (text, ()), (device_arg, ())]:
        if fn is real_number and args:
            kind, result = outcome(fn, value, "arg", *args, finite=False)
        else:
            kind, result = outcome(fn, value, "arg", *args)
        if kind != "ok":
            assert result.startswith("arg ") and len(result) < 400, (fn, result)


@given(st.integers(min_value=-(10**30), max_value=10**30))
def test_whole_number_accepts_exactly_the_range(value):
    kind, result = outcome(whole_number, value, "n", 0, 100)
    assert (kind == "ok") == (0 <= value <= 100)
    assert kind in ("ok", "ValueError")
    if kind == "ok":
        assert result == value


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_real_number_accepts_exactly_finite_floats(value):
    kind, _ = outcome(real_number, value, "x")
    assert (kind == "ok") == math.isfinite(value)
