"""Cases from the fuzz report of the public API (the case number is in each docstring), for the
core layer: formatters, tables, timing, progress."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from helpers.core import timing
from helpers.core.fmt import (
    ShownAsTable,
    Table,
    fmt_bytes,
    fmt_gib,
    fmt_mib,
    fmt_rate,
    fmt_ratio,
    fmt_seconds,
)
from helpers.core.timing import TimeComparison, compare_times, fmt_in_unit

FORMATTERS = [fmt_bytes, fmt_mib, fmt_gib, fmt_seconds, fmt_rate, fmt_ratio, fmt_in_unit]


@pytest.mark.parametrize("fmt", FORMATTERS)
@pytest.mark.parametrize("value", [10**400, 2**2000, math.inf, 1e300, Fraction(10**400, 3)])
def test_case_11_formatters_print_huge_and_infinite_numbers(fmt, value):
    """Case 11: fmt_bytes(10**400), fmt_seconds(inf), ... raised OverflowError (51 of them).
    Now every formatter prints any real number: infinity (or an integer beyond a float's
    range) as "inf", other numbers of 1e15 and more in scientific notation."""
    shown = fmt(value)
    assert isinstance(shown, str) and len(shown) < 40
    assert "inf" in shown or "e+" in shown


def test_case_11_the_documented_forms():
    """Case 11: the exact output for huge, infinite and negative-infinite numbers."""
    assert fmt_bytes(math.inf) == "inf GiB" and fmt_bytes(-(10**400)) == "-inf GiB"
    assert fmt_seconds(math.inf) == "~inf s"
    assert fmt_bytes(1e30) == "9.31e+20 GiB"
    assert fmt_rate(1e300) == "~1e+300 samples/s"
    assert fmt_ratio(10**400) == "~infx"
    assert fmt_mib(2**21) == "2.0 MiB"  # ordinary numbers print as before


@pytest.mark.parametrize(("call", "error", "name"), [
    (lambda: fmt_bytes(math.nan), ValueError, "n_bytes"),
    (lambda: fmt_bytes("1"), TypeError, "n_bytes"),
    (lambda: fmt_bytes(5, digits="2"), TypeError, "digits"),
    (lambda: fmt_mib(5, digits=10**9), ValueError, "digits"),
    (lambda: fmt_seconds(1, digits=1.5), TypeError, "digits"),
    (lambda: fmt_seconds(-1), ValueError, "seconds"),
    (lambda: fmt_rate(10.0, unit=0), TypeError, "unit"),
    (lambda: fmt_rate(-1), ValueError, "per_second"),
    (lambda: fmt_ratio(1.5, measured=0), TypeError, "measured"),
    (lambda: fmt_ratio(True), TypeError, "ratio"),
    (lambda: fmt_in_unit(1, unit="min"), ValueError, "unit"),
])
def test_case_11_silent_and_unclear_formatter_arguments(call, error, name):
    """Case 11: fmt_bytes(digits='2') returned '5.00 GiB', fmt_rate(unit=0) '~10.0 0',
    fmt_ratio(measured=0) '1.50x': every argument is now checked."""
    with pytest.raises(error, match=name):
        call()


@pytest.mark.parametrize(("args", "kwargs", "name"), [
    ((5, [[1]]), {}, "headers"),
    ((["a"], 7), {}, "rows"),
    ((["a"], [1]), {}, "row 0"),
    (("ab", [["x", "y"]]), {}, "headers"),
    ((["a"], [[1]]), {"title": 5}, "title"),
])
def test_case_11_tables_name_their_bad_parts(args, kwargs, name):
    """Case 11: Table with non-iterable headers or rows (and title=5, which broke
    _repr_html_ with an AttributeError) is a TypeError naming the part."""
    with pytest.raises(TypeError, match=name):
        Table(*args, **kwargs)


def test_case_11_numpy_numbers_format_like_python_numbers():
    assert fmt_bytes(np.int64(3 * 2**20)) == fmt_bytes(3 * 2**20) == "3.00 MiB"
    assert fmt_seconds(np.float32(0.5)) == "~500 ms"


def test_case_9_compare_times_with_cuda_on_a_machine_without_it(monkeypatch):
    """Case 9: compare_times(sync="cuda") without CUDA gave AssertionError, "cuda:x" a
    RuntimeError and "mps" a RuntimeError; now a ValueError naming sync (device_arg)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for sync in ("cuda", "cuda:0", "cuda:x", "mps", "tpu"):
        with pytest.raises(ValueError, match="sync"):
            compare_times({"a": lambda: 1}, sync=sync)
    with pytest.raises(TypeError, match="sync"):
        timing.sync_function(3)
    assert timing.sync_function("cpu") is None and timing.sync_function(None) is None
    assert timing.sync_function(torch.device("cpu")) is None
    wait = lambda: None  # noqa: E731
    assert timing.sync_function(wait) is wait


def test_case_9_time_comparisons_with_a_zero_or_missing_time():
    """Case 9 (compare_times): a 0 s best time divided by zero, no samples gave min()'s
    message."""
    times = TimeComparison(("a", "b"), {"a": [1.0], "b": [0.0]}, "a", 1, 1)
    assert times.speedup("b") == math.inf and "~infx" in times.text()
    assert TimeComparison(("a",), {"a": [0.0]}, "a", 1, 1).speedup("a") == 1.0
    with pytest.raises(ValueError, match=r"samples\['a'\]"):
        TimeComparison(("a",), {"a": []}, "a", 1, 1)


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"rounds": 10**400}, ValueError, "rounds"),
    ({"rounds": 2.0}, TypeError, "rounds"),
    ({"warmup": -1}, ValueError, "warmup"),
    ({"baseline": "z"}, ValueError, "baseline"),
    ({"unit": "h"}, ValueError, "unit"),
])
def test_case_9_compare_times_arguments(kwargs, error, name):
    with pytest.raises(error, match=name):
        compare_times({"a": lambda: 1}, **kwargs)


def test_the_display_mixin_shows_text_only_types_without_html():
    """A result without table() or _html() has no HTML form (IPython shows its text)."""

    class Note(ShownAsTable):
        def text(self):
            return "hello"

    class Tabled(ShownAsTable):
        def table(self):
            return Table(["a"], [[1]])

    assert repr(Note()) == str(Note()) == "hello" and Note()._repr_html_() is None
    assert repr(Tabled()) == Table(["a"], [[1]]).text()
    assert Tabled()._repr_html_().startswith("<table>")


def test_recorded_results_files_that_are_damaged(tmp_path):
    """Fuzz report (recorded_gpu_results): "hardware": null gave AttributeError on .label,
    a file that is not UTF-8 a UnicodeDecodeError, directory=5 an unclear TypeError."""
    from helpers.core.recorded import KIND, recorded_gpu_results

    (tmp_path / "hwnull.json").write_text(f'{{"kind": "{KIND}", "hardware": null}}')
    assert "an unknown GPU" in recorded_gpu_results("hwnull", directory=tmp_path).label
    (tmp_path / "badutf.json").write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="badutf.json is not valid JSON"):
        recorded_gpu_results("badutf", directory=tmp_path)
    with pytest.raises(TypeError, match="directory"):
        recorded_gpu_results("memory", directory=5)
    with pytest.raises(TypeError, match="name"):
        recorded_gpu_results(5)
    with pytest.raises(ValueError, match="name"):
        recorded_gpu_results("memory\n")
    assert recorded_gpu_results("absent", directory=tmp_path) is None


def test_compare_times_workloads_follow_the_rule():
    """An empty dict is a value not accepted (ValueError); a list is the wrong kind."""
    with pytest.raises(ValueError, match="workloads must not be empty"):
        compare_times({})
    with pytest.raises(TypeError, match="workloads must be a dict"):
        compare_times([lambda: 1])
    with pytest.raises(TypeError, match="workload 'a' must be a function"):
        compare_times({"a": 1})


def test_a_row_appended_after_construction_is_checked_when_shown():
    """Fuzz report: t.rows.append([1, 2]) on a one-column table gave zip()'s message."""
    table = Table(["a"], [[1]])
    table.rows.append([1, 2])
    with pytest.raises(ValueError, match="row 1 has 2 cells but there are 1 headers"):
        table.text()
