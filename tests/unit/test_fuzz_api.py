"""tests/fuzz/fuzz_api.py: the harness runs, and classifies known-good and known-bad calls as the
fuzz review does (fakes only: no torch, no real helpers call)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
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
def fuzzer(fuzz, monkeypatch, tmp_path):
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)  # restored afterwards
    fake = SimpleNamespace(_EXPORTS={"good": "core.fmt", "bad": "watch.gauge"})
    return fuzz.Fuzzer(fake, examples=1, sandbox=tmp_path, repo=tmp_path)


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
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    proc = subprocess.run(
        [sys.executable, str(FUZZ_API), "--repo", str(package.parent),
         "--only", "fmt_bytes,parse_capacity", "--examples", "2", "--out", str(out),
         "--quiet", "--sandbox", str(sandbox)], capture_output=True, text=True, timeout=120,
        cwd=ROOT)  # only read there (hypothesis's Unicode tables, if cached)
    assert proc.returncode == 0, proc.stderr
    assert "inputs tried" in proc.stdout and "numbered fuzz cases" in proc.stdout
    result = json.loads(out.read_text())
    # it ran in the given sandbox under limits on processes, memory and file size
    assert result["sandbox"] == str(sandbox.resolve())
    assert set(result["limits"]) == {"RLIMIT_NPROC", "RLIMIT_AS", "RLIMIT_FSIZE"}
    assert all(isinstance(v, int) and v > 0 for v in result["limits"].values())
    assert (sandbox / "special" / "fifo").is_fifo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo", "results.json", "sandbox"]
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


# ---------------------------------------------------------------- issue 33: the new parts
def test_harness_is_a_test_tool_not_a_learner_script():
    assert FUZZ_API.is_file() and not (ROOT / "scripts" / "fuzz_api.py").exists()


def test_value_table_has_the_issue_values(fuzz):
    import numpy as np

    edges = fuzz.edge_values(np)
    ints = [v for v in edges if type(v) is int]
    assert 2**31 in ints and 2**63 in ints
    floats = [v for v in edges if type(v) is float]
    assert any(math.isnan(v) for v in floats) and math.inf in floats
    kinds = {type(v).__name__ for v in edges}
    assert {"float64", "float32", "int32", "int64", "uint64"} <= kinds


def test_special_paths_stay_in_the_sandbox_and_are_never_devices(fuzz, tmp_path):
    made = fuzz.special_paths(tmp_path / "special")
    assert made["fifo"].is_fifo() and made["device_like"].is_fifo()
    assert made["link_to_fifo"].is_symlink() and made["link_to_fifo"].resolve().is_fifo()
    assert made["dangling_link"].is_symlink() and not made["dangling_link"].exists()
    assert len(made["long_name_250"].name) == 250 and len(made["long_name_256"].name) == 256
    assert all(fuzz.inside(p, tmp_path) for p in made.values())
    assert fuzz.file_kind(made["fifo"]) == "fifo"
    assert fuzz.file_kind(made["link_to_fifo"]) == "link"
    # made afresh: a replaced FIFO comes back as a FIFO
    made["fifo"].unlink()
    made["fifo"].write_text("replaced")
    assert fuzz.special_paths(tmp_path / "special")["fifo"].is_fifo()


def test_guard_refuses_devices_and_paths_outside(fuzz, tmp_path, monkeypatch):
    inner = tmp_path / "x.pt"
    assert fuzz.guard_path(inner, tmp_path) == inner
    outside = tmp_path.parent / "elsewhere.pt"
    with pytest.raises(RuntimeError, match="outside"):
        fuzz.guard_path(outside, tmp_path)
    link = tmp_path / "out_link"
    os.symlink(outside, link)  # a link inside that points outside
    with pytest.raises(RuntimeError):
        fuzz.guard_path(link, tmp_path)
    # a character device (mocked: no real device node is touched)
    fifo = tmp_path / "char"
    os.mkfifo(fifo)
    assert not fuzz.is_device(fifo)
    monkeypatch.setattr(fuzz.stat, "S_ISCHR", lambda mode: True)
    assert fuzz.is_device(fifo)
    with pytest.raises(RuntimeError, match="device"):
        fuzz.guard_path(fifo, tmp_path)


def test_limits_are_bounded_and_only_lowered(fuzz, tmp_path):
    import resource

    limits = fuzz.sandbox_limits(100, memory_gib=2, file_mib=8)
    assert limits == {resource.RLIMIT_NPROC: 356, resource.RLIMIT_AS: 2 * 2**30,
                      resource.RLIMIT_FSIZE: 8 * 2**20}
    assert fuzz.user_tasks() >= 1
    # applied in a child (never in the test process): the child cannot write past 1 MiB
    code = (f"import importlib.util, resource, sys; "
            f"spec = importlib.util.spec_from_file_location('f', {str(FUZZ_API)!r}); "
            f"m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            f"got = m.apply_limits({{resource.RLIMIT_FSIZE: 2**20}}); "
            f"assert got[resource.RLIMIT_FSIZE] == 2**20, got\n"
            f"try:\n open('big', 'wb').write(b'x' * 2**21)\n"
            f"except OSError as e:\n print('refused', e.errno)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "refused" in proc.stdout and (tmp_path / "big").stat().st_size <= 2**20


def test_state_check_flags_a_refusal_that_changed_something(fuzz, fuzzer, tmp_path):
    import random

    assert fuzzer.sandbox == tmp_path.resolve()
    fuzzer.warmed.add("bad")

    def refuses_after_reseeding():
        random.seed(12345)
        raise ValueError("count must be positive")

    def refuses_after_writing():
        (tmp_path / "half.tmp").write_text("x")
        raise ValueError("count must be positive")

    def refuses_cleanly():
        raise ValueError("count must be positive")

    state = random.getstate()
    try:
        kind, _ = fuzzer.call("bad", "bad", "rng", refuses_after_reseeding, names=("count",))
        assert kind == "side-effect" and "python RNG" in fuzzer.records[-1]["detail"]
        kind, _ = fuzzer.call("bad", "bad", "file", refuses_after_writing, names=("count",))
        assert kind == "side-effect" and "half.tmp" in fuzzer.records[-1]["detail"]
        assert fuzzer.call("bad", "bad", "clean", refuses_cleanly,
                           names=("count",))[0] == "rejected"
    finally:
        random.setstate(state)
    before = fuzz.state_snapshot(tmp_path)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        assert any(c.startswith("threads") for c in
                   fuzz.state_changes(before, fuzz.state_snapshot(tmp_path)))
    finally:
        stop.set()
        t.join()


def test_command_line_verdicts(fuzz):
    assert fuzz.cli_verdict(2, "usage: x\nx: error: --steps must be >= 1\n", False)[0] == (
        "rejected")
    tb = "Traceback (most recent call last):\n  File ...\nMemoryError: cannot allocate\n"
    assert fuzz.cli_verdict(1, tb, False) == ("escape:MemoryError", "MemoryError: cannot allocate")
    assert fuzz.cli_verdict(1, "Traceback (most recent call last):\n[rank0]: KeyError: 'totals'\n",
                            None)[0] == "escape:KeyError"
    assert fuzz.cli_verdict(0, "", False)[0] == "silent"
    assert fuzz.cli_verdict(0, "", True)[0] == "accepted"
    assert fuzz.cli_verdict(None, "", False)[0] == "hang"
    assert fuzz.cli_verdict(-6, "", False)[0] == "escape:signal 6"
    assert fuzz.cli_verdict(1, "error: no\n", False)[0] == "unclear"
