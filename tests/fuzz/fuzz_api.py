#!/usr/bin/env python
"""Fuzz the public API of ``helpers`` and classify every call the way the fuzz review does.

Every exported name (``helpers._EXPORTS``: functions, constructors and the methods that matter,
such as ``LivePlot.step``/``summary``, ``VirtualGPU.track``, checkpoint round trips, gauge
pollers) gets a fixed list of edge values (NaN, +-inf, 5e-324, 1e308, +-10**400, 2**31, 2**63,
bools, NumPy scalars (float64 NaN, float32 inf, int32, uint64 2**63...), Fraction, Decimal,
bytes, complex, full-width digits, a 100 k-character string, lists, dicts, objects, a
self-referencing list) and ``--examples`` hypothesis draws per parameter, plus the state
scenarios of the review. Paths get odd files made in the sandbox: a FIFO, a link to it, a
"device node" stand-in (a FIFO at ``dev/null``: never a real device, and every path is checked
with ``os.stat`` before use), a dangling link, a link to a regular file and 250/256-character
names. Also fuzzed: the planner (``will_it_fit``, ``Plan.slurm``), the Keras helpers,
``SimulatedCuda`` and ``FakeNvml`` entered and used, and the command-line programs
(``python -m helpers.fit``, ``scripts/ddp_train.py``) with bad arguments, which must exit 2
with a message and no traceback. Each call is classified:

* passed: ``accepted`` (returned for an input that is not clearly bad), ``rejected`` (a
  ValueError/TypeError whose message names the argument) or ``documented`` (an error the
  function documents: ``BatchSizeError``, an out-of-memory error from a virtual GPU,
  ``FileNotFoundError``, ``TimeoutError`` from ``run_captured``, ``RuntimeError`` on a closed
  plot or timer, the step's own exception);
* hard failures: ``escape:<Exception>`` (anything else escaped, also from a polling thread),
  ``hang`` (no result within the per-call alarm), ``leak`` (memory above the baseline after a
  caught out-of-memory error, or a child process left running), ``corrupt`` (a good checkpoint
  replaced by one that cannot be loaded), ``threads`` (more than one polling thread of a kind),
  ``replaced`` (a FIFO, link or device stand-in replaced by a regular file);
* soft failures: ``side-effect`` (a rejected call changed state: the Python/NumPy/torch
  generators, torch's default dtype/device, grad mode, threads, determinism, signal handlers,
  sys.stdout/stderr, live threads, child processes or the files in the sandbox; or it printed
  a traceback),
  ``silent`` (a clearly bad input was accepted), ``unclear`` (a ValueError/TypeError whose
  message does not name the argument).

The eleven numbered fuzz cases (bad input and lost data) are scenarios made of such
calls; a case passes when all of its calls pass.

Everything runs in this one process (at low priority, one torch thread), except the psutil-
missing check of case 11 and the command-line programs, which need fresh interpreters. It all
runs in a sandbox folder (``--sandbox``, default a new temporary folder removed at the end):
working folder, TMPDIR, HOME (Keras, matplotlib) and hypothesis's folder are inside it, set up
before anything is imported, so no call writes anywhere else; and under resource limits that
children inherit (RLIMIT_NPROC: 256 tasks more than the user runs now, RLIMIT_AS:
``--memory-gib``, RLIMIT_FSIZE: ``--file-mib``; root ignores RLIMIT_NPROC). Only facade names
(``helpers.X``) are used, so the same run works against an old checkout: ``--repo`` puts that
checkout's ``helpers`` first on ``sys.path``. It is a test tool: it lives in ``tests/fuzz/``.

    python tests/fuzz/fuzz_api.py --repo /path/to/checkout --examples 12 --out results.json
    python tests/fuzz/fuzz_api.py --repo . --before before.json --out after.json
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import numbers
import os
import pickle
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter, defaultdict, namedtuple
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

HARD = ("hang", "leak", "corrupt", "threads", "replaced")  # and every "escape:<Exception>"
SOFT = ("side-effect", "silent", "unclear")
PASSED = ("accepted", "rejected", "documented")
LARGEST = 2**62  # the largest count helpers accept (helpers/core/checks.py)
# a capacity may be rejected as an unknown GPU, an ambiguous card or a bad size
CAPACITY_WORDS = ("capacity", "value", "gpu", "size", "ambiguous")

# facade module (last part of the _EXPORTS path) -> the agent that owns it
OWNERS = {
    "memory": ("memory.", "oom", "amp", "keras", "keras_amp", "policies", "tf."),
    "finder": ("batch_size",),
    "watch": ("gauge", "liveplot", "throughput"),
    "core": ("fmt", "checks", "environment", "device", "nvml", "exercises", "data",
             "timing", "recorded", "launch", "checkpoint", "models", "runtime", "fake_nvml",
             "core."),
}

# the code of the children that run_captured starts here
CHILD_CODE = ("pass", "import time; time.sleep(2)",
              "import sys; sys.stdout.buffer.write(bytes([255]))")

CASES = {
    1: "save_checkpoint(extra=NumPy scalar / np.str_ / defaultdict) keeps a loadable file",
    2: "an OOM inside measure_step frees the step's memory without gc.collect()",
    3: "gauge re-runs with a blocked reading, and concurrent creation: one poller",
    4: "VirtualGPU.track / measure_step(inputs=) on a self-referencing list",
    5: "run_captured(timeout=inf/nan/1e300) leaves no child running",
    6: "load_checkpoint on a text/empty/truncated/incomplete file: one clear error",
    7: "a stray full_scale().__exit__() leaves later full_scale blocks working",
    8: "save_checkpoint(extra=<cyclic dict>) does not recurse without limit",
    9: "device strings are checked (StepTimer/compare_times sync, check_training device)",
    10: "find_batch_size(optimizer=<not a torch optimizer>) gives a clear error",
    11: "overflow on huge numbers, poll=1e300, no psutil, zero-peak compare_memory, "
        "parse_capacity(-10**5000), measure_step(steps=10**400)",
}


class Hang(BaseException):
    """Raised by the per-call alarm."""


class Finding(AssertionError):
    """Raised inside a scenario call to report a failure kind of its own (leak, threads...)."""

    kind = "escape:Finding"


class _Leak(Finding):
    kind = "leak"


class _Threads(Finding):
    kind = "threads"


class _SideEffect(Finding):
    kind = "side-effect"


class _Dead(Finding):
    kind = "escape:dead poller thread"


def _on_alarm(signum, frame):
    while frame is not None:  # never inside an import: a half-imported module breaks the rest
        if "importlib._bootstrap" in frame.f_code.co_filename:
            return  # the alarm repeats every second
        frame = frame.f_back
    raise Hang()


@contextlib.contextmanager
def alarm(seconds: float):
    old = signal.signal(signal.SIGALRM, _on_alarm)
    # then again every second: code that swallows one Hang (except BaseException) gets more
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def short(value, limit: int = 90) -> str:
    """A short, one-line repr of an input."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        digits = len(str(abs(value))) - 1 if abs(value) < 10**4000 else math.floor(
            math.log10(abs(value)))
        sign = "-" if value < 0 else ""
        return f"{sign}10**{digits}" if abs(value) == 10**digits else f"{sign}~10**{digits}"
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:1]!r} * {len(value)}" if len(set(value)) == 1 else repr(value[:limit])
    try:
        text = repr(value)
    except BaseException as exc:  # noqa: BLE001 - a broken __repr__ is itself an input
        text = f"<{type(value).__name__} with broken repr: {type(exc).__name__}>"
    if " object at 0x" in text:
        text = f"<{type(value).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def message(exc: BaseException) -> str:
    try:
        return str(exc)
    except BaseException as inner:  # noqa: BLE001
        return f"<str() raised {type(inner).__name__}>"


def classify(exc, valid, names, documented=()) -> str:
    """The review's rule for one call (see the module docstring)."""
    if exc is None:
        return "silent" if valid is False else "accepted"
    if isinstance(exc, Finding):
        return exc.kind
    if isinstance(exc, Hang):
        return "hang"
    if documented and isinstance(exc, documented):
        return "documented"
    if isinstance(exc, (ValueError, TypeError)) and not isinstance(exc, UnicodeError):
        text = message(exc).lower()
        if "weights_only=false" in text or "set_int_max_str_digits" in text:
            return "unclear"
        if not names or any(str(n).lower() in text for n in names):
            return "rejected"
        return "unclear"
    return f"escape:{type(exc).__name__}"


def is_hard(kind: str) -> bool:
    return kind in HARD or kind.startswith("escape:")


def owner_of(module: str) -> str:
    last = module.rsplit(".", 1)[-1]
    for owner, parts in OWNERS.items():
        for part in parts:
            if (part.endswith(".") and (module + ".").startswith(part)) or last == part:
                return owner
    return "lead"


# ------------------------------------------------------------------- sandbox and limits
def user_tasks() -> int:
    """Processes and threads this user runs now (what RLIMIT_NPROC counts on Linux)."""
    uid, total = os.getuid(), 0
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/status") as f:
                    status = dict(line.split(":", 1) for line in f if ":" in line)
                if int(status["Uid"].split()[0]) == uid:
                    total += int(status.get("Threads", "1").strip() or 1)
            except (OSError, KeyError, ValueError):
                continue
    return total


def sandbox_limits(tasks_now: int, *, memory_gib: float = 12, file_mib: int = 512,
                   spare_tasks: int = 256) -> dict:
    """The limits the harness runs under: at most ``spare_tasks`` processes/threads more than
    the user runs now (a fork bomb stops there), ``memory_gib`` of address space (a huge
    allocation fails fast) and files of at most ``file_mib`` (a runaway writer stops)."""
    import resource

    return {resource.RLIMIT_NPROC: tasks_now + spare_tasks,
            resource.RLIMIT_AS: int(memory_gib * 2**30),
            resource.RLIMIT_FSIZE: int(file_mib) * 2**20}


def apply_limits(limits: dict) -> dict:
    """Lower this process's soft limits (children inherit them); never raise one. Returns
    the limits now in force. SIGXFSZ is ignored, so a write past the file-size limit is an
    OSError (EFBIG) in the fuzzed call instead of the death of the harness."""
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    applied = {}
    for which, want in limits.items():
        soft, hard = resource.getrlimit(which)
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if soft != resource.RLIM_INFINITY:
            new = min(new, soft)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(which, (new, hard))
        applied[which] = resource.getrlimit(which)[0]
    return applied


def is_device(path) -> bool:
    """True if ``path`` (followed through links) is a character or block device."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError, TypeError):
        return False
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode)


def inside(path, folder) -> bool:
    """True if ``path`` and, for a link, what it points to stay inside ``folder``."""
    try:
        folder = Path(folder).resolve()
        p = Path(os.fsdecode(path)) if not isinstance(path, Path) else path
        p = p if p.is_absolute() else Path.cwd() / p
        return (Path(os.path.abspath(p)).is_relative_to(folder)
                and p.resolve().is_relative_to(folder))
    except (OSError, ValueError, TypeError, RuntimeError):
        return False


def guard_path(path, folder):
    """The harness's own check before it hands a path to a fuzzed call: never a device node
    and never a place outside its sandbox ``folder``."""
    if is_device(path) or not inside(path, folder):
        raise RuntimeError(f"harness refuses to pass {path!r}: a device or outside {folder}")
    return path


def special_paths(folder: Path) -> dict[str, Path]:
    """Odd files made inside ``folder``: a FIFO (what a device node does to a writer: not a
    regular file, opening it blocks), a link to it (the shape of ``/dev/stdout``), a
    "device node" stand-in (a FIFO at ``dev/null``), a dangling link, a link to a regular
    file, a 250-character name (legal) and a 256-character one. Made afresh on every call
    (a call that replaced one of them does not hide the next call's result)."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    made = {}
    fifo = folder / "fifo"
    os.mkfifo(fifo)
    made["fifo"] = fifo
    made["link_to_fifo"] = folder / "link_to_fifo"
    dev = folder / "dev"
    dev.mkdir()
    os.mkfifo(dev / "null")
    made["device_like"] = dev / "null"
    made["dangling_link"] = folder / "dangling_link"
    regular = folder / "regular.pt"
    regular.write_bytes(b"keep me")
    made["link_to_regular"] = folder / "link_to_regular"
    for name, target in (("link_to_fifo", fifo), ("dangling_link", folder / "gone"),
                         ("link_to_regular", regular)):
        os.symlink(target, made[name])
    made["long_name_250"] = folder / ("n" * 247 + ".pt")
    made["long_name_256"] = folder / ("n" * 253 + ".pt")
    for path in made.values():
        guard_path(path, folder)
    return made


def file_kind(path) -> str:
    """What is at ``path`` without following a link: link, fifo, file, dir, device, none."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "none"
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "dir" if stat.S_ISDIR(mode) else "file"


# ------------------------------------------------------------- state after a refusal
_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGCHLD",
                                              "SIGPIPE", "SIGUSR1", "SIGUSR2")
                 if hasattr(signal, n))


def _digest(data) -> int:
    return zlib.crc32(pickle.dumps(data)) if not isinstance(data, bytes) else zlib.crc32(data)


def state_snapshot(folder=None) -> dict:
    """What a refused call must leave as it was: the three generators, torch's globals,
    signal handlers, sys.stdout/stderr, live threads, child processes and the files under
    ``folder``."""
    snap = {"python RNG": _digest(random.getstate())}
    np = sys.modules.get("numpy")
    if np is not None:
        snap["numpy RNG"] = _digest(np.random.get_state()[1].tobytes())
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_rng_state"):
        with contextlib.suppress(Exception):
            snap["torch RNG"] = _digest(torch.get_rng_state().numpy().tobytes())
            snap["torch default dtype"] = str(torch.get_default_dtype())
            if hasattr(torch, "get_default_device"):
                snap["torch default device"] = str(torch.get_default_device())
            snap["torch grad mode"] = torch.is_grad_enabled()
            snap["torch threads"] = torch.get_num_threads()
            snap["torch deterministic"] = torch.are_deterministic_algorithms_enabled()
            snap["cudnn.benchmark"] = bool(torch.backends.cudnn.benchmark)
            snap["float32 matmul precision"] = torch.get_float32_matmul_precision()
    snap["signal handlers"] = tuple(repr(signal.getsignal(s)) for s in _SIGNALS)
    snap["sys.stdout"] = id(sys.stdout)
    snap["sys.stderr"] = id(sys.stderr)
    snap["threads"] = frozenset(t.ident for t in threading.enumerate() if t.is_alive())
    snap["child processes"] = frozenset(_children_pids())
    if folder is not None:
        files = []
        for root, dirs, names in os.walk(folder):
            for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                p = os.path.join(root, name)
                with contextlib.suppress(OSError):
                    s = os.lstat(p)
                    files.append((p, s.st_mode, s.st_size, s.st_mtime_ns))
            if len(files) > 5000:
                break
        snap["files"] = frozenset(files)
    return snap


def _children_pids() -> list[int]:
    """Live (not zombie) direct children; /proc is read directly (fast: one call each)."""
    pid = os.getpid()
    try:
        pids = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                pids += [int(p) for p in f.read().split()]
        live = []
        for child in pids:
            with contextlib.suppress(OSError), open(f"/proc/{child}/stat") as f:
                if f.read().rsplit(")", 1)[-1].split()[0] != "Z":
                    live.append(child)
        return live
    except (OSError, ValueError):
        pass
    try:
        import psutil

        return [c.pid for c in psutil.Process().children(recursive=True)
                if c.status() != psutil.STATUS_ZOMBIE]
    except Exception:  # noqa: BLE001
        return []


def state_changes(before: dict, after: dict) -> list[str]:
    """The names of what differs; threads that end within a moment do not count."""
    changed = []
    for key, old in before.items():
        new = after.get(key, old)
        if key == "threads":
            extra = [t for t in threading.enumerate() if t.ident in new - old]
            for t in extra:
                t.join(0.2)
            if any(t.is_alive() for t in extra):
                changed.append(f"threads (+{sum(t.is_alive() for t in extra)})")
        elif key == "child processes":
            if new - old and set(_children_pids()) - old:
                changed.append(f"child processes (+{len(new - old)})")
        elif key == "files":
            if new != old:
                paths = sorted({f[0] for f in new ^ old})
                changed.append("files (" + ", ".join(os.path.basename(p)[:30]
                                                     for p in paths[:3]) + ")")
        elif new != old:
            changed.append(key)
    return changed


def cli_verdict(returncode, stderr: str, valid) -> tuple[str, str]:
    """A command-line program's bad arguments: exit 2 with a one-line message (argparse's
    rule) passes; a traceback is an escape of its last exception; exit 0 on a clearly bad
    argument is silent."""
    text = stderr.strip()
    last = text.splitlines()[-1] if text else ""
    last = re.sub(r"^\[(?:rank|default)\d*\]:\s*", "", last)  # torchrun's per-rank prefix
    if "Traceback (most recent call last)" in stderr:
        name = last.split(":", 1)[0].strip().rsplit(".", 1)[-1] or "Traceback"
        return f"escape:{name}", last[:200]
    if returncode is None:
        return "hang", "no exit in time"
    if returncode < 0:
        return f"escape:signal {-returncode}", f"killed by signal {-returncode}"
    if returncode == 0:
        return ("silent" if valid is False else "accepted"), "exit 0"
    if returncode == 2 and text:
        return "rejected", last[:200]
    return "unclear", f"exit {returncode}: {last[:180]}"


# ------------------------------------------------------------------------ input kinds
def _self_ref():
    items = [1]
    items.append(items)
    return items


def edge_values(np):
    """The fixed edge-case list (every cheap parameter gets all of it)."""
    return [math.nan, math.inf, -math.inf, 5e-324, 1e308, -1e308, 10**400, -10**400, 2**63,
            2**31, 2**63 - 1, -2**63, -1, 0, 1, 7, 1.5, -0.0, True, False, np.float64(2.5),
            np.int64(5), np.bool_(True), np.float64(math.nan), np.float32(math.inf),
            np.int32(2**31 - 1), np.int64(2**62), np.uint64(2**63), np.int8(-1), np.float16(0.5),
            Fraction(3, 2), Decimal("4.5"), b"12", 3 + 4j, "\uff11\uff12", "x" * 100_000, "",
            " ", "abc", "12", [], [1, 2], (), {}, {"a": 1}, object(), None, _self_ref()]


# the subset for slow targets: one of each family
FEW = (math.nan, math.inf, 10**400, 2**31, -1, 0, True, "abc", None, 1.5, [], object())


def _is_bool(v) -> bool:
    return isinstance(v, bool) or type(v).__name__ == "bool_"


class Kind:
    """What a parameter accepts: a validity rule (True/False/None = unknown) and a strategy."""

    def __init__(self, valid, strategy):
        self.valid, self.strategy = valid, strategy


def k_int(st, lo=0, top=16, hi=LARGEST):
    def valid(v):
        if _is_bool(v) or not isinstance(v, numbers.Integral):
            return False
        if v < lo:
            return False
        return True if v <= min(hi, LARGEST) else None
    # drawn whole numbers are small valid ones, below the minimum or beyond LARGEST: never a
    # huge-but-accepted size that would take minutes to allocate
    ints = st.one_of(st.integers(lo, top), st.integers(max_value=lo - 1),
                     st.integers(min_value=LARGEST + 1))
    return Kind(valid, ints)


def k_real(st, lo=None, hi=None, *, above=False, finite=True, top=1e6):
    def valid(v):
        if _is_bool(v) or not isinstance(v, numbers.Real):
            return None if isinstance(v, Decimal) else False
        try:
            f = float(v)
        except OverflowError:
            return False if finite else None
        if math.isnan(f) or math.isinf(f):
            return False if finite else None
        if lo is not None and (f < lo or (above and f == lo)):
            return False
        if hi is not None and f > hi:
            return False
        return True
    low = lo if lo is not None else -top
    high = hi if hi is not None else top
    return Kind(valid, st.one_of(st.floats(low, high), st.floats(), st.integers(-10, 10)))


def k_str(st, choices=(), *, empty=False, longest=10_000):
    def valid(v):
        if not isinstance(v, str):
            return False
        if not v.strip():
            return None if empty else False
        if len(v) > longest:
            return None
        return True if (not choices or v in choices) else None
    parts = [st.text(max_size=12)]
    if choices:
        parts.insert(0, st.sampled_from(sorted(choices)))
    return Kind(valid, st.one_of(*parts))


def k_flag(st):
    return Kind(lambda v: _is_bool(v), st.booleans())


def k_any(st, valid_values=(), valid=None):
    rule = valid or (lambda v: None)
    return Kind(rule, st.sampled_from(list(valid_values)) if valid_values else st.nothing())


def junk(st):
    """Values of every other kind, for every parameter."""
    return st.one_of(
        st.floats(), st.text(max_size=8), st.binary(max_size=4), st.none(), st.booleans(),
        st.complex_numbers(max_magnitude=1e6), st.fractions(-1000, 1000),
        st.decimals(-1000, 1000, places=2), st.integers(-5, 5),
        st.lists(st.integers(-3, 3), max_size=3),
        st.dictionaries(st.text(max_size=2), st.integers(-3, 3), max_size=2))


# --------------------------------------------------------------------------- the fuzzer
class Fuzzer:
    def __init__(self, helpers, *, examples: int, only=(), log=None, trace=False,
                 sandbox=None, repo=None, check_state=True):
        import numpy as np
        from hypothesis import strategies as st

        self.h, self.np, self.st = helpers, np, st
        self.examples, self.only = examples, tuple(only)
        self.records: list[dict] = []
        self.case_no: int | None = None
        self.thread_errors: list[str] = []
        self.log = log or (lambda text: None)
        self.trace = trace
        self.warmed: set[str] = set()
        self.harness_errors: list[str] = []
        self.edges = edge_values(np)
        self.junk = junk(st)
        # every file a call may write lands under the sandbox; the harness's own inputs in
        # sandbox/harness, odd files (FIFOs, links, long names) in sandbox/special
        self.sandbox = Path(sandbox or tempfile.mkdtemp(prefix="fuzz_api_")).resolve()
        self.tmp = self.sandbox / "harness"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.special = special_paths(self.sandbox / "special")
        self.repo = Path(repo or Path(helpers.__file__).parents[1]).resolve()
        self.check_state = check_state
        self._torch = None
        threading.excepthook = self._thread_hook

    # ------------------------------------------------------------------ plumbing
    def _thread_hook(self, args):
        self.thread_errors.append(f"{args.exc_type.__name__}: {message(args.exc_value)} "
                                  f"(in thread {getattr(args.thread, 'name', '?')})")

    @property
    def torch(self):
        if self._torch is None:
            import torch

            torch.set_num_threads(1)
            torch.use_deterministic_algorithms(False)  # imports what setup() would, unalarmed
            self._torch = torch
        return self._torch

    def exported(self, name: str) -> bool:
        return name in getattr(self.h, "_EXPORTS", {})

    def wanted(self, name: str) -> bool:
        return self.exported(name) and (not self.only or name in self.only)

    def wanted_any(self, *names: str) -> bool:
        return any(self.wanted(n) for n in names)

    def owner(self, name: str) -> str:
        return owner_of(self.h._EXPORTS.get(name, "")) if self.exported(name) else "lead"

    def call(self, name, target, label, fn, *, valid=None, names=(), documented=(),
             timeout=5.0, check=None):
        """Run ``fn()`` once, classify the outcome and record it; returns (kind, value)."""
        if self.trace:
            self.log(f"    {label[:150]}")
        first = target not in self.warmed
        if first:  # a first call may import a lot: never cut an import
            self.warmed.add(target)
            timeout = max(timeout, 90.0)
        out, err = io.StringIO(), io.StringIO()
        n_errors = len(self.thread_errors)
        exc = value = None
        started = time.perf_counter()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            # a first call imports modules and starts their threads: no state check there
            before = state_snapshot(self.sandbox) if self.check_state and not first else None
            try:
                with alarm(timeout):
                    value = fn()
            except KeyboardInterrupt:
                raise
            except BaseException as caught:  # noqa: BLE001 - SystemExit escaping is a finding
                exc = caught
            kind = classify(exc, valid, names, documented)
            detail = (f"{type(exc).__name__}: {message(exc)}" if exc is not None
                      else f"returned {short(value, 100)}")
            if isinstance(exc, Hang):
                detail = f"no result after {timeout:g} s"
            if kind == "rejected" and before is not None:
                changed = state_changes(before, state_snapshot(self.sandbox))
                if changed:
                    kind = "side-effect"
                    detail = f"refused ({detail[:120]}), yet changed: {', '.join(changed)}"
            if kind in PASSED + ("silent",) and check is not None:
                try:
                    with alarm(timeout):
                        verdict = check(exc if exc is not None else value)
                except KeyboardInterrupt:
                    raise
                except BaseException as caught:  # noqa: BLE001
                    verdict = (f"escape:{type(caught).__name__}",
                               f"while checking: {type(caught).__name__}: {message(caught)}")
                if verdict:
                    kind, detail = verdict
        new_errors = self.thread_errors[n_errors:]
        if new_errors and kind in PASSED + SOFT:
            kind = "escape:" + new_errors[0].split(":", 1)[0]
            detail = new_errors[0]
        elif kind in PASSED and "Traceback (most recent call last)" in err.getvalue():
            kind, detail = "side-effect", "printed a traceback: " + err.getvalue()[-200:]
        record = {"target": target, "name": name, "owner": self.owner(name),
                  "input": label, "kind": kind, "detail": " ".join(detail.split())[:300],
                  "seconds": round(time.perf_counter() - started, 3)}
        if self.case_no is not None:
            record["case"] = self.case_no
        self.records.append(record)
        return kind, (exc if exc is not None else value)

    def fuzz(self, name, param, make, kind, *, names=None, documented=(), cost=1, timeout=5.0,
             check=None, extra=(), target=None, call=None, exclude=()):
        """``make(value)`` for the edge values and ``examples`` hypothesis draws."""
        if not self.wanted(name):
            return
        from hypothesis import HealthCheck, Phase, given, seed, settings

        target = target or f"{name}({param}=)"
        names = names or (param,)
        edges = self.edges if cost == 1 else [v for v in self.edges if _in(v, FEW)]
        if cost >= 3:
            edges = edges[::2]
        values = [v for v in list(extra) + edges if not _in(v, exclude)]
        call = call or f"helpers.{name}({param}={{}})"
        self.log(f"  {target} {param}: {len(values)} edge values + {self._n(cost)} draws")

        def one(value):
            if exclude and _in(value, exclude):
                return
            self.call(name, target, call.format(short(value)),
                      lambda: make(value), valid=_validity(kind, value), names=names,
                      documented=documented, timeout=timeout, check=check)

        for value in values:
            one(value)
        n = self._n(cost)
        if n:
            strategy = self.st.one_of(kind.strategy, self.junk, self.st.sampled_from(self.edges))
            # the same draws on every run and every checkout: a seed per target and parameter
            # (derandomize would hash this function's source, so editing it would change them)
            run = settings(max_examples=n, database=None, deadline=None,
                           phases=[Phase.generate], suppress_health_check=list(HealthCheck))(
                given(strategy)(one))
            seed(zlib.crc32(f"{target}|{param}".encode()))(run)()

    def _n(self, cost):
        return {1: self.examples, 2: max(1, self.examples // 2)}.get(
            cost, max(1, self.examples // 8))

    def once(self, name, target, label, fn, **kw):
        if self.wanted(name):
            return self.call(name, target, label, fn, **kw)
        return None, None

    @contextlib.contextmanager
    def case(self, n):
        self.case_no = n
        try:
            yield
        finally:
            self.case_no = None

    # ------------------------------------------------------------------ helpers
    def show(self, obj):
        """What a notebook does with a result: repr, text and HTML."""
        repr(obj)
        for attr in ("text", "_repr_html_"):
            method = getattr(obj, attr, None)
            if callable(method):
                try:
                    method()
                except TypeError as exc:  # text(width) style methods need no argument here
                    if "argument" not in message(exc):
                        raise
        return obj

    def linear(self):
        """A small model made without moving the global torch generator (a refusal that
        follows must find it as it was)."""
        with self.torch.random.fork_rng(devices=[]):
            self.torch.manual_seed(0)
            return self.torch.nn.Linear(3, 2)

    def pollers(self) -> list[str]:
        return sorted(t.name for t in threading.enumerate()
                      if t.is_alive() and "poll" in t.name.lower())

    def wait_pollers_gone(self, seconds=6.0):
        end = time.monotonic() + seconds
        while self.pollers() and time.monotonic() < end:
            time.sleep(0.05)

    def children(self):
        """Live child processes started by the run_captured calls here (their ``-c`` code is
        one of CHILD_CODE; torch or TensorFlow helper processes are not counted)."""
        try:
            import psutil

            found = []
            for child in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if (child.status() != psutil.STATUS_ZOMBIE
                            and set(child.cmdline()[1:]) & set(CHILD_CODE)):
                        found.append(child)
            return found
        except Exception:  # noqa: BLE001
            return []

    def reap_children(self):
        left = self.children()
        for child in left:
            with contextlib.suppress(Exception):
                child.kill()
                child.wait(5)
        return left

    # ------------------------------------------------------------------ the run
    def run(self, *, cases=True):
        steps = [self.t_format, self.t_foundation, self.t_launch, self.t_checkpoint,
                 self.t_memory, self.t_finder, self.t_oom, self.t_watch, self.t_throughput,
                 self.t_data_models, self.t_new_names, self.t_keras, self.t_paths,
                 self.t_planner, self.t_standins, self.t_cli]
        started = time.perf_counter()
        for step in steps:
            self.log(f"[{time.perf_counter() - started:4.0f} s] "
                     f"{step.__doc__.strip().splitlines()[0]}")
            self.guarded(step)
        if cases:
            # case 7 last: on failure it breaks full_scale for good
            for n, method in [*((n, f"case_{n}") for n in range(1, 12) if n != 7),
                              (7, "case_7")]:
                self.log(f"[{time.perf_counter() - started:4.0f} s] case {n}: {CASES[n]}")
                with self.case(n):
                    self.guarded(getattr(self, method))

    def guarded(self, step):
        """Run one area; a bug of the harness itself is reported and the run goes on."""
        try:
            step()
        except Exception:  # noqa: BLE001
            import traceback

            self.harness_errors.append(traceback.format_exc())
            self.log("HARNESS ERROR (the run goes on):\n" + traceback.format_exc())

    # ============================================================== targets by area
    def t_format(self):
        """formatting and parsing (fmt_*, Table, parse_capacity)"""
        h, st = self.h, self.st
        num = k_real(st, finite=False, top=1e15)
        digits = k_int(st, 0, 8, hi=30)
        for fn, param in (("fmt_bytes", "n_bytes"), ("fmt_mib", "n_bytes"),
                          ("fmt_gib", "n_bytes"), ("fmt_seconds", "seconds"),
                          ("fmt_rate", "per_second"), ("fmt_ratio", "ratio")):
            if not self.exported(fn):
                continue
            f = getattr(h, fn)
            self.fuzz(fn, param, lambda v, f=f: f(v), num, target=fn)
            if fn != "fmt_rate":
                self.fuzz(fn, "digits", lambda v, f=f: f(5 * 2**30, digits=v), digits)
        self.fuzz("fmt_rate", "unit", lambda v: h.fmt_rate(10.0, unit=v), k_str(st, empty=True))
        self.fuzz("fmt_ratio", "measured", lambda v: h.fmt_ratio(1.5, measured=v), k_flag(st))
        capacities = ["16 GiB", "1GB", "512 MiB", "L40S", "A100", "80GB", "1.5 GiB", "64 MiB"]
        self.fuzz("parse_capacity", "value", h.parse_capacity if self.exported(
            "parse_capacity") else None,
            k_any(st, capacities + [1, 2**30], valid=_capacity_valid),
            names=CAPACITY_WORDS, target="parse_capacity", extra=capacities + [-10**5000])
        rows = k_any(st, [[[1, 2]], [["a", "b"]], []],
                     valid=lambda v: isinstance(v, (list, tuple)) and all(
                         isinstance(r, (list, tuple)) for r in v) or None)
        self.fuzz("Table", "headers", lambda v: self.show(h.Table(v, [])),
                  k_any(st, [["a"], ["a", "b"], []], valid=lambda v: isinstance(v, list) and all(
                      isinstance(x, str) for x in v) or None), target="Table")
        self.fuzz("Table", "rows", lambda v: self.show(h.Table(["a", "b"], v)), rows,
                  target="Table", names=("rows", "row"))
        self.fuzz("Table", "title", lambda v: self.show(h.Table(["a"], [[1]], title=v)),
                  k_any(st, ["t", None], valid=lambda v: v is None or isinstance(v, str) or None),
                  target="Table")
        self.once("Table", "Table", "t = helpers.Table(['a'], [[1]]); t.rows.append([1, 2]); "
                  "t.text()", lambda: _append_and_show(self, h.Table(["a"], [[1]])),
                  names=("row", "rows"))
        self.once("Table", "Table", "helpers.Table(['a'], ['x']).text()  (a string as a row)",
                  lambda: self.show(h.Table(["a"], ["x"])), valid=False, names=("row", "rows"))

    def t_foundation(self):
        """foundation (setup, pick_device, check, reveal, recorded results)"""
        h, st = self.h, self.st
        self.fuzz("setup", "seed", lambda v: h.setup(v, tensorflow=False),
                  k_int(st, 0, 1000, hi=2**32 - 1), target="setup", cost=2)
        for param in ("deterministic", "benchmark"):
            self.fuzz("setup", param, lambda v, p=param: h.setup(0, tensorflow=False, **{p: v}),
                      k_flag(st), target="setup", cost=2)
        if self.wanted("setup"):
            self.h.setup(0, tensorflow=False, deterministic=False)  # leave the defaults
            self.torch.use_deterministic_algorithms(False)
        self.fuzz("pick_device", "prefer", h.pick_device if self.exported("pick_device")
                  else None, k_str(st, ("auto", "cpu")), target="pick_device")
        self.once("device_report", "device_report", "helpers.device_report(tensorflow=False)",
                  lambda: self.show(h.device_report(tensorflow=False)))
        self.once("headless", "headless", "helpers.headless()", lambda: h.headless())
        ids = ["01-abc", "08-fix", "03-resume"]
        self.fuzz("check", "exercise_id", lambda v: self.show(h.check(v, lambda: None)),
                  k_str(st, ids), target="check", extra=["01-abc\n"])
        self.fuzz("check", "test", lambda v: self.show(h.check("01-abc", v)),
                  k_any(st, [lambda: None], valid=lambda v: callable(v) or False),
                  target="check", cost=2)
        self.fuzz("check", "success", lambda v: self.show(h.check("01-abc", lambda: None,
                                                                   success=v)),
                  k_str(st, empty=True), target="check", cost=2)
        for label, test in _learner_tests():
            self.once("check", "check", f"helpers.check('01-abc', {label})",
                      lambda t=test: self.show(h.check("01-abc", t)))
        self.fuzz("reveal", "exercise_id", lambda v: self.show(h.reveal(v, insert=False)),
                  k_str(st), target="reveal", cost=2)
        self._recorded()

    def _recorded(self):
        h, st = self.h, self.st
        folder = self.tmp / "recorded"
        folder.mkdir(exist_ok=True)
        record = {"kind": "gpu-lessons recorded GPU results", "date": "d",
                  "hardware": {"gpu": "x"}, "versions": {}, "rungs": []}
        files = {"hwnull": {**record, "hardware": None}, "listy": [1, 2], "ok": record}
        for stem, data in files.items():
            (folder / f"{stem}.json").write_text(json.dumps(data))
        (folder / "badutf.json").write_bytes(b"\xff\xfe{")
        (folder / "notjson.json").write_text("{")
        for stem in [*files, "badutf", "notjson", "missing"]:
            self.once("recorded_gpu_results", "recorded_gpu_results",
                      f"helpers.recorded_gpu_results({stem!r}, directory=<tmp>)",
                      lambda s=stem: self.show(h.recorded_gpu_results(s, directory=folder)),
                      names=("name", stem, "directory", "recorded"),
                      documented=(FileNotFoundError,))
        self.fuzz("recorded_gpu_results", "name",
                  lambda v: h.recorded_gpu_results(v, directory=folder), k_str(st),
                  target="recorded_gpu_results", cost=2, documented=(FileNotFoundError,))
        self.fuzz("recorded_gpu_results", "directory",
                  lambda v: h.recorded_gpu_results("memory", directory=v),
                  k_any(st, [None, str(folder)]), target="recorded_gpu_results", cost=2,
                  documented=(FileNotFoundError,))
        rungs = [{"name": "a", "samples_per_second": "fast"}]
        bad = [{"hardware": None}, {"hardware": "gpu"}, {"rungs": 5}, {"versions": None,
                                                                       "rungs": rungs}]
        for i, change in enumerate(bad):
            d = self.tmp / f"throughput{i}"
            d.mkdir(exist_ok=True)
            (d / "09_throughput.json").write_text(json.dumps({**record, **change}))
            self.once("throughput_gpu_results", "throughput_gpu_results",
                      f"helpers.throughput_gpu_results(<dir with {short(change, 60)}>).table()",
                      lambda d=d: self.show(_table(h.throughput_gpu_results(d))),
                      names=("results", "record", "hardware", "rungs", "versions", "09_"))

    def t_launch(self):
        """launch (torchrun_command, ddp_plan, tf_config, command_text, script_path,
        run_captured, free_port)"""
        h, st = self.h, self.st
        tc = h.torchrun_command if self.exported("torchrun_command") else None
        self.fuzz("torchrun_command", "script", lambda v: tc(v, nproc_per_node=2),
                  k_str(st, ("train.py",)), target="torchrun_command")
        self.fuzz("torchrun_command", "nproc_per_node", lambda v: tc("t.py", nproc_per_node=v),
                  k_int(st, 1, 8), target="torchrun_command")
        self.fuzz("torchrun_command", "nnodes", lambda v: tc("t.py", nproc_per_node=2, nnodes=v),
                  k_int(st, 1, 4), target="torchrun_command", cost=2)
        rdzv_id = k_any(st, ["job1", 7], valid=lambda v: (
            None if isinstance(v, numbers.Integral) and not _is_bool(v) else
            k_str(st).valid(v)))
        for param in ("rdzv_endpoint", "rdzv_id", "rdzv_backend"):
            self.fuzz("torchrun_command", param,
                      lambda v, p=param: tc("t.py", nproc_per_node=2, nnodes=2,
                                            **{"rdzv_endpoint": "h:1", "rdzv_id": "job1", p: v}),
                      rdzv_id if param == "rdzv_id" else k_str(st, ("h:1", "c10d")),
                      target="torchrun_command", cost=2)
        self.fuzz("torchrun_command", "script_args",
                  lambda v: tc("t.py", v, nproc_per_node=2),
                  k_any(st, [(), ["--epochs", "2"]],
                        valid=lambda v: (isinstance(v, (list, tuple)) and all(
                            isinstance(x, (str, int)) and not _is_bool(x) for x in v)) or None),
                  target="torchrun_command", cost=2)
        self.fuzz("ddp_plan", "n_gpus", lambda v: h.ddp_plan(v),
                  k_any(st, [None, 0, 1, 2, 8], valid=lambda v: v is None or (
                      k_int(st, 0).valid(v))), target="ddp_plan")
        self.fuzz("ddp_plan", "cpu_processes", lambda v: h.ddp_plan(0, cpu_processes=v),
                  k_int(st, 1, 8), target="ddp_plan", cost=2)
        tf = h.tf_config if self.exported("tf_config") else None
        self.fuzz("tf_config", "workers", lambda v: tf(v, 0),
                  k_any(st, [["a:1", "b:2"], ["h:22"]]), target="tf_config",
                  names=("workers", "worker"))
        self.fuzz("tf_config", "index", lambda v: tf(["a:1", "b:2"], v), k_int(st, 0, 1, hi=1),
                  target="tf_config")
        self.fuzz("tf_config", "task_type", lambda v: tf(["a:1"], 0, task_type=v),
                  k_str(st, ("worker", "chief")), target="tf_config", cost=2)
        self.once("tf_config", "tf_config", "helpers.tf_config(['a:1', 'A:1'], 0)",
                  lambda: tf(["a:1", "A:1"], 0), valid=False, names=("workers",))
        self.fuzz("command_text", "command", lambda v: h.command_text(v),
                  k_any(st, [["ls", "-l"], ["a b"]]), target="command_text", cost=2)
        self.fuzz("script_path", "name", lambda v: h.script_path(v),
                  k_str(st, ("ddp_train.py",)), target="script_path",
                  documented=(FileNotFoundError,), cost=2)
        self._run_captured()
        self.once("free_port", "free_port", "helpers.free_port()", lambda: h.free_port())

    def _run_captured(self):
        h, st = self.h, self.st
        if not self.wanted("run_captured"):
            return
        py = sys.executable
        ok = [py, "-c", "pass"]

        def no_child(_):
            left = self.reap_children()
            if left:
                return "leak", f"{len(left)} child process(es) left running"
            return None

        commands = [[], [""], ["a\x00b"], [5], "abc", None, [py, 5], [b"x"],
                    ["/nonexistent/cmd"], ok, [py, "-c", CHILD_CODE[2]]]
        for cmd in commands:
            self.call("run_captured", "run_captured", f"helpers.run_captured({short(cmd)})",
                      lambda c=cmd: h.run_captured(c, timeout=20), names=("command",),
                      documented=(FileNotFoundError,), timeout=20, check=no_child,
                      valid=None if cmd in (ok, commands[-1], [py, 5]) else False)
        self.fuzz("run_captured", "timeout", lambda v: h.run_captured(ok, timeout=v),
                  k_real(st, 0, 60, above=True, top=10), documented=(TimeoutError,),
                  timeout=20, check=no_child, cost=2)
        self.fuzz("run_captured", "env", lambda v: h.run_captured(ok, env=v, timeout=20),
                  k_any(st, [None, {"A": "1"}], valid=lambda v: v is None or (
                      isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str)
                                                  for k, x in v.items())) or None),
                  timeout=20, check=no_child, cost=3)
        self.fuzz("run_captured", "cwd", lambda v: h.run_captured(ok, cwd=v, timeout=20),
                  k_any(st, [None, str(self.tmp)]), documented=(FileNotFoundError,),
                  timeout=20, check=no_child, cost=3)

    # ------------------------------------------------------------------ checkpoints
    def t_checkpoint(self):
        """checkpoints (save/load round trips, bad extra, corrupt files, RNG state)"""
        h, st = self.h, self.st
        if not self.wanted_any("save_checkpoint", "load_checkpoint", "read_checkpoint",
                                   "set_rng_state", "rng_state", "unwrap"):
            return
        torch = self.torch
        path = self.tmp / "good.pt"
        model = self.linear()
        opt = torch.optim.Adam(model.parameters())

        def save(**kw):
            args = {"model": model, "optimizer": opt, "epoch": 1, **kw}
            return h.save_checkpoint(args.pop("path", path), **args)

        save()
        for param, kind in (("epoch", k_int(st, 0, 100)), ("step", k_int(st, 0, 100))):
            self.fuzz("save_checkpoint", param, lambda v, p=param: save(**{p: v}), kind,
                      target="save_checkpoint", cost=2, check=self.loadable(path, model))
        self.fuzz("save_checkpoint", "extra", lambda v: save(extra=v),
                  k_any(st, [None, {"loss": 0.5}, {"a": [1, 2], "b": "x"}],
                        valid=lambda v: v is None or (isinstance(v, dict) or False) and None),
                  target="save_checkpoint", cost=2, check=self.loadable(path, model))
        for param in ("model", "optimizer", "scaler"):
            self.fuzz("save_checkpoint", param, lambda v, p=param: save(**{p: v}),
                      k_any(st), target="save_checkpoint", cost=3,
                      check=self.loadable(path, model))
        # paths: a fixed list (drawn text could name real places on this machine)
        for value in (5, None, b"x.pt", "", str(self.tmp / "no" / "such" / "x.pt"),
                      str(self.tmp), "x" * 5000, "a\x00b.pt", self.tmp / "ok.pt"):
            self.call("save_checkpoint", "save_checkpoint", f"helpers.save_checkpoint("
                      f"{short(value)}, model=m, epoch=1)", lambda v=value: save(path=v),
                      names=("path",), valid=None if isinstance(value, Path) or "no" in str(
                          value) else False,
                      documented=(FileNotFoundError,))
        self._extra_round_trip(save, path, model)
        self._bad_files(path, model, opt)

    def loadable(self, path, model):
        """A check: the checkpoint at ``path`` still loads (else ``corrupt``)."""
        h = self.h

        def check(_):
            try:
                h.load_checkpoint(path, model=model, restore_rng=False)
            except BaseException as exc:  # noqa: BLE001
                self.h.save_checkpoint(path, model=model, epoch=1)  # a good file again
                return "corrupt", (f"the save was accepted and replaced a good checkpoint; "
                                   f"load_checkpoint now raises {type(exc).__name__}: "
                                   f"{message(exc)[:150]}")
            return None
        return check

    def _extra_round_trip(self, save, path, model):
        np = self.np
        Pair = namedtuple("Pair", "a b")

        import enum

        class Color(enum.IntEnum):
            RED = 1

        values = {"np.float64(0.9)": np.float64(0.9), "np.str_('a')": np.str_("a"),
                  "defaultdict(int, a=1)": defaultdict(int, a=1), "np.int64(3)": np.int64(3),
                  "namedtuple Pair(1, 2)": Pair(1, 2), "IntEnum member": Color.RED,
                  "np.bool_(True)": np.bool_(True), "Fraction(1, 2)": Fraction(1, 2),
                  "Decimal('1.5')": Decimal("1.5"), "object()": object(),
                  "{'nested': {'list': [1, (2, 3)], 'none': None}}":
                      {"nested": {"list": [1, (2, 3)], "none": None}},
                  "torch.tensor(1.0)": self.torch.tensor(1.0), "float('nan')": math.nan,
                  "'x' * 100000": "x" * 100_000, "b'bytes'": b"bytes", "{1, 2}": {1, 2},
                  "complex 1+2j": 1 + 2j}
        for label, value in values.items():
            first = label in ("np.float64(0.9)", "np.str_('a')", "defaultdict(int, a=1)")
            with self.case(1 if first else None):
                self.call("save_checkpoint", "save_checkpoint (extra round trip)",
                          f"save_checkpoint(p, model=m, epoch=1, extra={{'v': {label}}}) over "
                          "a good checkpoint; load_checkpoint(p, model=m)",
                          lambda v=value: save(extra={"v": v}), names=("extra",),
                          check=self.loadable(path, model))

    def _bad_files(self, path, model, opt):
        h, torch = self.h, self.torch
        save_good = lambda: h.save_checkpoint(path, model=model, optimizer=opt, epoch=1)  # noqa
        save_good()
        good = path.read_bytes()
        state = torch.load(path, weights_only=True)
        folder = self.tmp / "bad"
        folder.mkdir(exist_ok=True)
        files = {"text.pt": b"hello\n", "empty.pt": b"", "truncated_50pct.pt":
                 good[: len(good) // 2], "json.pt": b'{"model": {}}',
                 "foreign_pickle.pt": pickle.dumps({"a": 1}),
                 "bitflipped.pt": good[:64] + bytes(b ^ 0xFF for b in good[64:96]) + good[96:]}
        for name, data in files.items():
            (folder / name).write_bytes(data)
        torch.save({"weights": torch.ones(2)}, folder / "foreign_torch.pt")
        incomplete = []
        for key in state:
            for label, change in (("no", None), ("none", "none"), ("int", 5)):
                variant = dict(state)
                if change is None:
                    del variant[key]
                else:
                    variant[key] = None if change == "none" else change
                name = f"fmt_{label}_{key}.pt"
                torch.save(variant, folder / name)
                incomplete.append(name)
        wrong = dict(state, model={"weight": torch.ones(5, 5), "bias": torch.ones(5)})
        torch.save(wrong, folder / "fmt_wrong_shapes.pt")
        case6 = {"text.pt", "empty.pt", "truncated_50pct.pt", "fmt_no_model.pt",
                 "fmt_no_optimizer.pt", "json.pt", "foreign_pickle.pt"}
        for name in [*files, "foreign_torch.pt", *incomplete, "fmt_wrong_shapes.pt"]:
            p = folder / name
            with self.case(6 if name in case6 else None):
                self.call("load_checkpoint", "load_checkpoint (bad files)",
                          f"helpers.load_checkpoint(<{name}>, model=Linear(3,2), optimizer=Adam)",
                          lambda p=p: h.load_checkpoint(p, model=self.linear(), optimizer=(
                              torch.optim.Adam(self.linear().parameters()))),
                          names=(name,))
            if name in files:
                self.call("read_checkpoint", "read_checkpoint (bad files)",
                          f"helpers.read_checkpoint(<{name}>)",
                          lambda p=p: h.read_checkpoint(p), names=(name,))
        self.call("load_checkpoint", "load_checkpoint (bad files)",
                  "helpers.load_checkpoint(<missing.pt>, model=m)",
                  lambda: h.load_checkpoint(folder / "missing.pt", model=self.linear()),
                  documented=(FileNotFoundError,))
        save_good()
        args = {"optimizer=5": {"optimizer": 5}, "model=nn.Linear(5, 5)":
                {"model": torch.nn.Linear(5, 5)}, "map_location='cuda'":
                {"map_location": "cuda"}, "map_location=5": {"map_location": 5},
                "model=5": {"model": 5}, "restore_rng='yes'": {"restore_rng": "yes"}}
        for label, kw in args.items():
            kw = {"model": self.linear(), **kw}
            self.call("load_checkpoint", "load_checkpoint (args)",
                      f"helpers.load_checkpoint(<good.pt>, {label})",
                      lambda kw=kw: h.load_checkpoint(path, **kw),
                      names=tuple(k for k in kw if k != "model" or label.startswith("model")),
                      valid=None if "cuda" in label and torch.cuda.is_available() else False)
        self._rng()

    def _rng(self):
        h, np, torch = self.h, self.np, self.torch
        if not self.wanted("set_rng_state"):
            return

        def snapshot():
            return (random.getstate(), np.random.get_state()[1].tobytes(),
                    torch.get_rng_state().numpy().tobytes())

        base = h.rng_state()
        bad = {"{**rng_state(), 'numpy': {}}": {**base, "numpy": {}},
               "{**rng_state(), 'cuda': 5}": {**base, "cuda": 5},
               "{**rng_state(), 'torch': torch.ones(3, dtype=torch.uint8)}":
                   {**base, "torch": torch.ones(3, dtype=torch.uint8)},
               "{'python': 5, 'numpy': 5, 'torch': 5}": {"python": 5, "numpy": 5, "torch": 5},
               "{**rng_state(), 'python': (1, 2)}": {**base, "python": (1, 2)},
               "5": 5, "{}": {}, "rng_state()": base}

        for label, state in bad.items():
            random.seed(1)
            before = snapshot()

            def unchanged(result, before=before):
                if isinstance(result, BaseException) and snapshot() != before:
                    return ("side-effect", "a rejected state was partly applied: generators "
                            "changed before the error")
                return None

            self.call("set_rng_state", "set_rng_state/rng_state/unwrap",
                      f"helpers.set_rng_state({label})", lambda s=state: h.set_rng_state(s),
                      names=("state",), check=unchanged, valid=None if label ==
                      "rng_state()" else False)
        self.fuzz("unwrap", "model", lambda v: h.unwrap(v),
                  k_any(self.st, valid=lambda v: isinstance(v, torch.nn.Module) or False),
                  target="set_rng_state/rng_state/unwrap", cost=2)

    # ------------------------------------------------------------------ virtual GPU, memory
    def t_memory(self):
        """virtual GPU and memory (VirtualGPU, track, full_scale, measure_step, OOM cleanup,
        compare_memory, trace_dtypes, amp_settings, SimulatedCuda, FakeNvml)"""
        h, st = self.h, self.st
        if not self.wanted_any("VirtualGPU", "full_scale", "measure_step", "compare_memory",
                                   "trace_dtypes", "amp_settings", "SimulatedCuda", "FakeNvml",
                                   "current_virtual_gpu"):
            return
        torch = self.torch
        oom = (torch.OutOfMemoryError,)
        caps = ["1 GiB", "16 GiB", "L40S", "64 MiB", 2**30]
        self.fuzz("VirtualGPU", "capacity", lambda v: h.VirtualGPU(v).summary(),
                  k_any(st, caps, valid=_capacity_valid), target="VirtualGPU",
                  names=CAPACITY_WORDS, extra=caps)
        for param, kind in (("context_bytes", k_int(st, 0, 2**20)), ("rounding", k_flag(st)),
                            ("fake", k_flag(st)), ("index", k_int(st, 0, 3)),
                            ("device", k_any(st, [None, "cpu"], valid=lambda v: (
                                None if v is None or isinstance(v, str) else False)))):
            self.fuzz("VirtualGPU", param, lambda v, p=param: h.VirtualGPU("1 GiB", **{p: v}),
                      kind, target="VirtualGPU", cost=2)

        def track(v):
            with h.VirtualGPU("1 GiB") as gpu:
                return gpu.track(v)

        tensors = [torch.ones(4), [torch.ones(2), torch.ones(3)], {"a": torch.ones(2)},
                   torch.nn.Linear(2, 2)]
        self.fuzz("VirtualGPU", "objs", track, k_any(st, tensors, valid=_trackable(torch)),
                  target="VirtualGPU.track", call="with helpers.VirtualGPU('1 GiB') as g: "
                  "g.track({})", names=("objs", "track", "tensor", "obj"))
        self._nesting()
        self.fuzz("full_scale", "device", lambda v: _enter(h.full_scale(v)),
                  k_any(st, [None, "cpu", "cuda", "cuda:0"]), target="full_scale", cost=2)
        self.once("current_virtual_gpu", "current_virtual_gpu", "helpers.current_virtual_gpu()",
                  lambda: h.current_virtual_gpu())

        def step():
            return torch.ones(8).sum()

        ms = h.measure_step
        self.fuzz("measure_step", "steps", lambda v: ms(step, steps=v), k_int(st, 1, 3),
                  target="measure_step", cost=2)
        self.fuzz("measure_step", "title", lambda v: self.show(ms(step, title=v)),
                  k_any(st, [None, "t"], valid=lambda v: v is None or isinstance(v, str) or
                        False), target="measure_step", cost=2)
        self.fuzz("measure_step", "track_modules", lambda v: ms(step, track_modules=v),
                  k_flag(st), target="measure_step", cost=2)
        self.fuzz("measure_step", "device", lambda v: ms(step, device=v),
                  k_any(st, [None, "cpu"]), target="measure_step", cost=2)
        self.fuzz("measure_step", "step", lambda v: ms(v),
                  k_any(st, [step], valid=lambda v: v is step or (not callable(v) and False)),
                  target="measure_step", cost=2)
        self.fuzz("measure_step", "inputs", lambda v: ms(step, inputs=v),
                  k_any(st, [None] + tensors), target="measure_step", cost=2)
        for param in ("model", "optimizer"):
            self.fuzz("measure_step", param, lambda v, p=param: ms(step, **{p: v}),
                      k_any(st, [None]), target="measure_step", cost=3)
        self.once("measure_step", "measure_step", "helpers.measure_step(torch.ones)  "
                  "(callable needing args)", lambda: ms(torch.ones), names=("step",))
        self._oom_cleanup(oom)
        self._compare_memory()
        self.fuzz("trace_dtypes", "fn", lambda v: self.show(h.trace_dtypes(v)),
                  k_any(st, [step], valid=lambda v: v is step or (not callable(v) and False)),
                  target="trace_dtypes", names=("fn",), cost=2)
        self.fuzz("amp_settings", "device",
                  lambda v: _amp_use(h.amp_settings(v, None)),
                  k_any(st, [None, "cpu", "cuda"]), target="amp_settings",
                  extra=[b"H\xb8\xf0", "cpu", "cuda:0", "mps"])
        self.fuzz("amp_settings", "dtype", lambda v: _amp_use(h.amp_settings("cpu", v)),
                  k_any(st, [None, "bfloat16", "float16", torch.bfloat16]),
                  target="amp_settings", cost=2)
        for param, kind in (("gpu", k_any(st, [None, "L40S", "16 GiB"])),
                            ("device_count", k_int(st, 0, 4)), ("name", k_str(st)),
                            ("capability", k_any(st, [(9, 0), (8, 6)]))):
            self.fuzz("SimulatedCuda", param, lambda v, p=param: h.SimulatedCuda(**{p: v}),
                      kind, target="SimulatedCuda", cost=2)
        self.fuzz("FakeNvml", "gpus", lambda v: h.FakeNvml(v),
                  k_any(st, [None]), target="FakeNvml", cost=2)

    def _nesting(self):
        h = self.h
        misuse = (RuntimeError,)
        self.once("VirtualGPU", "VirtualGPU nesting/re-entry",
                  "VirtualGPU('1GB').__exit__(None, None, None)  (exit without enter)",
                  lambda: h.VirtualGPU("1 GiB").__exit__(None, None, None), documented=misuse)

        def nested():
            with h.VirtualGPU("1 GiB"), h.VirtualGPU("1 GiB"):
                pass

        self.once("VirtualGPU", "VirtualGPU nesting/re-entry", "nested VirtualGPU blocks",
                  nested, documented=misuse)

        def reenter():
            gpu = h.VirtualGPU("1 GiB")
            with gpu:
                t = self.torch.ones(1000)
            with gpu:
                return gpu.allocated_bytes, t

        self.once("VirtualGPU", "VirtualGPU nesting/re-entry", "re-entered VirtualGPU", reenter,
                  documented=misuse)

        def in_thread():
            box = []
            with h.VirtualGPU("1 GiB"):
                def other():
                    try:
                        with h.VirtualGPU("1 GiB"):
                            pass
                    except BaseException as exc:  # noqa: BLE001
                        box.append(exc)
                t = threading.Thread(target=other)
                t.start()
                t.join()
            if box:
                raise box[0]

        self.once("VirtualGPU", "VirtualGPU nesting/re-entry",
                  "VirtualGPU entered from another thread while one is active", in_thread,
                  documented=misuse)

    def oom_run(self, *, fake=False, rounding=False, direct=False, capacity=None):
        """One MLP step on a virtual GPU whose capacity lies between the baseline and the
        step's peak; returns (baseline, after the except block, oom raised?)."""
        h, torch = self.h, self.torch
        torch.manual_seed(0)
        with h.VirtualGPU(capacity or "1 TiB", fake=fake, rounding=rounding) as gpu:
            model = h.MLP()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            x, y = torch.randn(4000, 32), torch.randint(0, 4, (4000,))

            def step():
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()

            base = gpu.allocated_bytes
            gpu.reset_peak()
            gc.disable()
            raised = False
            try:
                if direct:
                    step()
                else:
                    h.measure_step(step, model=model, optimizer=opt)
            except torch.OutOfMemoryError:
                raised = True
            finally:
                after = gpu.allocated_bytes
                gc.enable()
            peak = gpu.peak_allocated_bytes
        gc.collect()
        return base, after, raised, peak

    def _oom_cleanup(self, oom):
        if not self.wanted("measure_step") or not self.exported("MLP"):
            return
        for fake in (False, True):
            for rounding in (False, True):
                for direct in (False, True):
                    label = (f"with VirtualGPU(cap, fake={fake}, rounding={rounding}): MLP + "
                             f"4000-row batch; OOM in forward {'directly' if direct else 'inside measure_step'}; "  # noqa: E501
                             "allocated_bytes after the except block vs the baseline")
                    case = 2 if not direct and not rounding else None
                    with self.case(case):
                        self.call("measure_step", "OOM cleanup", label,
                                  lambda f=fake, r=rounding, d=direct: self._oom_once(f, r, d),
                                  timeout=60)

    def _oom_once(self, fake, rounding, direct):
        base, _, _, peak = self.oom_run(fake=fake, rounding=rounding, direct=True)
        capacity = base + (peak - base) // 3
        base, after, raised, _ = self.oom_run(fake=fake, rounding=rounding, direct=direct,
                                              capacity=capacity)
        if not raised:
            return f"no OOM at capacity {capacity}"
        if after != base:
            raise _Leak(f"allocated_bytes {after:,} != baseline {base:,} right after the "
                        "except block (freed only by gc.collect())")
        return f"back to the baseline {base:,}"

    def _compare_memory(self):
        h, torch = self.h, self.torch
        if not self.wanted("compare_memory"):
            return
        from types import SimpleNamespace

        zero = h.measure_step(lambda: None)
        r = h.measure_step(lambda: torch.ones(100))
        inputs = {
            "{'a': measure_step(lambda: None), 'b': r}": ({"a": zero, "b": r}, None),
            "{'a': r, 'b': r2}": ({"a": r, "b": h.measure_step(lambda: torch.ones(200))}, None),
            "{'a': SimpleNamespace(peak_bytes=5, category_max={}), 'b': r}":
                ({"a": SimpleNamespace(peak_bytes=5, category_max={}), "b": r}, False),
            "{'a': r, 'b': SimpleNamespace(peak_bytes='big', ...)}":
                ({"a": r, "b": SimpleNamespace(peak_bytes="big", category_max=r.category_max)},
                 False),
            "{}": ({}, False), "5": (5, False), "{'a': 5}": ({"a": 5}, False),
        }
        for label, (reports, valid) in inputs.items():
            with self.case(11 if label.startswith("{'a': measure_step") else None):
                self.call("compare_memory", "compare_memory",
                          f"repr(helpers.compare_memory({label}))",
                          lambda rep=reports: self.show(h.compare_memory(rep)),
                          names=("reports", "report"), valid=valid)
        self.fuzz("compare_memory", "baseline",
                  lambda v: self.show(h.compare_memory({"a": r, "b": r}, baseline=v)),
                  k_str(self.st, ("a", "b")), target="compare_memory", cost=2)

    # ------------------------------------------------------------------ the finder
    def t_finder(self):
        """batch-size finder (find_batch_size, is_oom_error)"""
        h, st = self.h, self.st
        if not self.wanted("find_batch_size"):
            return
        torch = self.torch
        documented = (h.BatchSizeError,)

        def step(b):
            return torch.empty(int(b) * 4096, dtype=torch.uint8).sum()

        def find(**kw):
            with h.VirtualGPU("64 MiB"):
                return h.find_batch_size(kw.pop("step", step), **{"maximum": 4096, **kw})

        params = {"start": k_int(st, 1, 64), "maximum": k_int(st, 1, 4096),
                  "margin": k_real(st, 0, 0.9), "steps_per_trial": k_int(st, 1, 2),
                  "multiple_of": k_int(st, 1, 16), "tolerance": k_real(st, 0, 0.5),
                  "max_trials": k_int(st, 1, 25), "capacity": k_any(st, [None, "32 MiB"]),
                  "model": k_any(st, [None]), "optimizer": k_any(st, [None]),
                  "step": k_any(st, [step], valid=lambda v: v is step or (
                      not callable(v) and False))}
        for param, kind in params.items():
            self.fuzz("find_batch_size", param, lambda v, p=param: find(**{p: v}), kind,
                      target="find_batch_size", cost=2, documented=documented, timeout=15)
        for label, fn in _finder_steps(torch):
            self.call("find_batch_size", "find_batch_size(step kinds)",
                      f"with VirtualGPU('64 MiB'): find_batch_size(<step: {label}>)",
                      lambda f=fn: find(step=f, maximum=None), documented=(
                          h.BatchSizeError, _StepError), timeout=20, names=("step",))
        self.call("find_batch_size", "find_batch_size",
                  "with VirtualGPU('64 MiB'): find_batch_size(lambda b: None, max_trials=10**6)"
                  "  (never OOMs)", lambda: find(step=lambda b: None, maximum=None,
                                                max_trials=10**6),
                  documented=documented, timeout=20, names=("max_trials", "maximum"))
        excs = [torch.OutOfMemoryError("x"), RuntimeError("CUDA out of memory"), ValueError(),
                MemoryError(), 5, None, "out of memory"]
        for exc in excs:
            self.once("is_oom_error", "is_oom_error", f"helpers.is_oom_error({short(exc)})",
                      lambda e=exc: h.is_oom_error(e), names=("exc",),
                      valid=isinstance(exc, BaseException) or None)

    # ------------------------------------------------------------------ the OOM challenge
    def t_oom(self):
        """OOM challenge (check_training, count_flops, fix_table, SyntheticImages,
        LargeResNet)"""
        h, st = self.h, self.st
        if not self.wanted_any("check_training", "count_flops", "fix_table", "SyntheticImages",
                                   "LargeResNet"):
            return
        torch = self.torch
        tiny, make_step = _tiny(torch)
        base = {"batch_size": 4, "model": tiny, "small_steps": 1}

        def ct(**kw):
            return self.show(h.check_training(kw.pop("make_step", make_step), **{**base, **kw}))

        ok_kind, ok = self.call("check_training", "check_training",
                                "helpers.check_training(make_step, batch_size=4, model=Tiny, "
                                "small_steps=1)", ct, timeout=60)
        for param, kind in (("batch_size", k_int(st, 1, 8)), ("small_steps", k_int(st, 1, 2)),
                            ("gpu", k_any(st, ["L40S", "16 GiB"])),
                            ("device", k_any(st, [None, "cpu"])), ("name", k_str(st)),
                            ("model", k_any(st, [tiny])), ("optimizer", k_any(st, [None]))):
            self.fuzz("check_training", param, lambda v, p=param: ct(**{p: v}), kind,
                      target="check_training", cost=3, timeout=15,
                      names=CAPACITY_WORDS if param == "gpu" else (param,),
                      exclude=(None,) if param == "model" else (),  # LargeResNet: minutes
                      call=f"helpers.check_training(make_step, batch_size=4, model=Tiny, "
                      f"small_steps=1, {param}={{}})")
        for label, fn in _make_steps(torch, tiny):
            self.call("check_training", "check_training(make_step shapes)",
                      f"helpers.check_training(<make_step: {label}>, batch_size=4, "
                      "small_steps=1, model=Tiny)", lambda f=fn: ct(make_step=f),
                      names=("make_step", "step", "loss"), timeout=30)
        self.fuzz("count_flops", "image_size",
                  lambda v: h.count_flops(make_step, model=tiny, batch_size=2, image_size=v),
                  k_int(st, 8, 64), target="fix_table/plot_fixes/count_flops/SyntheticImages",
                  cost=3, timeout=20)
        checks = [ok] if ok_kind in PASSED and ok is not None else []
        self.fuzz("fix_table", "checks", lambda v: self.show(h.fix_table(v)),
                  k_any(st, [checks], valid=lambda v: v is checks or None),
                  target="fix_table/plot_fixes/count_flops/SyntheticImages", cost=2)
        si = h.SyntheticImages
        for param, kind in (("n_samples", k_int(st, 1, 8)), ("size", k_int(st, 1, 16)),
                            ("n_classes", k_int(st, 1, 10)), ("channels", k_int(st, 1, 3)),
                            ("seed", k_int(st, 0, 100))):
            self.fuzz("SyntheticImages", param,
                      lambda v, p=param: si(**{"n_samples": 4, "size": 8, p: v})[0],
                      kind, target="fix_table/plot_fixes/count_flops/SyntheticImages", cost=2)
        self.fuzz("SyntheticImages", "index", lambda v: si(4, size=8)[v], k_int(st, 0, 3, hi=3),
                  target="fix_table/plot_fixes/count_flops/SyntheticImages",
                  call="helpers.SyntheticImages(4, size=8)[{}]",
                  names=("index", "idx", "item", "i"), documented=(IndexError,))
        for param, kind in (("n_classes", k_int(st, 1, 10)), ("width", k_int(st, 1, 4))):
            self.fuzz("LargeResNet", param,
                      lambda v, p=param: h.LargeResNet(**{"width": 2, p: v}), kind,
                      target="LargeResNet", cost=3)

    # ------------------------------------------------------------------ widgets, monitoring
    def t_watch(self):
        """widgets and monitoring (MemoryGauge, read_memory, GpuWatch, watch_gpus, LivePlot,
        StepTimer)"""
        h, st = self.h, self.st
        if not self.wanted_any("MemoryGauge", "read_memory", "GpuWatch", "watch_gpus", "LivePlot",
                                   "StepTimer"):
            return

        def gauge(**kw):
            g = h.MemoryGauge(**kw)
            try:
                return g.text()
            finally:
                g.stop()

        sources = ["auto", "ram", "cpu", "virtual", "cuda", 0]
        self.fuzz("MemoryGauge", "source", lambda v: gauge(source=v),
                  k_any(st, sources), target="MemoryGauge", cost=2)
        self.fuzz("MemoryGauge", "poll", lambda v: gauge(poll=v),
                  k_any(st, [None, 0.25, 1.0], valid=lambda v: v is None or k_real(
                      st, 0.05, 3600).valid(v)), target="MemoryGauge", cost=2)
        self.fuzz("MemoryGauge", "width", lambda v: gauge(width=v), k_int(st, 1, 40, hi=1000),
                  target="MemoryGauge", cost=2)
        fake = _FakeVGPU(10**400, 5, 5, 0)
        for label, gpu in (("capacity_bytes=10**400", fake),
                           ("negative numbers", _FakeVGPU(-5, -5, -5, -5))):
            self.once("MemoryGauge", "MemoryGauge", f"helpers.MemoryGauge(FakeVGPU({label}))"
                      ".text()", lambda g=gpu: gauge(source=g), valid=False,
                      names=("capacity", "source", "bytes"))
        self.fuzz("read_memory", "source", lambda v: self.show(h.read_memory(v)),
                  k_any(st, sources), target="read_memory", cost=2)
        self.fuzz("read_memory", "width", lambda v: h.read_memory().text(v),
                  k_int(st, 1, 40, hi=1000), target="read_memory", cost=2,
                  call="helpers.read_memory().text({})")
        self.fuzz("read_memory", "bar", lambda v: h.read_memory().bar(v),
                  k_int(st, 1, 40, hi=1000), target="read_memory", names=("width",), cost=2,
                  call="helpers.read_memory().bar({})")

        def watch(**kw):
            w = h.GpuWatch(**kw)
            try:
                return w.text()
            finally:
                w.stop()

        self.fuzz("GpuWatch", "interval", lambda v: watch(interval=v),
                  k_any(st, [None, 0.5, 1.0], valid=lambda v: v is None or k_real(
                      st, 0.05, 3600).valid(v)), target="GpuWatch", cost=2)
        self.fuzz("GpuWatch", "width", lambda v: watch(interval=None, width=v),
                  k_int(st, 1, 40, hi=1000), target="GpuWatch", cost=2)

        def watch_gpus(v):
            w = h.watch_gpus(v)
            w.stop()
            return w

        self.fuzz("watch_gpus", "interval", watch_gpus,
                  k_any(st, [None, 0.5], valid=lambda v: v is None or k_real(
                      st, 0.05, 3600).valid(v)), target="watch_gpus", cost=2)
        self._reruns()
        self._liveplot()
        self._steptimer()

    def _reruns(self):
        h = self.h

        def rerun(make, n=20):
            made = []
            for _ in range(n):
                made.append(make())
            alive = self.pollers()
            for w in made:
                w.stop()
            self.wait_pollers_gone()
            if Counter(alive).most_common(1) and Counter(alive).most_common(1)[0][1] > 1:
                raise _Threads(f"poller threads alive: {dict(Counter(alive))}")
            return f"at most one poller per kind ({dict(Counter(alive))})"

        self.once("MemoryGauge", "widget re-run (polling threads)",
                  "20 re-runs of helpers.MemoryGauge(poll=0.25)",
                  lambda: rerun(lambda: h.MemoryGauge(poll=0.25)), timeout=60)
        self.once("watch_gpus", "widget re-run (polling threads)",
                  "20 re-runs of helpers.watch_gpus(0.25)",
                  lambda: rerun(lambda: h.watch_gpus(0.25)), timeout=60)
        for label, make in (("MemoryGauge(source='bogus')", lambda: h.MemoryGauge("bogus")),
                            ("MemoryGauge(poll=0.001)", lambda: h.MemoryGauge(poll=0.001)),
                            ("GpuWatch(0.001)", lambda: h.GpuWatch(0.001))):
            def rejected_keeps(make=make, label=label):
                running = h.MemoryGauge(poll=0.25) if "Memory" in label else h.watch_gpus(0.25)
                try:
                    make()
                except (ValueError, TypeError):
                    stopped = not running.polling
                    running.stop()
                    if stopped:
                        raise _SideEffect("the rejected call stopped the running poller") from None
                    raise
                running.stop()
                return "accepted"

            self.once("MemoryGauge", "widget re-run (polling threads)",
                      f"w = <running gauge>; {label} -> error; w.polling", rejected_keeps,
                      names=("source", "poll", "interval"), timeout=30)

    def _liveplot(self):
        h, st = self.h, self.st
        if not self.wanted("LivePlot"):
            return
        torch = self.torch
        closed = (RuntimeError,)

        def plot(**kw):
            p = h.LivePlot(**{"show": False, **kw})
            p.step(loss=1.0, samples=4)
            p.summary()
            p.close()

        for param, kind in (("title", k_str(st, empty=True)), ("total", k_any(
                st, [None, 10], valid=lambda v: v is None or k_int(st, 1).valid(v))),
                            ("gauge", k_any(st, [False, True])),
                            ("min_interval", k_real(st, 0, 10)), ("budget", k_real(st, 0, 1)),
                            ("max_points", k_int(st, 2, 500)), ("show", k_flag(st))):
            self.fuzz("LivePlot", param, lambda v, p=param: plot(**{p: v}), kind,
                      target="LivePlot", cost=2)

        def step(**kw):
            p = h.LivePlot(gauge=False, show=False)
            p.step(**{"loss": 1.0, "samples": 4, **kw})
            p.step(loss=0.5, samples=4)
            self.show(p.summary())
            p.svg()
            p.close()

        real = k_real(st, finite=False)
        loss = k_any(st, [0.5, torch.tensor(0.5)], valid=lambda v: (
            None if v is None or isinstance(v, torch.Tensor) and v.numel() == 1 else
            real.valid(v)))
        plot_text = "p = helpers.LivePlot(gauge=False, show=False); p.step(loss=1.0, "
        self.fuzz("LivePlot", "loss", lambda v: step(loss=v), loss, target="LivePlot.step",
                  call="p = helpers.LivePlot(gauge=False, show=False); p.step(loss={}, "
                  "samples=4); p.summary(); p.svg()")
        self.fuzz("LivePlot", "samples", lambda v: step(samples=v), k_any(
            st, [None, 4], valid=lambda v: v is None or k_int(st, 0).valid(v)),
                  target="LivePlot.step", call=plot_text + "samples={}); p.summary(); p.svg()")
        self.fuzz("LivePlot", "step", lambda v: step(step=v), k_any(
            st, [None, 4], valid=lambda v: v is None or k_int(st, 0).valid(v)),
                  target="LivePlot.step",
                  call=plot_text + "samples=4, step={}); p.summary(); p.svg()")

        def after_close():
            p = h.LivePlot(gauge=False, show=False)
            p.close()
            p.step(loss=1.0)

        self.once("LivePlot", "LivePlot.step", "p.close(); p.step(loss=1.0)", after_close,
                  documented=closed)
        self.once("LivePlot", "LivePlot.keras_callback", "LivePlot().keras_callback(32)",
                  lambda: h.LivePlot(gauge=False, show=False).keras_callback(32)
                  if "tensorflow" in sys.modules else "skipped (TensorFlow not imported yet)")

    def _steptimer(self):
        h, st = self.h, self.st
        if not self.wanted("StepTimer"):
            return
        closed = (RuntimeError,)

        def timer(**kw):
            t = h.StepTimer(**{"show": False, **kw})
            t.step()
            t.step(samples=4)
            self.show(t.summary())
            t.close()

        self.fuzz("StepTimer", "sync", lambda v: timer(sync=v),
                  k_any(st, [None, "cpu"]), target="StepTimer", cost=2,
                  extra=["cuda", "cuda:x", "mps", "meta"])
        self.fuzz("StepTimer", "gpu_util", lambda v: timer(gpu_util=v),
                  k_any(st, [None, 0]), target="StepTimer", cost=2)
        self.fuzz("StepTimer", "min_interval", lambda v: timer(min_interval=v),
                  k_real(st, 0, 10), target="StepTimer", cost=2)

        def samples(v):
            t = h.StepTimer(show=False)
            t.step()
            t.step(samples=v)
            self.show(t.summary())
            t.close()

        self.fuzz("StepTimer", "samples", samples, k_any(
            st, [None, 4], valid=lambda v: v is None or k_int(st, 0).valid(v)),
                  target="StepTimer", call="t = helpers.StepTimer(show=False); t.step(); "
                  "t.step(samples={}); t.summary()")

        def html(v):
            t = h.StepTimer(show=False)
            t.step()
            t.step(samples=4)
            return t.html(last=v)

        self.fuzz("StepTimer", "last", html, k_int(st, 1, 200), target="StepTimer", cost=2,
                  call="t = helpers.StepTimer(show=False); t.step(); t.step(samples=4); "
                  "t.html(last={})")

        def wrap(v):
            t = h.StepTimer(show=False)
            return list(t.wrap(v))

        self.fuzz("StepTimer", "iterable", wrap, k_any(st, [[1, 2], range(3)]),
                  target="StepTimer", cost=2, call="list(helpers.StepTimer(show=False).wrap({}))")

        def misuse(kind):
            t = h.StepTimer(show=False)
            if kind == "step before wrap":
                t.step()
                return "ok"
            t.close()
            if kind == "close twice":
                return t.close()
            return t.step()

        for kind in ("step before wrap", "close twice", "step after close"):
            self.once("StepTimer", "StepTimer", f"StepTimer(): {kind}",
                      lambda k=kind: misuse(k), documented=closed)

    # ------------------------------------------------------------------ throughput
    def t_throughput(self):
        """throughput, timing (SlowDataset, compare, Comparison, compare_times,
        TimeComparison)"""
        h, st = self.h, self.st
        if not self.wanted_any("SlowDataset", "compare", "Comparison", "compare_times",
                                   "TimeComparison"):
            return
        sd = h.SlowDataset
        base = {"n_samples": 8, "n_features": 4, "n_classes": 2, "latency_s": 0.0}
        for param, kind in (("n_samples", k_int(st, 1, 16)), ("n_features", k_int(st, 1, 8)),
                            ("n_classes", k_int(st, 1, 4)), ("latency_s", k_real(st, 0, top=0.01)),
                            ("noise", k_real(st, 0, 100)), ("seed", k_int(st, 0, 2**32 - 1))):
            self.fuzz("SlowDataset", param, lambda v, p=param: sd(**{**base, p: v})[0], kind,
                      target="SlowDataset", cost=2)
        ds = sd(**base)
        ds_text = "helpers.SlowDataset(8, 4, 2, latency_s=0.0)"
        self.fuzz("SlowDataset", "index", lambda v: ds[v], k_int(st, -8, 7, hi=7),
                  target="SlowDataset", call=ds_text + "[{}]", names=("index", "i", "idx"),
                  documented=(IndexError,))
        self.fuzz("SlowDataset", "indices", lambda v: ds.load_batch(v),
                  k_any(st, [[0, 1], [3]]), target="SlowDataset",
                  call=ds_text + ".load_batch({})",
                  names=("indices", "index", "batch"),
                  extra=[[10**400], [[0, 1], [2]]])
        self.fuzz("SlowDataset", "i", lambda v: ds.decode(v), k_int(st, 0, 7, hi=7),
                  target="SlowDataset", call=ds_text + ".decode({})", names=("i", "index"),
                  documented=(IndexError,), cost=2)

        def runs(v):
            return self.show(h.compare(v, rounds=1))

        work = {"a": lambda: 10}
        self.fuzz("compare", "runs", runs, k_any(st, [work]), target="compare", cost=2)
        for param, kind in (("rounds", k_int(st, 1, 3)), ("skipped", k_any(st, [None, {}])),
                            ("notes", k_any(st, [None, {"a": "x"}])),
                            ("sync", k_any(st, [None, "cpu"]))):
            self.fuzz("compare", param,
                      lambda v, p=param: self.show(h.compare(work, **{"rounds": 1, p: v})),
                      kind, target="compare", cost=2)
        self.once("compare", "compare", "helpers.compare({'a': lambda: 10**400})",
                  lambda: self.show(h.compare({"a": lambda: 10**400}, rounds=1)),
                  names=("runs", "samples", "a"))
        self.once("compare", "compare", "helpers.compare({'a': lambda: 10}, notes={'zz': 'x'})",
                  lambda: self.show(h.compare(work, rounds=1, notes={"zz": "x"})),
                  valid=False, names=("notes", "zz"))
        if self.exported("Comparison"):
            self.fuzz("Comparison", "name", lambda v: h.Comparison().speedup(v), k_str(st),
                      target="compare", cost=2, call="helpers.Comparison().speedup({})")
        ct = h.compare_times
        fast = {"a": lambda: None, "b": lambda: None}
        for param, kind in (("rounds", k_int(st, 1, 3)), ("number", k_int(st, 1, 3)),
                            ("warmup", k_int(st, 0, 2)), ("sync", k_any(st, [None, "cpu"])),
                            ("baseline", k_str(st, ("a", "b"))), ("unit", k_str(st, ("ms",)))):
            self.fuzz("compare_times", param,
                      lambda v, p=param: self.show(ct(fast, **{"rounds": 1, p: v})),
                      kind, target="compare_times", cost=2,
                      extra=["cuda", "cuda:x", "mps"] if param == "sync" else ())
        self.fuzz("compare_times", "workloads", lambda v: self.show(ct(v, rounds=1)),
                  k_any(st, [fast]), target="compare_times", cost=2)
        if self.exported("TimeComparison"):
            tc = h.TimeComparison
            for label, samples in (("{'a': [1.0], 'b': [0.0]}", {"a": [1.0], "b": [0.0]}),
                                   ("{'a': []}", {"a": []}), ("{'a': [nan]}", {"a": [math.nan]})):
                names = tuple(samples)
                self.once("TimeComparison", "compare_times",
                          f"helpers.TimeComparison({names}, {label}, 'a', 1, 1).table()",
                          lambda n=names, s=samples: self.show(
                              _table(tc(n, s, "a", 1, 1))), names=("samples", "time"))

    def t_data_models(self):
        """data and models (classification_data, image_data, torch_loader, MLP, SmallCNN,
        ResNet, TransformerBlock, count_parameters)"""
        h, st = self.h, self.st
        if not self.wanted_any("classification_data", "image_data", "torch_dataset",
                                   "torch_loader", "MLP", "SmallCNN", "ResNet",
                                   "TransformerBlock", "count_parameters"):
            return
        torch = self.torch
        for param, kind in (("n_samples", k_int(st, 1, 64)), ("n_features", k_int(st, 1, 16)),
                            ("n_classes", k_int(st, 1, 8)), ("seed", k_int(st, 0, 2**32 - 1)),
                            ("noise", k_real(st, 0, 100))):
            self.fuzz("classification_data", param,
                      lambda v, p=param: h.classification_data(**{"n_samples": 16, p: v}),
                      kind, target="classification_data", cost=2)
        for param, kind in (("n_samples", k_int(st, 1, 16)), ("channels", k_int(st, 1, 4)),
                            ("size", k_int(st, 1, 16)), ("n_classes", k_int(st, 1, 8)),
                            ("seed", k_int(st, 0, 2**32 - 1)), ("channels_last", k_flag(st))):
            self.fuzz("image_data", param,
                      lambda v, p=param: h.image_data(**{"n_samples": 4, "size": 8, p: v}),
                      kind, target="image_data", cost=2)
        x, y = h.classification_data(16)
        self.fuzz("torch_dataset", "x", lambda v: h.torch_dataset(v, y),
                  k_any(st, [x]), target="torch_dataset", cost=3)
        for param, kind in (("batch_size", k_int(st, 1, 16)), ("seed", k_int(st, 0, 2**32 - 1)),
                            ("shuffle", k_flag(st))):
            self.fuzz("torch_loader", param,
                      lambda v, p=param: list(h.torch_loader(x, y, **{p: v})), kind,
                      target="torch_loader", cost=2, extra=[2**64] if param == "seed" else ())
        models = {"MLP": (("in_features", 1, 16), ("hidden", 1, 16), ("depth", 1, 3),
                          ("n_classes", 1, 8)),
                  "SmallCNN": (("in_channels", 1, 3), ("n_classes", 1, 8), ("width", 1, 8)),
                  "ResNet": (("depth", 18, 18), ("n_classes", 1, 8), ("in_channels", 1, 3),
                             ("width", 1, 4)),
                  "TransformerBlock": (("d_model", 4, 16), ("n_heads", 1, 2), ("d_ff", 1, 16))}
        small = {"MLP": {}, "SmallCNN": {}, "ResNet": {"depth": 18, "width": 2},
                 "TransformerBlock": {"d_model": 8, "n_heads": 2}}
        for model, params in models.items():
            for param, lo, top in params:
                kind = k_int(st, lo, top)
                if model == "ResNet" and param == "depth":
                    kind = k_any(st, [18, 34, 50], valid=lambda v: (
                        False if _is_bool(v) or not isinstance(v, numbers.Integral) else None))
                self.fuzz(model, param,
                          lambda v, m=model, p=param: getattr(h, m)(**{**small[m], p: v}),
                          kind, target=model, cost=2 if model != "ResNet" else 3)
        self.fuzz("count_parameters", "model", lambda v: h.count_parameters(v),
                  k_any(st, [torch.nn.Linear(2, 2)], valid=lambda v: isinstance(
                      v, torch.nn.Module) or False), target="count_parameters", cost=3)

    def t_new_names(self):
        """names only the new layout exports (nvml, polling_threads, recorded_tables,
        warm_up_cuda)"""
        h, st = self.h, self.st
        for name in ("nvml_status", "gpu_count", "polling_threads"):
            self.once(name, name, f"helpers.{name}()", lambda n=name: getattr(h, n)())
        for name in ("gpu_memory", "gpu_utilization"):
            if self.exported(name):
                self.fuzz(name, "index", lambda v, n=name: getattr(h, n)(v), k_int(st, 0, 3),
                          target=name, cost=2)
        if self.exported("recorded_tables"):
            self.fuzz("recorded_tables", "recorded", lambda v: h.recorded_tables(v),
                      k_any(st, [None]), target="recorded_tables", cost=2)
        if self.exported("warm_up_cuda"):
            self.fuzz("warm_up_cuda", "device", lambda v: h.warm_up_cuda(v),
                      k_any(st, [None, "cpu"]), target="warm_up_cuda", cost=2)

    def t_keras(self):
        """Keras / TensorFlow (keras_policy, keras_mixed_policy, onednn_setting)"""
        h = self.h
        if not self.wanted_any("keras_policy", "keras_mixed_policy", "onednn_setting"):
            return
        for value in ("mixed_bfloat16", "float32", "bogus"):
            self.once("keras_policy", "keras_policy",
                      f"with helpers.keras_policy({value!r}): pass",
                      lambda v=value: _enter(h.keras_policy(v)), names=("name", "policy"),
                      documented=(ModuleNotFoundError,), timeout=60)
        for value in (None, "cpu", "cuda", 5):
            self.once("keras_mixed_policy", "keras_mixed_policy",
                      f"helpers.keras_mixed_policy({value!r})",
                      lambda v=value: h.keras_mixed_policy(v), names=("device",),
                      documented=(ModuleNotFoundError,), timeout=60)
        self.once("onednn_setting", "onednn_setting", "helpers.onednn_setting()",
                  lambda: h.onednn_setting())
        self._keras_models()

    def _keras_models(self):
        """keras_resnet, KerasVirtualGPU and measure_keras_memory with bad arguments."""
        h, st = self.h, self.st
        tf_missing = (ModuleNotFoundError,)
        for param, kind in (("image_size", k_int(st, 8, 32, hi=512)),
                            ("width", k_int(st, 1, 16, hi=256)),
                            ("classes", k_int(st, 1, 10, hi=10**5)),
                            ("blocks", k_any(st, [(1,), (2, 2)]))):
            self.fuzz("keras_resnet", param, lambda v, p=param: h.keras_resnet(**{p: v}),
                      kind, target="keras_resnet", cost=3, timeout=60, documented=tf_missing)
        if self.exported("KerasVirtualGPU"):
            self.fuzz("KerasVirtualGPU", "capacity",
                      lambda v: self.show(h.KerasVirtualGPU(v, 0)),
                      k_any(st, ["16GB", 2**30]), target="KerasVirtualGPU", cost=2,
                      names=("capacity", "size", "gpu"), documented=tf_missing)
            self.fuzz("KerasVirtualGPU", "memory",
                      lambda v: self.show(h.KerasVirtualGPU("16GB", v)),
                      k_int(st, 0, 2**20, hi=2**40), target="KerasVirtualGPU", cost=2,
                      documented=tf_missing)
        if self.exported("measure_keras_memory"):
            def build():
                import keras

                model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
                model.compile(optimizer="sgd", loss="mse")
                return model

            self.fuzz("measure_keras_memory", "batch_sizes",
                      lambda v: h.measure_keras_memory(build, v, steps=1),
                      k_any(st), target="measure_keras_memory", cost=3, timeout=60,
                      names=("batch_sizes", "batch"), documented=tf_missing,
                      extra=[[0], [-1], [2**31], [2**63], [math.nan], [4, 4], "8"])
            self.fuzz("measure_keras_memory", "steps",
                      lambda v: h.measure_keras_memory(build, [2, 4], steps=v),
                      k_int(st, 1, 2, hi=100), target="measure_keras_memory", cost=3,
                      timeout=60, documented=tf_missing)

    # ------------------------------------------------------------------ odd paths
    def t_paths(self):
        """odd paths (FIFO, link to a FIFO, device-like node, dangling link, long names) for
        save_checkpoint, load_checkpoint and will_it_fit"""
        h = self.h
        if not self.wanted_any("save_checkpoint", "load_checkpoint"):
            return
        model = self.linear()
        for label in list(self.special):
            self.fresh_special()
            path = guard_path(self.special[label], self.sandbox)
            kind_before = file_kind(path)
            target = os.path.realpath(path) if kind_before == "link" else None
            target_kind = file_kind(target) if target else None

            def kept(result, path=path, kind_before=kind_before, target=target,
                     target_kind=target_kind, label=label):
                if file_kind(path) != kind_before and kind_before not in ("none",):
                    return ("replaced", f"the {label} at the path is now a "
                            f"{file_kind(path)} ({kind_before} before)")
                if target and target_kind not in ("none",) and file_kind(target) != target_kind:
                    return ("replaced", f"what the link points to is now a "
                            f"{file_kind(target)} ({target_kind} before)")
                return None

            legal = label in ("long_name_250", "link_to_regular")
            self.once("save_checkpoint", "save_checkpoint(path=<odd file>)",
                      f"helpers.save_checkpoint(<{label}>, model=m, epoch=1)",
                      lambda p=path: h.save_checkpoint(p, model=model, epoch=1),
                      names=("path",), valid=None if legal else False, timeout=3,
                      check=kept)
            self.fresh_special()
            self.once("load_checkpoint", "load_checkpoint(path=<odd file>)",
                      f"helpers.load_checkpoint(<{label}>, model=m)",
                      lambda p=path: h.load_checkpoint(p, model=self.linear()),
                      names=("path", "checkpoint"), documented=(FileNotFoundError,),
                      timeout=3, check=kept)

    def fresh_special(self):
        self.special = special_paths(self.sandbox / "special")
        return self.special

    # ------------------------------------------------------------------ the planner
    def tiny_script(self) -> Path:
        script = self.tmp / "tiny_train.py"
        script.write_text(
            "import argparse, torch\n"
            "p = argparse.ArgumentParser(); p.add_argument('--batch-size', type=int, "
            "default=8)\n"
            "a = p.parse_args()\n"
            "m = torch.nn.Linear(4, 2).cuda()\n"
            "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
            "for _ in range(3):\n"
            "    m(torch.randn(a.batch_size, 4, device='cuda')).sum().backward()\n"
            "    opt.step(); opt.zero_grad()\n")
        return script

    def t_planner(self):
        """the planner (will_it_fit, Plan.slurm, Plan.card_fit)"""
        h, st = self.h, self.st
        if not self.wanted_any("will_it_fit", "Plan"):
            return
        script = self.tiny_script()
        wif = h.will_it_fit
        plan = None
        if self.wanted("will_it_fit"):
            _, plan = self.call("will_it_fit", "will_it_fit", "helpers.will_it_fit(<tiny>)",
                                lambda: wif(str(script)), timeout=120)
            for param, kind in (
                    ("gpu", k_str(st, ("A100-40GB", "L40S", "H100-80GB"))),
                    ("steps", k_int(st, 1, 3, hi=1000)),
                    ("multiple_of", k_int(st, 1, 16, hi=65536)),
                    ("max_batch", k_int(st, 1, 64)),
                    ("max_forwards", k_int(st, 1, 60)),
                    ("time_limit", k_real(st, 0, 7 * 86400, above=True, top=60)),
                    ("context", k_any(st, [0, "500 MiB"])),
                    ("margin", k_any(st, [None, "20%", "1 GiB"])),
                    ("amp", k_any(st, [None, "bf16", "fp16"])),
                    ("ddp", k_any(st, [None, 2])),
                    ("checkpoint_every", k_any(st, [None, 1])),
                    ("strict", k_flag(st)), ("fake", k_flag(st))):
                self.fuzz("will_it_fit", param,
                          lambda v, p=param: wif(str(script), **{p: v}), kind,
                          target="will_it_fit", cost=3, timeout=60,
                          documented=(h.PlanError,) if self.exported("PlanError") else ())
            self.fuzz("will_it_fit", "args", lambda v: wif(str(script), v),
                      k_any(st, [(), ["--batch-size", "4"]]), target="will_it_fit",
                      cost=3, timeout=60)
            self.once("will_it_fit", "will_it_fit", "helpers.will_it_fit(<tiny>, "
                      "batch_arg='--batch-size', max_batch=2**31)",
                      lambda: wif(str(script), batch_arg="--batch-size", max_batch=2**31),
                      names=("max_batch",), timeout=60)
            for label, path in [*self.fresh_special().items(), ("folder", self.tmp),
                                ("missing", self.tmp / "missing.py")]:
                self.fresh_special()
                guard_path(path, self.sandbox)
                self.once("will_it_fit", "will_it_fit(script=<odd file>)",
                          f"helpers.will_it_fit(<{label}>)", lambda p=path: wif(str(p)),
                          names=("script",), valid=False, timeout=20,
                          documented=(FileNotFoundError,))
        if plan is None or not hasattr(plan, "slurm"):
            return
        self.fuzz("Plan", "time_limit", lambda v: plan.slurm(time_limit=v),
                  k_any(st, ["01:00:00", "30", 90, "1-00"]), target="Plan.slurm",
                  names=("time_limit", "time"), extra=[math.nan, -5, "nan", "25:99:99", 0])
        self.fuzz("Plan", "card", lambda v: plan.slurm(card=v),
                  k_any(st, [None, "A100-80GB"]), target="Plan.slurm", names=("card",))
        if hasattr(plan, "card_fit"):
            self.fuzz("Plan", "card", lambda v: plan.card_fit(v),
                      k_any(st, ["L40S", "A100-80GB"]), target="Plan.card_fit",
                      names=("card",), cost=2)

    # ------------------------------------------------------------------ CUDA stand-ins
    def t_standins(self):
        """SimulatedCuda and FakeNvml, entered and used (device_count=2**31,
        this_process_bytes=inf...)"""
        h, st = self.h, self.st
        if self.wanted("SimulatedCuda"):
            torch = self.torch

            def use_sim(**kw):
                with h.SimulatedCuda(**kw):
                    n = torch.cuda.device_count()
                    if n:
                        torch.cuda.get_device_properties(n - 1)
                        torch.cuda.mem_get_info(0)
                    return n

            for param, kind in (("device_count", k_int(st, 0, 8, hi=1024)),
                                ("gpu", k_any(st, [None, "L40S", "16 GiB"])),
                                ("capability", k_any(st, [(9, 0), (8, 6)])),
                                ("cudnn_version", k_int(st, 0, 99999)),
                                ("cuda_version", k_any(st, [None, "13.0", "12.4"])),
                                ("available", k_flag(st))):
                self.fuzz("SimulatedCuda", param, lambda v, p=param: use_sim(**{p: v}), kind,
                          target="SimulatedCuda (entered)", cost=2, timeout=5)
        if self.wanted("FakeNvml"):
            def use_nvml(**kw):
                with h.FakeNvml(**kw):
                    return h.nvml_status() if self.exported("nvml_status") else None

            for param, kind in (("this_process_bytes", k_int(st, 0, 2**34, hi=2**60)),
                                ("cuda_driver", k_int(st, 0, 13000, hi=10**6)),
                                ("driver", k_str(st, ("580.95.05",), longest=100)),
                                ("fail", k_any(st, [()])),
                                ("bytes_names", k_flag(st))):
                self.fuzz("FakeNvml", param, lambda v, p=param: use_nvml(**{p: v}), kind,
                          target="FakeNvml (entered)", cost=2, timeout=5)

    # ------------------------------------------------------------------ command-line programs
    def cli(self, label, argv, *, valid=False, timeout=90.0, check=None):
        """Run one command-line program in the sandbox; bad arguments must give exit 2 and a
        message, never a traceback."""
        env = {**os.environ, "PYTHONPATH": str(self.repo), "GPU_LESSONS_HEADLESS": "1"}
        started = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, *argv], cwd=self.tmp, env=env,
                                  capture_output=True, text=True, errors="replace",
                                  timeout=timeout, start_new_session=True)
            rc, err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, err = None, (exc.stderr or b"").decode("utf-8", "replace") if isinstance(
                exc.stderr, bytes) else (exc.stderr or "")
        kind, detail = cli_verdict(rc, err, valid)
        if check is not None and kind in PASSED + SOFT:
            verdict = check()
            if verdict:
                kind, detail = verdict
        self.records.append({"target": label, "name": label, "owner": "lead",
                             "input": " ".join(["python", *argv])[:300], "kind": kind,
                             "detail": " ".join(detail.split())[:300],
                             "seconds": round(time.perf_counter() - started, 3)})
        self.reap_children()
        return kind

    def t_cli(self):
        """command-line programs (python -m helpers.fit, scripts/ddp_train.py) with bad
        arguments"""
        if self.only and not {"cli", "fit", "ddp_train"} & set(self.only):
            return
        script = str(self.tiny_script())
        fit = ["-m", "helpers.fit"]
        for args in ([], [script, "--steps", "0"], [script, "--steps", "1e10"],
                     [script, "--steps", str(2**63)], [script, "--gpu", "NoSuchCard"],
                     [script, "--max-batch", "-1"], [script, "--multiple-of", "0"],
                     [script, "--time-limit", "nan"], [script, "--time-limit", "inf"],
                     [script, "--context", "lots"], [script, "--margin", "200%"],
                     [script, "--ddp", str(2**31)], [script, "--max-forwards", "0"],
                     [str(self.special["fifo"])], [str(self.special["dangling_link"])],
                     [str(self.tmp)], ["missing.py"]):
            self.fresh_special()
            self.cli("python -m helpers.fit", fit + args, timeout=20 if any(
                "special" in a for a in args) else 60)
        self.cli("python -m helpers.fit", fit + [script], valid=True, timeout=120)
        ddp = str(self.repo / "scripts" / "ddp_train.py")
        if not Path(ddp).is_file():
            return
        small = ["--epochs", "1", "--samples", "64", "--log-every", "1000"]
        for args in (["--batch-size", "0"], ["--batch-size", "1e10"],
                     ["--batch-size", str(10**10)], ["--epochs", "-1"], ["--lr", "nan"],
                     ["--samples", str(2**31)], ["--classes", "0"], ["--depth", str(2**31)],
                     ["--hidden", "0"], ["--features", "-3"], ["--noise", "inf"],
                     ["--log-every", "0"], ["--amp", "maybe"], ["--stop-after-steps", "-1"]):
            self.cli("scripts/ddp_train.py", [ddp, *small, *args], timeout=60)
        for label in ("fifo", "link_to_fifo", "device_like", "long_name_256"):
            path = guard_path(self.fresh_special()[label], self.sandbox)
            before = file_kind(path)

            def kept(path=path, before=before, label=label):
                if file_kind(path) != before:
                    return ("replaced", f"--checkpoint <{label}> is now a {file_kind(path)}")
                real = os.path.realpath(path)
                if file_kind(real) not in ("fifo", "none"):
                    return ("replaced", f"what <{label}> points to is now a {file_kind(real)}")
                return None

            self.cli("scripts/ddp_train.py", [ddp, *small, "--checkpoint", str(path)],
                     timeout=30, check=kept)
        bad_resume = self.tmp / "no_totals.pt"
        if self.exported("save_checkpoint"):
            with contextlib.suppress(Exception):
                self.h.save_checkpoint(bad_resume, model=self.linear(), epoch=1)
                self.cli("scripts/ddp_train.py", [ddp, *small, "--checkpoint",
                                                  str(bad_resume)], valid=None, timeout=60)

    # ============================================================== the 11 issue cases
    def case_1(self):
        """np.float64 / np.str_ / defaultdict extras: recorded in t_checkpoint already."""
        if not any(r.get("case") == 1 for r in self.records) and self.wanted("save_checkpoint"):
            self.log("  (case 1 ran with the checkpoint targets)")

    def case_2(self):
        """measure_step OOM leak: recorded in _oom_cleanup."""

    def case_3(self):
        h = self.h
        if not self.wanted("MemoryGauge"):
            return
        import psutil

        block, release, hits = threading.Event(), threading.Event(), []
        originals = (psutil.Process.memory_info, psutil.virtual_memory)

        def blocking(fn):
            def wrapper(*args, **kwargs):
                if block.is_set() and threading.current_thread() is not threading.main_thread():
                    hits.append(threading.current_thread().name)
                    release.wait(60)
                return fn(*args, **kwargs)
            return wrapper

        psutil.Process.memory_info = blocking(originals[0])
        psutil.virtual_memory = blocking(originals[1])
        made = []
        try:
            block.set()
            for i in range(3):
                def rerun():
                    made.append(h.MemoryGauge("ram", poll=0.25))
                    time.sleep(0.6)  # the poller is now inside a blocked reading
                    alive = Counter(self.pollers())
                    if alive and max(alive.values()) > 1:
                        raise _Threads(f"poller threads alive: {dict(alive)}")
                    if not hits:
                        return f"{dict(alive)}; NOT EXERCISED: no reading blocked"
                    return f"{dict(alive)}; {len(hits)} reading(s) blocked"

                self.call("MemoryGauge", "widget re-run (polling threads)",
                          f"re-run {i + 1} of MemoryGauge('ram', poll=0.25) while the reading "
                          "blocks in the poller thread", rerun, timeout=30)
        finally:
            release.set()
            block.clear()
            for g in made:
                with contextlib.suppress(Exception):
                    g.stop()
            psutil.Process.memory_info, psutil.virtual_memory = originals
            self.wait_pollers_gone()

        for attempt in range(4):
            def concurrent():
                errors, gauges = [], []
                barrier = threading.Barrier(4)

                def worker():
                    barrier.wait()
                    for _ in range(5):
                        try:
                            gauges.append(h.MemoryGauge(poll=0.25))
                        except Exception as exc:  # noqa: BLE001
                            errors.append(exc)

                threads = [threading.Thread(target=worker) for _ in range(4)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                time.sleep(0.3)
                alive = Counter(self.pollers())
                for g in gauges:
                    with contextlib.suppress(Exception):
                        g.stop()
                self.wait_pollers_gone()
                if errors:
                    raise errors[0]
                if alive and max(alive.values()) > 1:
                    raise _Threads(f"after concurrent creation, poller threads alive: "
                                   f"{dict(alive)}")
                return dict(alive)

            self.call("MemoryGauge", "widget re-run (polling threads)",
                      f"4 threads each create MemoryGauge(poll=0.25) x5 at once "
                      f"(attempt {attempt + 1})", concurrent, timeout=60)

    def case_4(self):
        h = self.h
        if not self.wanted("VirtualGPU"):
            return
        torch = self.torch

        def selfref():
            items = [torch.ones(1)]
            items.append(items)
            return items

        def track():
            with h.VirtualGPU("1 GiB") as gpu:
                return gpu.track(selfref())

        self.call("VirtualGPU", "VirtualGPU.track",
                  "l = [torch.ones(1)]; l.append(l); helpers.VirtualGPU('1GB').track(l)", track,
                  names=("objs", "track", "tensor", "cycle", "itself"))
        self.call("measure_step", "measure_step",
                  "l = [torch.ones(1)]; l.append(l); helpers.measure_step(lambda: None, "
                  "inputs=l)", lambda: h.measure_step(lambda: None, inputs=selfref()),
                  names=("inputs", "cycle", "itself"))

    def case_5(self):
        h = self.h
        if not self.wanted("run_captured"):
            return
        sleeper = [sys.executable, "-c", CHILD_CODE[1]]
        for value in (math.inf, math.nan, 1e300):
            def run(v=value):
                try:
                    return h.run_captured(sleeper, timeout=v)
                finally:
                    time.sleep(0.1)

            def no_child(_):
                left = self.reap_children()
                return ("leak", f"{len(left)} child process(es) left running") if left else None

            self.call("run_captured", "run_captured",
                      f"helpers.run_captured([python, '-c', 'sleep 2'], timeout={value!r})", run,
                      names=("timeout",), documented=(TimeoutError,), timeout=20,
                      check=no_child)
            left = self.reap_children()
            if left and self.records[-1]["kind"] in PASSED + SOFT:
                self.records[-1]["kind"] = "leak"
            elif left:
                self.records[-1]["detail"] += f" (and {len(left)} child process(es) left running)"

    def case_6(self):
        """load_checkpoint on bad files: recorded in _bad_files."""

    def case_7(self):
        h = self.h
        if not self.wanted("full_scale"):
            return
        torch = self.torch
        self.call("full_scale", "VirtualGPU nesting/re-entry",
                  "helpers.full_scale().__exit__(None, None, None)  (exit without enter)",
                  lambda: h.full_scale().__exit__(None, None, None),
                  documented=(RuntimeError,))

        def later():
            with h.full_scale():
                return torch.nn.Linear(4, 4).to("cpu")

        self.call("full_scale", "VirtualGPU nesting/re-entry",
                  "then: with helpers.full_scale(): torch.nn.Linear(4, 4).to('cpu')", later)

    def case_8(self):
        h = self.h
        if not self.wanted("save_checkpoint"):
            return
        path = self.tmp / "cyclic.pt"
        model = self.linear()
        h.save_checkpoint(path, model=model, epoch=1)
        cyclic = {"a": []}
        cyclic["a"].append(cyclic)
        deep: dict = {}
        node = deep
        for _ in range(5000):
            node["x"] = {}
            node = node["x"]
        for label, extra in (("d = {'a': []}; d['a'].append(d)", cyclic),
                             ("a dict nested 5000 deep", deep)):
            self.call("save_checkpoint", "save_checkpoint",
                      f"helpers.save_checkpoint(p, model=Linear(3, 2), epoch=1, extra={label})",
                      lambda e=extra: h.save_checkpoint(path, model=model, epoch=1, extra=e),
                      names=("extra",), check=self.loadable(path, model), valid=False)

    def case_9(self):
        h = self.h
        if not any(self.wanted(n) for n in ("StepTimer", "compare_times", "check_training")):
            return
        torch = self.torch
        if torch.cuda.is_available():
            self.log("  (case 9 needs a machine without CUDA)")
            return
        if self.wanted("StepTimer"):
            for sync in ("cuda:x", "cuda"):
                def timer(s=sync):
                    t = h.StepTimer(sync=s, show=False)
                    t.step()
                    t.step()
                    t.close()

                self.call("StepTimer", "StepTimer", f"StepTimer(sync={sync!r}).step()", timer,
                          names=("sync",), valid=False)
        if self.wanted("compare_times"):
            self.call("compare_times", "compare_times",
                      "helpers.compare_times({'a': f}, sync='cuda')  (no CUDA here)",
                      lambda: h.compare_times({"a": lambda: None}, rounds=1, sync="cuda"),
                      names=("sync",), valid=False)
        if self.wanted("check_training"):
            tiny, make_step = _tiny(torch)
            self.call("check_training", "check_training",
                      "helpers.check_training(make_step, batch_size=4, model=Tiny, "
                      "small_steps=1, device='cuda')  (no CUDA here)",
                      lambda: h.check_training(make_step, batch_size=4, model=tiny,
                                               small_steps=1, device="cuda"),
                      names=("device",), valid=False, timeout=60)

    def case_10(self):
        h = self.h
        if not self.wanted("find_batch_size"):
            return
        torch = self.torch
        for value in ("adam", 5):
            def find(v=value):
                with h.VirtualGPU("64 MiB"):
                    return h.find_batch_size(
                        lambda b: torch.empty(b * 4096, dtype=torch.uint8), optimizer=v,
                        maximum=64)

            self.call("find_batch_size", "find_batch_size",
                      f"helpers.find_batch_size(step, optimizer={value!r}, maximum=64)", find,
                      names=("optimizer",), valid=False, timeout=20)

    def case_11(self):
        h = self.h
        for fn in ("fmt_bytes", "fmt_mib", "fmt_gib", "fmt_seconds", "fmt_rate", "fmt_ratio"):
            self.once(fn, fn, f"helpers.{fn}(10**400)", lambda f=fn: getattr(h, f)(10**400),
                      names=("n_bytes", "seconds", "per_second", "ratio"))
        self.once("fmt_seconds", "fmt_seconds", "helpers.fmt_seconds(float('inf'))",
                  lambda: h.fmt_seconds(math.inf), names=("seconds",))
        self.once("VirtualGPU", "VirtualGPU", "helpers.VirtualGPU(10**400)",
                  lambda: h.VirtualGPU(10**400), names=("capacity",))
        if self.wanted("LivePlot"):
            def liveplot():
                p = h.LivePlot(gauge=False, show=False)
                p.step(loss=1.0, samples=10**400)
                p.step(loss=1.0, samples=10**400)
                self.show(p.summary())
                p.close()

            self.call("LivePlot", "LivePlot.step",
                      "p = LivePlot(gauge=False); p.step(loss=1.0, samples=10**400) x2; "
                      "p.summary()", liveplot, names=("samples",))
        if self.wanted("MemoryGauge"):
            def slow_poll():
                try:
                    g = h.MemoryGauge(poll=1e300)
                except (ValueError, TypeError):
                    raise
                time.sleep(0.6)
                polling = g.polling
                g.stop()
                if not polling:
                    raise _Dead("the gauge's poller thread died (it stopped updating)")
                return "still polling"

            self.call("MemoryGauge", "MemoryGauge", "helpers.MemoryGauge(poll=1e300) + 0.6 s",
                      slow_poll, names=("poll",), timeout=15)
        self._no_psutil()
        if self.wanted("parse_capacity"):
            self.call("parse_capacity", "parse_capacity", "helpers.parse_capacity(-10**5000)",
                      lambda: h.parse_capacity(-10**5000), names=("capacity", "value"),
                      valid=False)
        if self.wanted("measure_step"):
            self.call("measure_step", "measure_step",
                      "helpers.measure_step(lambda: None, steps=10**400)",
                      lambda: h.measure_step(lambda: None, steps=10**400), names=("steps",),
                      valid=False)

    def _no_psutil(self):
        if not self.wanted("read_memory"):
            return
        repo = str(Path(self.h.__file__).resolve().parents[1])
        code = _NO_PSUTIL.replace("REPO", repr(repo))
        try:
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  timeout=180)
            rows = json.loads(proc.stdout.strip().splitlines()[-1])
        except Exception as exc:  # noqa: BLE001
            rows = [["[psutil missing] child", "escape:" + type(exc).__name__, message(exc)]]
        for label, kind, detail in rows:
            name = label.split("helpers.", 1)[-1].split("(", 1)[0] if "helpers." in label else (
                "read_memory")
            self.records.append({"target": "R2: psutil missing", "name": name,
                                 "owner": self.owner(name), "input": label, "kind": kind,
                                 "detail": detail[:300], "seconds": 0.0, "case": 11})


_NO_PSUTIL = r"""
import json, sys, time
sys.path.insert(0, REPO)
sys.modules["psutil"] = None
import helpers
rows = []
def run(label, fn):
    try:
        fn()
        rows.append([label, "accepted", "ok"])
    except BaseException as exc:
        kind = ("rejected" if isinstance(exc, (ValueError, TypeError))
                else "escape:" + type(exc).__name__)
        rows.append([label, kind, type(exc).__name__ + ": " + str(exc)])
def gauge():
    g = helpers.MemoryGauge(poll=0.25); time.sleep(0.6); g.text(); g.stop()
def watch():
    w = helpers.watch_gpus(0.25); time.sleep(0.6); w.text(); w.stop()
def plot():
    p = helpers.LivePlot(show=True)
    for i in range(5):
        p.step(loss=1.0 / (i + 1), samples=4)
    p.close()
import io, contextlib
with contextlib.redirect_stdout(io.StringIO()):
    run("[psutil missing] helpers.read_memory()", lambda: helpers.read_memory().text())
    run("[psutil missing] helpers.read_memory('ram')", lambda: helpers.read_memory("ram").text())
    run("[psutil missing] helpers.MemoryGauge(poll=0.25) + 0.6 s", gauge)
    run("[psutil missing] helpers.watch_gpus(0.25) + 0.6 s", watch)
    run("[psutil missing] helpers.LivePlot(show=True) 5 steps, close()", plot)
print(json.dumps(rows))
"""


class _StepError(Exception):
    """Raised on purpose by a step: the finder must re-raise it."""


class _FakeVGPU:
    def __init__(self, capacity, allocated, reserved, context):
        self.capacity_bytes, self.allocated_bytes = capacity, allocated
        self.reserved_bytes, self.context_bytes = reserved, context
        self.name = "fake"


def _validity(kind, value):
    try:
        return kind.valid(value)
    except Exception:  # noqa: BLE001 - an odd value the rule did not foresee: unknown
        return None


def _in(value, few) -> bool:
    for f in few:
        if type(value) is type(f) and (value == f or (value != value and f != f)):
            return True
    return type(value) is object and any(type(f) is object for f in few)


def _capacity_valid(v):
    if _is_bool(v):
        return False
    if isinstance(v, numbers.Integral):
        return v > 0 if v <= LARGEST else None
    if isinstance(v, str):
        return None
    if isinstance(v, numbers.Real):
        return None
    return False


def _trackable(torch):
    def valid(v):
        if isinstance(v, (torch.Tensor, torch.nn.Module)):
            return True
        if isinstance(v, (list, tuple, dict)):
            return None
        return None if v is None else False
    return valid


def _enter(ctx):
    with ctx:
        return "entered"


def _amp_use(settings):
    settings.autocast()
    settings.grad_scaler()
    return settings


def _table(obj):
    if obj is None:
        return None
    table = getattr(obj, "table", None)
    return table() if callable(table) else obj


def _append_and_show(fuzzer, table):
    table.rows.append([1, 2])
    return fuzzer.show(table)


class _BadStr(Exception):
    def __str__(self):
        raise RuntimeError("broken __str__")


def _learner_tests():
    def assert_fail():
        raise AssertionError("wrong")

    def bad_str():
        raise _BadStr()

    def exits():
        raise SystemExit(3)

    def value_error():
        raise ValueError("learner's bug")

    return [("<test raising AssertionError>", assert_fail),
            ("<test raising an exception whose __str__ raises>", bad_str),
            ("lambda: (_ for _ in ()).throw(SystemExit(3))", exits),
            ("<test raising ValueError>", value_error)]


def _finder_steps(torch):
    def linear(b):
        return torch.empty(int(b) * 4096, dtype=torch.uint8).sum()

    def always_oom(b):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    def value_error(b):
        raise _StepError("the step's own bug")

    def odd(b):
        if b % 2:
            raise torch.OutOfMemoryError("odd sizes OOM")
        return linear(b)

    def flaky(b, _n=[0]):  # noqa: B006 - a counter on purpose
        _n[0] += 1
        if _n[0] % 3 == 0:
            raise torch.OutOfMemoryError("flaky")
        return linear(b)

    def wrong_signature():
        return None

    return [("linear 4 KiB/sample", linear), ("always OOMs", always_oom),
            ("raises its own error", value_error), ("odd sizes OOM", odd), ("flaky", flaky),
            ("takes no argument", wrong_signature)]


def _tiny(torch):
    class Tiny(torch.nn.Module):
        def __init__(self, width=8, n_classes=10):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, width, 3, stride=4)
            self.fc = torch.nn.Linear(width, n_classes)

        def forward(self, x):
            return self.fc(self.conv(x).mean((2, 3)))

    def make_step(model, optimizer):
        def step(data, labels):
            loss = torch.nn.functional.cross_entropy(model(data), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss
        return step

    return Tiny, make_step


def _make_steps(torch, tiny):
    def returning(value):
        def make(model, optimizer):
            def step(data, labels):
                loss = torch.nn.functional.cross_entropy(model(data), labels)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                return value(loss)
            return step
        return make

    def one_arg(model, optimizer):
        return lambda x: 1.0

    return [("step returns 10**400", returning(lambda loss: 10**400)),
            ("step returns 'abc'", returning(lambda loss: "abc")),
            ("step returns [loss, loss]", returning(lambda loss: [loss, loss])),
            ("step returns a 2-element tensor", returning(lambda loss: loss.repeat(2))),
            ("step returns None", returning(lambda loss: None)),
            ("step takes 1 arg", one_arg), ("make_step is a model class", tiny),
            ("make_step returns None", lambda model, optimizer: None)]


# --------------------------------------------------------------------------- reporting
def summarize(records: list[dict]) -> dict:
    kinds = Counter(r["kind"] for r in records)
    hard = {k: n for k, n in kinds.items() if is_hard(k)}
    soft = {k: n for k, n in kinds.items() if k in SOFT}
    by_target: dict[str, dict] = {}
    for r in records:
        t = by_target.setdefault(r["target"], {"owner": r["owner"], "inputs": 0, "failures": 0,
                                               "by_kind": Counter()})
        t["inputs"] += 1
        if r["kind"] not in PASSED:
            t["failures"] += 1
            t["by_kind"][r["kind"]] += 1
    distinct: dict[tuple, dict] = {}
    for r in records:
        if r["kind"] in PASSED:
            continue
        key = (r["target"], r["kind"], r["detail"].split(":", 1)[0])
        best = distinct.get(key)
        if best is None or len(r["input"]) < len(best["input"]):
            distinct[key] = r
    return {
        "inputs": len(records),
        "passed": sum(kinds[k] for k in PASSED),
        "accepted": kinds["accepted"], "rejected": kinds["rejected"],
        "documented": kinds["documented"],
        "hard": sum(hard.values()), "soft": sum(soft.values()),
        "hard_by_kind": dict(sorted(hard.items())), "soft_by_kind": dict(sorted(soft.items())),
        "by_target": {k: {**v, "by_kind": dict(v["by_kind"])} for k, v in by_target.items()},
        "distinct_failures": sorted(
            ({k: r[k] for k in ("target", "name", "owner", "kind", "input", "detail", "case")
              if k in r} for r in distinct.values()),
            key=lambda r: (not is_hard(r["kind"]), r["owner"], r["target"], r["kind"])),
    }


def case_results(records: list[dict]) -> dict:
    results = {}
    for n, title in CASES.items():
        rows = [r for r in records if r.get("case") == n]
        failed = [r for r in rows if r["kind"] not in PASSED]
        results[str(n)] = {
            "title": title, "calls": len(rows),
            "result": "N/A" if not rows else ("FAIL" if failed else "PASS"),
            "failures": [f"{r['kind']}: {r['input']} -> {r['detail'][:160]}" for r in failed],
        }
    return results


def table_text(result: dict, before: dict | None = None) -> str:
    s = result["summary"]
    b = before["summary"] if before else None
    lines = []

    def row(label, key, sub=None):
        now = (s[key] if sub is None else s[key].get(sub, 0))
        if b is None:
            lines.append(f"  {label:<38}{now:>8,}")
        else:
            old = (b[key] if sub is None else b[key].get(sub, 0))
            lines.append(f"  {label:<38}{old:>8,}{now:>8,}")

    head = f"  {'':<38}{'count':>8}" if b is None else f"  {'':<38}{'before':>8}{'after':>8}"
    lines += [f"fuzz of helpers at {result['repo']} ({result.get('commit', '?')}): "
              f"{result['seconds']:.0f} s, --examples {result['examples']}", head]
    row("inputs tried", "inputs")
    row("passed", "passed")
    row("  accepted a valid input", "accepted")
    row("  rejected clearly (Value/TypeError)", "rejected")
    row("  documented error", "documented")
    row("hard failures", "hard")
    kinds = sorted(set(s["hard_by_kind"]) | set(b["hard_by_kind"] if b else ()),
                   key=lambda k: (k.startswith("escape:"), k))
    for k in kinds:
        row(f"  {k}", "hard_by_kind", k)
    row("soft failures", "soft")
    for k in SOFT:
        row(f"  {k}", "soft_by_kind", k)
    lines.append("numbered fuzz cases (bad input and lost data):")
    for n, c in result["cases"].items():
        old = f"{before['cases'][n]['result']:>5} -> " if before else ""
        lines.append(f"  {n:>2}. {old}{c['result']:<5} {c['title'][:78]}")
        for f in c["failures"][:3]:
            lines.append(f"        {f[:110]}")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Fuzz the public API of helpers and classify each call as the fuzz "
                    "review does (hard/soft failures, the 11 numbered fuzz cases).")
    parser.add_argument("--repo", default=str(Path(__file__).resolve().parents[2]),
                        help="checkout whose helpers package is imported (default: this one)")
    parser.add_argument("--examples", type=int, default=12,
                        help="hypothesis draws per cheap parameter (slow ones get fewer); "
                             "default 12: about 4,000 inputs in 4-7 minutes on 2 busy cores")
    parser.add_argument("--out", help="write the results (every call) as JSON here")
    parser.add_argument("--only", default="",
                        help="comma-separated public names to fuzz (default: all; 'cli' for "
                             "the command-line programs); the cases run only for these names")
    parser.add_argument("--no-cases", action="store_true", help="skip the 11 issue cases")
    parser.add_argument("--before", help="a results JSON of an earlier run to compare with")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--trace", action="store_true", help="log every input before its call")
    parser.add_argument("--sandbox", help="an empty folder to run in (default: a new temporary "
                        "folder, removed at the end); every file a call writes lands there")
    parser.add_argument("--memory-gib", type=float, default=12,
                        help="address-space limit of the harness and its children (12)")
    parser.add_argument("--file-mib", type=int, default=512,
                        help="largest file the harness and its children may write (512)")
    parser.add_argument("--no-state-check", action="store_true",
                        help="do not compare the state before and after a refused call")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    repo = Path(args.repo).resolve()
    if not (repo / "helpers" / "__init__.py").is_file():
        print(f"error: {repo} has no helpers package", file=sys.stderr)
        return 2
    out = Path(args.out).resolve() if args.out else None
    before = json.loads(Path(args.before).read_text()) if args.before else None
    made_sandbox = not args.sandbox
    sandbox = Path(args.sandbox or tempfile.mkdtemp(prefix="fuzz_api_")).resolve()
    if args.sandbox and (not sandbox.is_dir() or any(sandbox.iterdir())):
        print(f"error: --sandbox must name an empty folder: {sandbox}", file=sys.stderr)
        return 2
    # the sandbox, before anything is imported: temporary files, HOME (Keras, matplotlib),
    # hypothesis's folder and the working folder all inside it; then the limits (children
    # inherit them)
    for sub in ("tmp", "home", "harness"):
        (sandbox / sub).mkdir()
    os.environ.update(TMPDIR=str(sandbox / "tmp"), HOME=str(sandbox / "home"),
                      MPLCONFIGDIR=str(sandbox / "home" / "mpl"),
                      KERAS_HOME=str(sandbox / "home" / "keras"),
                      HYPOTHESIS_STORAGE_DIRECTORY=str(sandbox / "home" / "hypothesis"))
    tempfile.tempdir = str(sandbox / "tmp")
    # hypothesis's Unicode tables take seconds to build: copied (only read) from a cache here
    for cache in (Path.cwd() / ".hypothesis" / "unicode_data",
                  repo / ".hypothesis" / "unicode_data"):
        if cache.is_dir():
            with contextlib.suppress(OSError):
                shutil.copytree(cache, sandbox / "home" / "hypothesis" / "unicode_data")
            break
    home = os.getcwd()
    os.chdir(sandbox / "harness")  # whatever a fuzzed call writes lands in the sandbox
    try:
        return _run(args, repo, sandbox, out, before)
    finally:
        os.chdir(home)
        if made_sandbox:
            shutil.rmtree(sandbox, ignore_errors=True)


def _run(args, repo: Path, sandbox: Path, out, before) -> int:
    import resource

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        os.environ[var] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("GPU_LESSONS_HEADLESS", "1")
    with contextlib.suppress(OSError):
        os.nice(19)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000))
    applied = apply_limits(sandbox_limits(user_tasks(), memory_gib=args.memory_gib,
                                          file_mib=args.file_mib))
    limits = {n: applied.get(getattr(resource, n)) for n in ("RLIMIT_NPROC", "RLIMIT_AS",
                                                             "RLIMIT_FSIZE")}
    log = (lambda text: None) if args.quiet else (
        lambda text: print(text, file=sys.__stderr__, flush=True))
    log(f"sandbox {sandbox}; limits: {limits}")
    sys.path.insert(0, str(repo))
    for name in [m for m in sys.modules if m == "helpers" or m.startswith("helpers.")]:
        del sys.modules[name]
    import helpers

    if not Path(helpers.__file__).resolve().is_relative_to(repo):
        print(f"error: imported {helpers.__file__}, not {repo}", file=sys.stderr)
        return 2
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    started = time.perf_counter()
    fuzzer = Fuzzer(helpers, examples=args.examples, only=only, log=log, trace=args.trace,
                    sandbox=sandbox, repo=repo, check_state=not args.no_state_check)
    fuzzer.run(cases=not args.no_cases)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    result = {"repo": str(repo), "commit": commit, "examples": args.examples, "only": only,
              "seconds": round(time.perf_counter() - started, 1),
              "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "sandbox": str(sandbox), "limits": limits,
              "summary": summarize(fuzzer.records), "cases": case_results(fuzzer.records),
              "harness_errors": fuzzer.harness_errors,
              "records": fuzzer.records}
    print(table_text(result, before))
    if fuzzer.harness_errors:
        print(f"{len(fuzzer.harness_errors)} harness error(s): see harness_errors in the JSON")
    if out:
        out.write_text(json.dumps(result, indent=1, default=str))
    fuzzer.reap_children()
    return 0


if __name__ == "__main__":
    sys.exit(main())
