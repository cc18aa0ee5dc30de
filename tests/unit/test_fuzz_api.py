"""tests/fuzz/fuzz_api.py: the harness runs, and classifies known-good and known-bad calls as the
fuzz review does (fakes only: no torch, no real helpers call)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("hypothesis")

ROOT = Path(__file__).resolve().parents[2]
FUZZ_API = ROOT / "tests" / "fuzz" / "fuzz_api.py"


@pytest.fixture(scope="module")
def fuzz():
    spec = importlib.util.spec_from_file_location("fuzz_api_under_test",
                                                  FUZZ_API)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fuzzer(fuzz, monkeypatch):
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)  # restored afterwards
    fake = SimpleNamespace(_EXPORTS={"good": "core.fmt", "bad": "watch.gauge"})
    return fuzz.Fuzzer(fake, examples=1)


def test_classify_follows_the_review_rules(fuzz):
    assert fuzz.classify(None, True, ("x",)) == "accepted"
    assert fuzz.classify(None, None, ("x",)) == "accepted"
    assert fuzz.classify(None, False, ("x",)) == "silent"
    assert fuzz.classify(ValueError("x must be positive"), False, ("x",)) == "rejected"
    assert fuzz.classify(TypeError("X must be a number"), False, ("x",)) == "rejected"
    assert fuzz.classify(ValueError("Format specifier missing precision"), False,
                         ("digits",)) == "unclear"
    assert fuzz.classify(OverflowError("int too large"), None, ("x",)) == "escape:OverflowError"
    assert fuzz.classify(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), None,
                         ("x",)) == "escape:UnicodeDecodeError"  # a ValueError, yet not clear
    assert fuzz.classify(FileNotFoundError("x"), None, ("x",),
                         (FileNotFoundError,)) == "documented"
    assert fuzz.classify(fuzz.Hang(), None, ()) == "hang"
    assert fuzz.is_hard("escape:KeyError") and fuzz.is_hard("corrupt")
    assert not fuzz.is_hard("unclear") and not fuzz.is_hard("silent")


def test_owners_follow_the_facade_modules(fuzz):
    assert fuzz.owner_of("core.fmt") == fuzz.owner_of("fmt") == "core"
    assert fuzz.owner_of("checkpoint") == fuzz.owner_of("launch") == "core"
    assert fuzz.owner_of("memory.virtual") == fuzz.owner_of("oom") == "memory"
    assert fuzz.owner_of("tf.keras") == fuzz.owner_of("memory.keras") == "memory"
    assert fuzz.owner_of("batch_size") == "finder"
    assert fuzz.owner_of("watch.gauge") == fuzz.owner_of("throughput") == "watch"


def test_call_records_good_bad_hang_and_thread_errors(fuzzer):
    def good(value):
        if not isinstance(value, int):
            raise TypeError(f"count must be a whole number, got {value!r}")
        return value

    assert fuzzer.call("good", "good", "good(3)", lambda: good(3), valid=True,
                       names=("count",))[0] == "accepted"
    assert fuzzer.call("good", "good", "good('a')", lambda: good("a"), valid=False,
                       names=("count",))[0] == "rejected"
    assert fuzzer.call("bad", "bad", "bad({})", lambda: {}["key"], names=("count",))[0] == (
        "escape:KeyError")
    assert fuzzer.call("bad", "bad", "bad(-1)", lambda: -1, valid=False)[0] == "silent"
    kind, _ = fuzzer.call("bad", "bad", "sleeps", lambda: time.sleep(5), timeout=0.2)
    assert kind == "hang"

    def dies_in_thread():
        t = threading.Thread(target=lambda: 1 / 0, name="helpers-x-poller")
        t.start()
        t.join()

    assert fuzzer.call("bad", "bad", "thread", dies_in_thread)[0] == "escape:ZeroDivisionError"
    assert fuzzer.call("bad", "bad", "leaks", lambda: None,
                       check=lambda _: ("leak", "held"))[0] == "leak"
    owners = {r["input"]: r["owner"] for r in fuzzer.records}
    assert owners["good(3)"] == "core" and owners["sleeps"] == "watch"
    assert json.loads(json.dumps(fuzzer.records))[0]["kind"] == "accepted"  # plain JSON


FAKE_INIT = '''
import importlib
_EXPORTS = {"fmt_bytes": "fmt", "parse_capacity": "fmt"}
def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module("." + _EXPORTS[name], __name__), name)
    raise AttributeError(name)
'''

FAKE_FMT = '''
import numbers

def fmt_bytes(n_bytes, digits=2):
    """Known good: every bad input gets a clear error naming the argument."""
    if isinstance(n_bytes, bool) or not isinstance(n_bytes, numbers.Real):
        raise TypeError(f"n_bytes must be a number, got {type(n_bytes).__name__}")
    try:
        value = float(n_bytes)
    except OverflowError:
        raise ValueError("n_bytes is too large") from None
    if isinstance(digits, bool) or not isinstance(digits, numbers.Integral):
        raise TypeError(f"digits must be a whole number, got {type(digits).__name__}")
    if not 0 <= digits <= 30:
        raise ValueError(f"digits must be between 0 and 30, got {digits}")
    return f"{value / 2**30:.{int(digits)}f} GiB"

def parse_capacity(value):
    """Known bad: Python's own errors escape and negative sizes pass."""
    return int(float(value))
'''


def test_harness_runs_end_to_end_on_a_fake_package(tmp_path):
    package = tmp_path / "repo" / "helpers"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_INIT)
    (package / "fmt.py").write_text(FAKE_FMT)
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, str(FUZZ_API), "--repo", str(package.parent),
         "--only", "fmt_bytes,parse_capacity", "--examples", "2", "--out", str(out),
         "--quiet"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "inputs tried" in proc.stdout and "numbered fuzz cases" in proc.stdout
    result = json.loads(out.read_text())
    targets = result["summary"]["by_target"]
    assert targets["fmt_bytes"]["failures"] == 0 and targets["fmt_bytes(digits=)"]["failures"] == 0
    bad = targets["parse_capacity"]["by_kind"]
    assert bad.get("escape:OverflowError", 0) >= 1  # int(float('inf'))
    assert bad.get("unclear", 0) >= 1  # could not convert string to float: 'abc'
    assert bad.get("silent", 0) >= 1  # -1 accepted
    assert "torch" not in proc.stderr
    cases = result["cases"]
    assert cases["11"]["result"] == "FAIL" and cases["1"]["result"] == "N/A"
    assert any("parse_capacity(-10**5000)" in f for f in cases["11"]["failures"])


def test_table_compares_before_and_after(fuzz):
    records = [{"target": "f", "name": "f", "owner": "core", "input": "f(1)", "kind": k,
                "detail": "d", "seconds": 0.0, **({"case": 11} if k == "hang" else {})}
               for k in ("accepted", "rejected", "hang", "unclear")]
    before = {"repo": "old", "examples": 1, "seconds": 1.0,
              "summary": fuzz.summarize(records), "cases": fuzz.case_results(records)}
    fixed = [dict(r, kind="rejected") if r["kind"] == "hang" else r for r in records]
    after = {**before, "repo": "new", "summary": fuzz.summarize(fixed),
             "cases": fuzz.case_results(fixed)}
    assert before["summary"]["hard"] == 1 and after["summary"]["hard"] == 0
    text = fuzz.table_text(after, before)
    assert "before" in text and "after" in text
    assert any(line.strip().startswith("11.") and "FAIL -> PASS" in line
               for line in text.splitlines())
