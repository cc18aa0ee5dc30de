"""Rehearse a SLURM batch script on a machine without SLURM or a GPU (lesson 04).

:func:`rehearse_batch_job` runs the text of an sbatch script with ``bash`` in a new temporary
folder, as SLURM would run it on a compute node: ``#SBATCH`` lines are comments to bash,
``SLURM_JOB_ID`` is set, and stand-ins answer for the two commands a machine like this one
lacks:

* ``nvidia-smi``: a stand-in GPU (an L40S's total memory) that answers ``--query-gpu=...``
  with ``--format=csv[,noheader][,nounits]``, once or every ``-l SECONDS`` (``--loop=``,
  ``-lms``/``--loop-ms=``), to standard output or ``-f FILE``. Its loop runs ``speedup``
  times faster than the real one, so that ``-l 5`` logs several rows while a short rehearsal
  trains. It rejects unknown fields and a missing ``--format`` as the real one does (exit
  code 2). Anything else (``nvidia-smi`` alone, ``topo -m``) says it is a stand-in and fails;
* ``srun``: runs its command in the foreground (one task, as ``srun`` does inside a
  one-node allocation), and returns its exit code;
* ``python``: this Python, whatever the machine's ``PATH`` holds.

It reports the script's exit code, what it printed, the files it left in its folder, and the
``nvidia-smi`` stand-ins still running when the script ended (then stops them): on a real
node SLURM would kill those at the end of the job, but the last rows of their log may be
cut off, and the same script run outside SLURM leaves them running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .checks import real_number, text, whole_number

__all__ = ["BatchJobResult", "rehearse_batch_job", "STANDIN_FIELDS"]

#: the fields the ``nvidia-smi`` stand-in answers, with the unit its header shows and a value
STANDIN_FIELDS = {
    "timestamp": ("", "2026/01/01 00:00:00.000"),
    "index": ("", "0"),
    "name": ("", "NVIDIA L40S (stand-in)"),
    "uuid": ("", "GPU-00000000-0000-0000-0000-000000000000"),
    "utilization.gpu": ("%", "97"),
    "utilization.memory": ("%", "41"),
    "memory.total": ("MiB", "46068"),
    "memory.used": ("MiB", "31012"),
    "memory.free": ("MiB", "15056"),
    "temperature.gpu": ("", "64"),
    "power.draw": ("W", "287.40"),
    "clocks.sm": ("MHz", "2490"),
    "pstate": ("", "P0"),
}

_SMI = r'''
import os, signal, sys, time
FIELDS = __FIELDS__
SPEEDUP = __SPEEDUP__
def fail(message, code=2):
    print(message, file=sys.stderr)
    sys.exit(code)
args = sys.argv[1:]
query = fmt = None
loop = None
out = sys.stdout
i = 0
while i < len(args):
    arg = args[i]
    value = None
    if "=" in arg and arg.startswith("--"):
        arg, value = arg.split("=", 1)
    elif arg in ("-l", "-lms", "-f") and i + 1 < len(args):
        i += 1
        value = args[i]
    if arg == "--query-gpu":
        query = value
    elif arg == "--format":
        fmt = value
    elif arg in ("-l", "--loop"):
        loop = float(value)
    elif arg in ("-lms", "--loop-ms"):
        loop = float(value) / 1000
    elif arg in ("-f", "--filename"):
        out = open(value, "w")
    else:
        fail(f"nvidia-smi stand-in: {args[i]!r} is not rehearsed here (only --query-gpu=..."
             " --format=csv [-l SECONDS] [-f FILE]); on a GPU node the real nvidia-smi runs")
    i += 1
if query is None:
    fail("nvidia-smi stand-in: only --query-gpu=... is rehearsed here")
if fmt is None:
    fail('Missing --format argument. Try "nvidia-smi --help" for more information.')
options = fmt.split(",")
if options[0] != "csv" or not set(options[1:]) <= {"noheader", "nounits"}:
    fail(f'"{fmt}" is not a valid format: use csv, optionally with noheader, nounits.')
names = [name.strip() for name in query.split(",")]
for name in names:
    if name not in FIELDS:
        fail(f'Field "{name}" is not a valid field to query.')
units = "nounits" not in options
if "noheader" not in options:
    print(", ".join(f"{n} [{FIELDS[n][0]}]" if FIELDS[n][0] and units else n for n in names),
          file=out, flush=True)
pids = os.environ.get("REHEARSAL_SMI_PIDS")
if pids and loop:
    with open(pids, "a") as f:
        f.write(f"{os.getpid()}\n")
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
while True:
    row = [FIELDS[n][1] + (f" {FIELDS[n][0]}" if FIELDS[n][0] and units else "")
           for n in names]
    print(", ".join(row), file=out, flush=True)
    if not loop:
        break
    time.sleep(loop / SPEEDUP)
'''

_SRUN = r'''
import subprocess, sys
if len(sys.argv) < 2:
    sys.exit("srun stand-in: give the command to run, e.g. srun python train.py")
sys.exit(subprocess.run(sys.argv[1:]).returncode)
'''


@dataclass(frozen=True)
class BatchJobResult:
    """What a rehearsed batch script did."""

    returncode: int
    output: str  # standard output and error, interleaved
    # name -> contents of the folder's new files: text, or bytes for a file that is not UTF-8
    files: dict[str, str | bytes] = field(default_factory=dict)
    left_running: int = 0  # nvidia-smi stand-ins still running when the script ended

    def __repr__(self) -> str:
        return (f"BatchJobResult(returncode={self.returncode}, files={sorted(self.files)}, "
                f"left_running={self.left_running})")


def _executable(path: Path, body: str) -> None:
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        try:  # no /proc (macOS): ask the kernel
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    return state not in ("Z", "X")


def _still_running(pids: list[int], grace: float = 1.0) -> list[int]:
    """The processes of ``pids`` still running after up to ``grace`` seconds: a logger the
    script stopped with ``kill`` may take a moment to end."""
    deadline = time.monotonic() + grace
    while True:
        running = [p for p in pids if _alive(p)]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(0.02)


def _end_job(proc: subprocess.Popen, grace: float = 1.0) -> None:
    """Stop every process of the job's process group (the script, its background jobs, its
    loggers): SIGTERM, then SIGKILL to what is left after ``grace`` seconds; reap the script."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break  # nothing of the job is left
        if sig == signal.SIGTERM:
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and _group_alive(proc.pid):
                proc.poll()  # reap the script itself once it ends
                time.sleep(0.02)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:  # cannot happen after SIGKILL; never wait forever
        pass


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is running (zombies do not count where /proc
    says so)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                return True
    return False


def _contents(path: Path) -> str | bytes:
    """A file the job wrote: its text when it is UTF-8, else its bytes (a binary file, such as
    a checkpoint, must not come back as mangled text)."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def rehearse_batch_job(script: str, files: Mapping[str, str] | None = None, *,
                       job_id: int = 4242, speedup: float = 50.0,
                       timeout: float = 60.0) -> BatchJobResult:
    """Run the sbatch script ``script`` (its text) with bash, with the stand-ins above.

    Args:
        script: the batch script's text; it must start with a ``#!`` line (sbatch refuses
            scripts without one).
        files: name -> text of files to put in the job's folder first (e.g. ``train.py``);
            plain names only, no folders.
        job_id: what ``SLURM_JOB_ID`` is set to.
        speedup: how many times faster than real time the ``nvidia-smi`` loop runs (1 to
            10,000).
        timeout: seconds the script may run (0.1 to 3,600); then it is stopped and
            TimeoutError raised.

    However it ends (normally, with an error, on the timeout or on Ctrl-C), every process
    the job started in its process group is stopped, as SLURM ends a job's processes.
    """
    script = text(script, "script", longest=100_000)
    if not script.startswith("#!"):
        raise ValueError("script must start with a #! line such as #!/bin/bash: sbatch "
                         f"refuses scripts without one, got {script[:40]!r}")
    files = {} if files is None else files
    if not isinstance(files, Mapping):
        raise TypeError(f"files must be a mapping of name -> text, got {type(files).__name__}")
    for name, body in files.items():
        text(name, "files' names", longest=200)
        if "/" in name or name in (".", "..", "job.sh"):
            raise ValueError(f"files' names must be plain file names (not job.sh), got {name!r}")
        text(body, f"files[{name!r}]", empty=True, longest=1_000_000)
    job_id = whole_number(job_id, "job_id", 1)
    speedup = real_number(speedup, "speedup", 1, 10_000)
    timeout = real_number(timeout, "timeout", 0.1, 3600)
    with tempfile.TemporaryDirectory(prefix="rehearse-job-") as tmp:
        folder, tools = Path(tmp) / "job", Path(tmp) / "bin"
        folder.mkdir()
        tools.mkdir()
        smi = _SMI.replace("__FIELDS__", repr(STANDIN_FIELDS))
        _executable(tools / "nvidia-smi", smi.replace("__SPEEDUP__", repr(float(speedup))))
        _executable(tools / "srun", _SRUN)
        python = tools / "python"  # the job's python: this one (a node may have none)
        python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        python.chmod(0o755)
        for name, body in files.items():
            (folder / name).write_text(body)
        (folder / "job.sh").write_text(script)
        pids = Path(tmp) / "smi-pids"
        env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}",
               "SLURM_JOB_ID": str(job_id), "SLURM_JOB_NAME": "rehearsal",
               "SLURM_SUBMIT_DIR": str(folder), "REHEARSAL_SMI_PIDS": str(pids)}
        log = Path(tmp) / "output"
        with open(log, "w") as sink:  # a file, not a pipe: a logger left running must not
            proc = subprocess.Popen(  # hold the wait open
                ["bash", "job.sh"], cwd=folder, env=env, stdout=sink, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
        running: list[int] = []
        try:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"the batch script ran longer than timeout={timeout:g} s "
                                   "and was stopped") from None
            running = [int(p) for p in pids.read_text().split()] if pids.exists() else []
            running = _still_running(running)
            for pid in running:
                os.kill(pid, signal.SIGTERM)
        finally:  # every exit (normal, error, timeout, Ctrl-C): SLURM ends the whole job
            _end_job(proc)
        found: dict[str, str | bytes] = {}
        for path in sorted(folder.iterdir()):
            if path.is_file() and path.name != "job.sh" and path.name not in files:
                found[path.name] = _contents(path)
        output = log.read_text(errors="replace")
    return BatchJobResult(proc.returncode, output, found, len(running))
