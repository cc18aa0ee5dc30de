"""Launch distributed training and capture what it prints (lesson 03, ``make stress``).

* :func:`ddp_plan` decides how many processes to start here: one per GPU, or two CPU
  processes over gloo when there is no GPU.
* :func:`torchrun_command` builds the command line, for one node (``--standalone``) or for
  several nodes with c10d rendezvous, exactly as ``scripts/slurm_ddp.sbatch`` writes it.
* :func:`run_captured` runs a command and returns its output: under nbval (and ``make
  outputs``) a child process's output never reaches the notebook unless it is captured.
* :func:`run_command` runs one command line as a terminal would (lesson 03 launches the
  learner's own ``torchrun`` command with it), forgiving gloo's abort at exit on the CPU.
* :func:`tf_config` builds the ``TF_CONFIG`` of a MultiWorkerMirroredStrategy worker.

Imports neither torch nor TensorFlow (``ddp_plan()`` asks torch for the GPU count on use).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .core.checks import LARGEST, choice, positive_int, real_number, shown, text, whole_number
from .core.fmt import ShownAsTable

__all__ = ["SCRIPTS", "DDPPlan", "RunResult", "command_text", "ddp_plan", "free_port",
           "run_captured", "run_command", "script_path", "tf_config", "torchrun_command"]

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
_ENDPOINT = re.compile(r"^\[?([A-Za-z0-9_.:-]+?)\]?:(\d{1,5})$")

_LONGEST_RUN = 7 * 24 * 3600.0  # run_captured's largest timeout: a week, in seconds


def _endpoint(value, name: str, example: str) -> str:
    """``value`` if it is a ``host:port`` string with a port from 1 to 65535."""
    match = _ENDPOINT.match(text(value, name, longest=300))
    if not match or not 1 <= int(match.group(2)) <= 65535:
        raise ValueError(f"{name} must look like {example!r} (host:port), got {value!r}")
    return value


@dataclass(frozen=True, repr=False)
class DDPPlan(ShownAsTable):
    """How many processes to start on this machine, on which device, over which backend."""

    nproc_per_node: int
    device: str  # "cuda" or "cpu"
    backend: str  # "nccl" or "gloo"

    def text(self) -> str:
        if self.device == "cuda":
            return (f"{self.nproc_per_node} process(es), one per GPU, on cuda over "
                    f"{self.backend}")
        return (f"{self.nproc_per_node} processes on the CPU over {self.backend} "
                f"(no GPU here; on a GPU node: one process per GPU over nccl)")


def ddp_plan(n_gpus: int | None = None, *, cpu_processes: int = 2) -> DDPPlan:
    """One process per GPU over NCCL, or ``cpu_processes`` CPU processes over gloo.

    Args:
        n_gpus: GPUs to use; ``None`` (default) asks ``torch.cuda.device_count()``.
        cpu_processes: processes to start when there is no GPU (default 2).
    """
    if n_gpus is None:
        import torch

        n_gpus = torch.cuda.device_count()
    n_gpus = whole_number(n_gpus, "n_gpus", 0, 4096)
    cpu_processes = positive_int(cpu_processes, "cpu_processes", 4096)
    if n_gpus > 0:
        return DDPPlan(n_gpus, "cuda", "nccl")
    return DDPPlan(cpu_processes, "cpu", "gloo")


def _check_args(args, name: str) -> list[str]:
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise TypeError(f"{name} must be a list of strings, got {type(args).__name__}")
    for a in args:
        if isinstance(a, bool) or not isinstance(a, (str, int, float)):
            raise TypeError(f"{name} must hold strings (or numbers), got {shown(a)}")
        if isinstance(a, int) and abs(a) > LARGEST:
            raise ValueError(f"{name} holds an integer too large for a command: {shown(a)}")
        if isinstance(a, str) and "\0" in a:
            raise ValueError(f"{name} holds a string with a NUL character: {shown(a)}")
    return [str(a) for a in args]


def torchrun_command(
    script,
    script_args: Sequence = (),
    *,
    nproc_per_node: int,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | int | None = None,
    rdzv_backend: str = "c10d",
) -> list[str]:
    """The ``torchrun`` command line that starts ``script`` (lesson 03, SLURM script).

    One node without an endpoint gives ``torchrun --standalone --nproc_per_node=N ...``;
    several nodes need ``rdzv_endpoint`` (``host:port`` of the first node) and ``rdzv_id``
    (any id shared by all nodes of the job, e.g. the SLURM job id).

    Returns:
        The command as a list of strings, starting with ``"torchrun"``.
    """
    if not isinstance(script, (str, os.PathLike)):
        raise TypeError(f"script must be the path of a .py file, got {type(script).__name__}")
    if not text(os.fspath(script), "script", longest=4096).endswith(".py"):
        raise ValueError(f"script must be the path of a .py file, got {script!r}")
    args = _check_args(script_args, "script_args")
    positive_int(nproc_per_node, "nproc_per_node", 4096)
    positive_int(nnodes, "nnodes", 4096)
    choice(rdzv_backend, "rdzv_backend", ("c10d", "static", "etcd", "etcd-v2"))
    if rdzv_endpoint is None:
        if nnodes > 1:
            raise ValueError(
                f"nnodes={nnodes} needs rdzv_endpoint='host:port' (the first node) and an "
                "rdzv_id shared by every node"
            )
        return ["torchrun", "--standalone", f"--nproc_per_node={nproc_per_node}",
                str(script), *args]
    _endpoint(rdzv_endpoint, "rdzv_endpoint", "node001:29500")
    if rdzv_id is None:
        raise ValueError("rdzv_id is required with rdzv_endpoint: a job-wide id such as "
                         "the SLURM job id")
    if not isinstance(rdzv_id, str):
        whole_number(rdzv_id, "rdzv_id")
    elif not re.fullmatch(r"[\w.-]{1,200}", rdzv_id):
        raise ValueError(f"rdzv_id must be letters, digits, '.', '-' or '_' (such as the "
                         f"SLURM job id), got {rdzv_id!r}")
    return [
        "torchrun", f"--nnodes={nnodes}", f"--nproc_per_node={nproc_per_node}",
        f"--rdzv_id={rdzv_id}", f"--rdzv_backend={rdzv_backend}",
        f"--rdzv_endpoint={rdzv_endpoint}", str(script), *args,
    ]


def command_text(command: Sequence[str]) -> str:
    """A command list as one shell-quoted line, for printing."""
    return shlex.join(_check_args(command, "command"))


def script_path(name: str) -> str:
    """The path of ``scripts/<name>`` relative to the working folder (no absolute paths).

    Lessons run with the notebook's folder as working folder, so this is usually
    ``../scripts/<name>``.
    """
    if "/" in text(name, "name", longest=255):
        raise ValueError(f"name must be a file name in scripts/, got {name!r}")
    path = SCRIPTS / name
    if not path.is_file():
        known = ", ".join(sorted(p.name for p in SCRIPTS.glob("*") if p.is_file()))
        raise FileNotFoundError(f"scripts/{name} does not exist; scripts/ holds: {known}")
    return os.path.relpath(path)


def _resolve(command: list[str]) -> list[str]:
    """Find ``torchrun``/``python`` of *this* environment (the kernel's virtual env)."""
    exe, rest = command[0], command[1:]
    if exe == "python":
        return [sys.executable, *rest]
    if exe == "torchrun":
        sibling = Path(sys.executable).with_name("torchrun")
        if sibling.is_file():
            return [str(sibling), *rest]
        found = shutil.which("torchrun")
        return [found, *rest] if found else [sys.executable, "-m", "torch.distributed.run", *rest]
    return command


@dataclass(frozen=True, repr=False)
class RunResult(ShownAsTable):
    """A finished command: what ran, its exit code, everything it printed, how long it took."""

    command: list[str]
    returncode: int
    output: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def check(self) -> RunResult:
        """Return self, or raise RuntimeError with the output if the command failed."""
        if not self.ok:
            raise RuntimeError(
                f"`{command_text(self.command)}` exited with code {self.returncode}; "
                f"its output:\n{self.output}"
            )
        return self

    def text(self) -> str:
        return (f"$ {command_text(self.command)}\n{self.output.rstrip()}\n"
                f"(exit code {self.returncode})")


def run_captured(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd=None,
    timeout: float = 300,
) -> RunResult:
    """Run ``command``, wait for it, and return its combined stdout and stderr.

    ``"torchrun"`` and ``"python"`` as the first word mean the ones of this environment.
    ``env`` is added to the current environment (with ``PYTHONUNBUFFERED=1``). The command
    runs in its own process group; on timeout the whole group (torchrun and its workers) is
    killed and TimeoutError raised with the output so far (``timeout``: seconds, up to a
    week). Any other error while waiting (Ctrl-C included) kills the group too.
    """
    cmd = _check_args(command, "command")
    if not cmd or not cmd[0].strip():
        raise ValueError(f"command must start with the program to run, got {shown(cmd)}")
    timeout = real_number(timeout, "timeout", 0, _LONGEST_RUN, above=True)
    if env is not None and not isinstance(env, Mapping):
        raise TypeError(f"env must be a mapping of strings, got {type(env).__name__}")
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for key, value in (env or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"env entries must be strings, got {shown(key)}: {shown(value)}")
        full_env[key] = value
    if cwd is not None and not isinstance(cwd, (str, os.PathLike)):
        raise TypeError(f"cwd must be a folder path, got {type(cwd).__name__}")
    if cwd is not None and not Path(cwd).is_dir():
        raise FileNotFoundError(f"cwd {cwd} is not a folder")

    start = time.perf_counter()
    proc = subprocess.Popen(
        _resolve(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        errors="replace", env=full_env, cwd=cwd, start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except BaseException as exc:
        # a timeout, Ctrl-C or any other error: never leave torchrun and its workers running
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        raise TimeoutError(
            f"`{command_text(cmd)}` did not finish within {timeout} s and was killed; "
            f"output so far:\n{output[-4000:]}"
        ) from None
    return RunResult(cmd, proc.returncode, output, time.perf_counter() - start)


# gloo on the CPU: now and then one worker aborts in its teardown at exit, after the script
# has finished (about 3-9 % of launches here, also after barrier + destroy_process_group)
_GLOO_EXIT_ABORT = "terminate called without an active exception"
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.M)


def forgive_gloo_exit_abort(result: RunResult) -> RunResult:
    """``result`` as a success when its only failure is gloo's abort at exit (CPU only).

    Over gloo, a worker sometimes aborts in its C++ teardown ("terminate called without an
    active exception", SIGABRT) after its script has returned; torchrun then stops the other
    workers (SIGTERM) and reports a failure. When the output holds that message and every
    failure torchrun lists is that SIGABRT or the SIGTERM that followed it, the result is
    returned with exit code 0 and the output cut before the abort. Anything else (a Python
    error in the script: exit code 1) is returned unchanged. Lesson 03's scripts end with
    ``dist.destroy_process_group()``, as they should; this is the kit's workaround, never
    theirs.
    """
    if result.ok or _GLOO_EXIT_ABORT not in result.output:
        return result
    codes = [int(c) for c in _EXITCODE.findall(result.output)]
    if -6 not in codes or any(c not in (-6, -15) for c in codes):
        return result
    kept = []
    for line in result.output.splitlines(keepends=True):
        if _GLOO_EXIT_ABORT in line:
            break
        kept.append(line)
    return RunResult(result.command, 0, "".join(kept), result.seconds)


def run_command(command: str, *, env: Mapping[str, str] | None = None, timeout: float = 300,
                ) -> RunResult:
    """Run one command line, as typed in a terminal, and return what it printed (lesson 03).

    The line is split as a shell splits it (``shlex``; no pipes or variables); ``torchrun``
    and ``python`` are this environment's. ``OMP_NUM_THREADS=1`` (one CPU thread per
    process, unless ``env`` says otherwise) and ``env`` are added to the environment. On the
    CPU, gloo's abort at exit after a finished script is forgiven
    (:func:`forgive_gloo_exit_abort`).
    """
    words = shlex.split(text(command, "command", longest=10_000))
    return forgive_gloo_exit_abort(
        run_captured(words, env={"OMP_NUM_THREADS": "1", **(env or {})}, timeout=timeout))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (for rendezvous in tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tf_config(workers: Sequence[str], index: int, *, task_type: str = "worker") -> dict:
    """The ``TF_CONFIG`` dict of one MultiWorkerMirroredStrategy worker.

    Args:
        workers: ``host:port`` of every worker, in the same order on every worker.
        index: this worker's position in ``workers`` (0 is the chief: it logs and saves).
        task_type: ``"worker"`` (MultiWorkerMirroredStrategy has no other kind).

    Returns:
        ``{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": i}}``; set it
        with ``os.environ["TF_CONFIG"] = json.dumps(...)`` before creating the strategy.
    """
    if isinstance(workers, str) or not isinstance(workers, Sequence):
        raise TypeError(f"workers must be a list of 'host:port', got {type(workers).__name__}")
    if not workers:
        raise ValueError("workers must not be empty")
    for w in workers:
        _endpoint(w, "each worker", "node001:23456")
    if len({w.lower() for w in workers}) != len(workers):  # host names ignore case
        raise ValueError(f"workers must be distinct, got {list(workers)}")
    index = whole_number(index, "index", 0, len(workers) - 1)
    choice(task_type, "task_type", ["worker"])
    return {"cluster": {"worker": list(workers)}, "task": {"type": task_type, "index": index}}
