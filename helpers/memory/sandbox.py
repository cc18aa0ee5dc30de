"""The planner's own process: a training script planned by :func:`~.planner.will_it_fit` runs
here, never in the caller's process (lesson 10).

Each plan (the main run, the fixes and the batch search together) runs in one process of
its own, in a process group of its own, with the working folder and environment the caller
has. That process is forked from a planner server (``python -m helpers.memory.sandbox
--server SOCKET``), which the caller starts once, in a session of its own: it imports torch
and plans a tiny script once, so a plan starts in ~0.2 s instead of the 2-3 s of a new Python.
Where the server cannot run, each plan starts ``python -m helpers.memory.sandbox FOLDER FD``.
The arguments go in, and the :class:`~.planner.Plan` (or the
:class:`~.planner.PlanError`) comes back, as pickles in FOLDER, a private temporary folder.
The caller relays the child's output to its own ``sys.stdout``/``sys.stderr`` as it comes, and
on any ending (a result, an error, the time limit, Ctrl-C or a notebook's Interrupt) kills the
child's whole process group and removes the folder. So nothing the script does to its process
(``torch.set_default_device``, signal handlers, ``sys.stdout``, limits, ``nice``, ``umask``,
threads, subprocesses) reaches the caller.

In the child:

* Writes go to a throw-away folder (FOLDER/writes): ``open``/``io.open``/``os.open`` in a
  writing mode, ``pathlib``'s writes, ``os.remove``/``unlink``/``rename``/``replace``/
  ``rmdir``/``mkdir``/``makedirs``/``truncate``/``chmod``/``utime``, ``shutil.rmtree`` and
  the ``shutil`` copies. A path the script wrote (or removed) earlier reads back as it left
  it (``os.stat``, ``os.path.exists``, ``open``, ``os.listdir``, ``os.scandir``); everything
  else reads the user's files, as ``python script.py`` does. Each run of the script starts
  from the user's files again. Not redirected: writes by native code (C extensions that open
  files themselves), and calls with ``dir_fd``.
* ``os.fork``, ``multiprocessing``'s ``Process.start`` and ``torch.multiprocessing.spawn``/
  ``start_processes`` are refused with a :class:`~.planner.PlanError` (plan one process;
  ``--ddp N`` gives each of N ranks). ``subprocess`` runs, and is killed with the group.
* The script's folder is first on ``sys.path`` and no ``.pyc`` files are written.
* Each run of the script tells the caller it started (a byte on the pipe FD), so the caller's
  hard limit (the run's ``time_limit`` + a grace) also ends a script whose bare ``except:``
  swallows the planner's own stop.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

__all__ = ["plan_in_child", "in_child", "run_started", "GRACE_S", "STARTUP_S"]

#: seconds a run may overstay its ``time_limit`` before the caller kills the process: a grace
#: of 3 s + 5 % of the limit for the planner's own stop (SIGALRM) to end the run cleanly
GRACE_S = 3.0
#: seconds the child may take to start (import torch and the planner) before its first run
STARTUP_S = 120.0

_KIT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_REQUEST, _RESULT = "request.pickle", "result.pickle"

# the child's state (None in any other process)
_child: _Child | None = None


_serving = False  # the planner server (below): plans its warm-up in its own process


def in_child() -> bool:
    """Is this the planner's own process (where the script may run)?"""
    return _child is not None or _serving


def run_started() -> None:
    """Called by the planner at the start of each run of the script: the caller's hard limit
    starts again, and the throw-away folder is emptied (each run sees the user's files)."""
    if _child is not None:
        _child.run_started()


def skipped_save(f) -> None:
    """``torch.save(obj, f)`` was skipped: a path ``f`` gets an empty stand-in file in the
    throw-away folder, so what the script does with it next (``os.replace(tmp, path)``,
    ``os.path.exists``) works."""
    if _child is not None and isinstance(f, (str, bytes, os.PathLike)):
        w = _child.writes
        if not w._passes(f):
            with w._o["open"](w.for_write(f, "", keep=False, record=False), "wb"):
                pass


def check_load(f) -> None:
    """``torch.load(f)`` of a file the script saved itself in this run: the planner skipped
    that ``torch.save`` (fake tensors have no values), so say so rather than fail with
    an EOFError."""
    from .planner import PlanError

    if _child is None or not isinstance(f, (str, bytes, os.PathLike)):
        return
    w = _child.writes
    if w._passes(f):
        return
    path = w.for_read(f)
    if path.startswith(w.root + os.sep) and w._o["isfile"](path) and \
            w._o["stat"](path).st_size == 0:
        raise PlanError(
            f"the script loads {os.fsdecode(f)!r}, which it saved itself earlier in this run; "
            "the planner skips torch.save (fake tensors have no values). Plan it with "
            "options that do not reload its own checkpoint in the first steps.",
            kind="script")


def _grace(time_limit: float) -> float:
    return GRACE_S + 0.05 * time_limit


# ------------------------------------------------------------------------------ the caller
def plan_in_child(call: dict, time_limit: float):
    """Run ``will_it_fit(**call)`` in a child process and return its Plan (or raise its
    PlanError), relaying the child's output; the child's process group is killed and the
    private folder removed on any ending."""
    from .planner import PlanError

    folder = tempfile.mkdtemp(prefix="helpers-fit-")
    child = None
    timed_out = False
    result = None
    try:
        with open(os.path.join(folder, _REQUEST), "wb") as f:
            pickle.dump({"call": call, "cwd": os.getcwd(), "environ": dict(os.environ)}, f)
        with _LOCK:
            child = _start(folder)
            timed_out = _relay(child, time_limit)
            child.kill()
            _drain(child)
        path = os.path.join(folder, _RESULT)
        if not timed_out and os.path.exists(path):
            with open(path, "rb") as f:
                result = pickle.load(f)
    finally:
        if child is not None:
            child.kill()
            child.close()
        shutil.rmtree(folder, ignore_errors=True)
    if timed_out:
        raise PlanError(
            f"the script did not stop within time_limit={time_limit:g} s (+ a grace of "
            f"{_grace(time_limit):.0f} s): the planner ended its process. A bare `except:` "
            "around the training loop swallows the planner's stop (catch Exception instead), "
            "or a call never returned.", kind="time")
    if result is None:
        code = child.returncode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            how = (f"was killed by {name}" + (" (the system's out-of-memory killer? the host "
                   "memory ran out)" if -code == signal.SIGKILL else
                   " (a crash in native code?)" if -code in (signal.SIGSEGV, signal.SIGBUS,
                                                             signal.SIGABRT) else ""))
        else:
            how = (f"ended with status {code} without a result: the script ended the process "
                   "itself (os._exit / posix._exit, or a library that exits) before its "
                   "optimizer steps")
        raise PlanError(f"the planner's process for the script {how}; nothing was planned.",
                        kind="exited")
    kind, value = result
    if kind == "plan":
        return value
    if kind == "error":
        message, error_kind, details = value
        raise PlanError(message, kind=error_kind, details=details)
    raise PlanError(f"the planner failed in its own process: {value}", kind="internal",
                    details=value)


_LOCK = threading.Lock()  # one plan at a time per caller process


def _child_env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_KIT_ROOT, os.environ.get("PYTHONPATH"))
                                        if p)
    return env


class _Started:
    """The planner's process for one plan: its pid (and process group), its output pipes
    (``out``, ``err``) and the pipe on which it says a run started (``beat``)."""

    returncode: int | None = None

    def __init__(self, pid: int, out: int, err: int, beat: int):
        self.pid, self.out, self.err, self.beat = pid, out, err, beat
        self.decoders: dict = {}

    def poll(self) -> int | None:
        raise NotImplementedError

    def wait(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self.poll() is None and time.monotonic() < end:
            time.sleep(0.02)

    def kill(self) -> None:
        """Kill the process group (the script's subprocesses too) and wait for its end."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.wait(10)

    def close(self) -> None:
        for name in ("out", "err", "beat"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)


class _Popened(_Started):
    """Started with ``python -m helpers.memory.sandbox FOLDER FD`` (2-3 s: torch's import)."""

    def __init__(self, folder: str):
        beat_r, beat_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "helpers.memory.sandbox", folder, str(beat_w)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(beat_w,), start_new_session=True, env=_child_env())
        except BaseException:
            os.close(beat_r)
            raise
        finally:
            os.close(beat_w)
        super().__init__(self.proc.pid, os.dup(self.proc.stdout.fileno()),
                         os.dup(self.proc.stderr.fileno()), beat_r)
        self.proc.stdout.close()
        self.proc.stderr.close()

    def poll(self):
        self.returncode = self.proc.poll()
        return self.returncode


class _Forked(_Started):
    """Forked by the caller's planner server (see :class:`_Server`): no import to wait for."""

    def __init__(self, server: _Server, folder: str):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        beat_r, beat_w = os.pipe()
        try:
            pid = server.fork(folder, (out_w, err_w, beat_w))
        except BaseException:
            for fd in (out_r, err_r, beat_r):
                os.close(fd)
            raise
        finally:
            for fd in (out_w, err_w, beat_w):
                os.close(fd)
        super().__init__(pid, out_r, err_r, beat_r)
        self.server = server

    def poll(self):
        self.returncode = self.server.status(self.pid)
        return self.returncode


class _Server:
    """A process of the caller's, started once (it imports torch and the planner, then
    waits), that forks a fresh process for each plan: each plan then starts in milliseconds
    instead of seconds. It ends with the caller (its socket closes) and kills what it forked.
    Messages go over a SOCK_SEQPACKET socket: the request (folder, pipes as file descriptors)
    in, ("pid", pid) and ("exit", pid, status) out."""

    def __init__(self):
        import socket

        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "helpers.memory.sandbox", "--server",
                 str(theirs.fileno())], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),), start_new_session=True, env=_child_env())
        finally:
            theirs.close()
        self.sock = mine
        self.owner = os.getpid()
        self.statuses: dict[int, int] = {}

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.proc.poll() is None

    def _receive(self, block: bool) -> bool:
        """Read the server's messages; False when it is gone."""
        import socket

        while True:
            try:
                data = self.sock.recv(4096, 0 if block else socket.MSG_DONTWAIT)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not data:
                return False
            message = pickle.loads(data)
            if message[0] == "exit":
                self.statuses[message[1]] = message[2]
            elif message[0] == "pid":
                self.statuses.setdefault(message[1], None)
                self._last_pid = message[1]
            block = False

    def fork(self, folder: str, fds) -> int:
        import socket

        self._last_pid = None
        socket.send_fds(self.sock, [pickle.dumps(("plan", folder))], list(fds))
        end = time.monotonic() + STARTUP_S  # the first answer waits for torch's import
        while self._last_pid is None:
            if not self._receive(block=True) or time.monotonic() > end:
                raise OSError("the planner's server did not answer")
        return self._last_pid

    def status(self, pid: int) -> int | None:
        """The exit code of a forked plan's process (None while it runs)."""
        if not self._receive(block=False) and self.statuses.get(pid) is None:
            self.statuses[pid] = -signal.SIGKILL  # the server is gone, and its plans with it
        return self.statuses.get(pid)

    def stop(self) -> None:
        try:
            self.sock.close()
        finally:
            try:
                self.proc.kill()
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                pass


_server: _Server | None = None
#: fork each plan from a planner server started once (fast); False: start a new Python for
#: each plan (``python -m helpers.memory.sandbox``, 2-3 s more per plan)
USE_SERVER = hasattr(os, "fork") and hasattr(__import__("socket"), "send_fds")


def _start(folder: str) -> _Started:
    global _server
    if USE_SERVER:
        try:
            if _server is None or not _server.alive():
                if _server is None:
                    import atexit

                    atexit.register(lambda: _server is not None and _server.stop())
                _server = _Server()
            return _Forked(_server, folder)
        except OSError:
            if _server is not None:
                _server.stop()
            _server = None  # no server here: a new Python for this plan
    return _Popened(folder)


def _write(stream_name: str, decoder, data: bytes) -> None:
    text_ = decoder.decode(data)
    if text_:
        stream = getattr(sys, stream_name)  # looked up each time: pytest's capsys swaps it
        stream.write(text_)
        stream.flush()


def _relay(child: _Started, time_limit: float) -> bool:
    """Relay the child's output until it exits; True when it overstayed its time (then the
    caller kills it). A byte on ``child.beat`` starts a run: the limit counts from there."""
    import codecs

    child.decoders = {fd: (name, codecs.getincrementaldecoder("utf-8")("replace"))
                      for fd, name in ((child.out, "stdout"), (child.err, "stderr"))}
    sel = selectors.DefaultSelector()
    for fd in (*child.decoders, child.beat):
        sel.register(fd, selectors.EVENT_READ)
    deadline = time.monotonic() + STARTUP_S + time_limit + _grace(time_limit)
    try:
        while True:
            for key, _ in sel.select(timeout=0.1):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fd)
                elif key.fd == child.beat:
                    deadline = time.monotonic() + time_limit + _grace(time_limit)
                else:
                    _write(*child.decoders[key.fd], data)
            if child.poll() is not None:
                return False
            if time.monotonic() > deadline:
                return True
    finally:
        sel.close()


def _drain(child: _Started, seconds: float = 2.0) -> None:
    """What the child wrote before it ended (its group is dead: the pipes reach EOF, unless a
    process that left the group holds them; then give up after ``seconds``)."""
    open_fds = dict(child.decoders)
    end = time.monotonic() + seconds
    with selectors.DefaultSelector() as sel:
        for fd in open_fds:
            sel.register(fd, selectors.EVENT_READ)
        while open_fds and time.monotonic() < end:
            for key, _ in sel.select(timeout=0.1):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fd)
                    del open_fds[key.fd]
                else:
                    _write(*child.decoders[key.fd], data)
    for name, decoder in child.decoders.values():
        _write(name, decoder, b"")


# ------------------------------------------------------------------------------ the child
class _Child:
    def __init__(self, folder: str, beat_fd: int, script: str):
        self.folder = folder
        self.beat_fd = beat_fd
        self.writes = _Writes(os.path.join(folder, "writes"), folder, script)
        self.refused: list = []  # PlanErrors for the processes the script tried to start

    def run_started(self) -> None:
        try:
            os.write(self.beat_fd, b"R")
        except OSError:
            pass
        self.writes.reset()


def _user_line(script_dir: str):
    """The script's line that called (the innermost frame in the script's folder, outside
    the kit, torch and installed packages)."""
    import linecache

    from .planner import _HELPERS_DIR, _TORCH_DIR, CodeLine

    frame = sys._getframe(2)
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if name.startswith(script_dir) and not name.startswith((_HELPERS_DIR, _TORCH_DIR)) \
                and "site-packages" not in name:
            return CodeLine(name, frame.f_lineno,
                            linecache.getline(name, frame.f_lineno).strip())
        frame = frame.f_back
    return None


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class _Writes:
    """The script's writes, sent into ``root`` (the same absolute path below it); reads of a
    path written or removed earlier see that; everything else reads the user's files."""

    def __init__(self, root: str, private: str, script: str):
        self.root = root
        self.private = private + os.sep
        self.script_dir = os.path.dirname(os.path.abspath(script)) + os.sep
        self.deleted: set[str] = set()
        self.seen: dict[tuple[str, str], object] = {}  # (what, path) -> CodeLine
        self._o = {}  # the real functions
        os.makedirs(root, exist_ok=True)

    # ------------------------------------------------------------ paths
    def _passes(self, path) -> bool:
        """Paths left alone: file descriptors, the private folder, devices and /proc."""
        if isinstance(path, int):
            return True
        p = os.path.abspath(os.fsdecode(path))
        return p.startswith((self.private, "/dev/", "/proc/", "/sys/")) or p in ("/dev/null",)

    def _shadow(self, p: str) -> str:
        return os.path.join(self.root, p.lstrip(os.sep))

    def _hidden(self, p: str) -> bool:
        while True:
            if p in self.deleted:
                return True
            parent = os.path.dirname(p)
            if parent == p:
                return False
            p = parent

    def _has_shadow(self, p: str) -> bool:
        return self._o["lexists"](self._shadow(p))

    def for_read(self, path) -> str:
        p = os.path.abspath(os.fsdecode(path))
        if self._has_shadow(p):
            return self._shadow(p)
        if self._hidden(p):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), os.fsdecode(path))
        return p

    def exists(self, p: str) -> bool:
        try:
            return self._o["lexists"](self.for_read(p))
        except FileNotFoundError:
            return False

    def is_dir(self, p: str) -> bool:
        try:
            return self._o["isdir"](self.for_read(p))
        except FileNotFoundError:
            return False

    def for_write(self, path, what: str, *, keep: bool, exclusive: bool = False,
                  record: bool = True) -> str:
        """Where a write of ``path`` goes; ``keep``: the write keeps the file's bytes (append,
        read-write), so a user's file is copied first."""
        p = os.path.abspath(os.fsdecode(path))
        if record:
            self._record(what, p)
        if exclusive and self.exists(p):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fsdecode(path))
        if not self.is_dir(os.path.dirname(p)):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), os.fsdecode(path))
        s = self._shadow(p)
        self._o["makedirs"](os.path.dirname(s), exist_ok=True)
        if keep and not self._has_shadow(p) and not self._hidden(p) and \
                self._o["isfile"](p):
            self._o["copyfile"](p, s)
        return s

    def _record(self, what: str, p: str) -> None:
        key = (what, p)
        if key not in self.seen:
            self.seen[key] = _user_line(self.script_dir)

    def _remove(self, p: str, what: str) -> None:
        """``p`` removed (a file or a whole tree): its copy here goes, the user's is hidden."""
        self._record(what, p)
        if self._has_shadow(p):
            s = self._shadow(p)
            if self._o["isdir"](s) and not self._o["islink"](s):
                self._o["rmtree"](s)
            else:
                self._o["unlink"](s)
        if not self._hidden(p) and self._o["lexists"](p):
            self.deleted.add(p)

    def reset(self) -> None:
        if self._o:  # installed: the real functions
            if self._o["lexists"](self.root):
                self._o["rmtree"](self.root)
            self._o["makedirs"](self.root, exist_ok=True)
        self.deleted.clear()

    def notes(self) -> dict:
        """The plan's notes: each redirected write, with the script's line."""
        out = {}
        for (what, p), where in self.seen.items():
            out[f"{what.format(repr(_rel(p)))} went to a throw-away folder (your files are "
                "not changed)"] = where
        return out

    # ------------------------------------------------------------ the patches
    def install(self) -> None:
        import builtins
        import pathlib  # noqa: F401 - imported before the patches: it calls io.open/os.*

        o = self._o
        o.update(open=builtins.open, os_open=os.open, stat=os.stat, lstat=os.lstat,
                 listdir=os.listdir, scandir=os.scandir, mkdir=os.mkdir, rmdir=os.rmdir,
                 remove=os.remove, unlink=os.unlink, rename=os.rename, replace=os.replace,
                 truncate=os.truncate, chmod=os.chmod, utime=os.utime,
                 lexists=os.path.lexists, isdir=os.path.isdir, isfile=os.path.isfile,
                 islink=os.path.islink, makedirs=os.makedirs, rmtree=shutil.rmtree,
                 copyfile=shutil.copyfile, copytree=shutil.copytree)
        # the real functions above must keep working on real paths: they look their helpers up
        # in os/shutil, which the patches below replace; so they get private copies that
        # call the originals
        real_stat, real_lstat, real_mkdir = os.stat, os.lstat, os.mkdir

        def lexists(path):
            try:
                real_lstat(path)
            except (OSError, ValueError):
                return False
            return True

        def isdir(path):
            import stat as st
            try:
                return st.S_ISDIR(real_stat(path).st_mode)
            except (OSError, ValueError):
                return False

        def isfile(path):
            import stat as st
            try:
                return st.S_ISREG(real_stat(path).st_mode)
            except (OSError, ValueError):
                return False

        def islink(path):
            import stat as st
            try:
                return st.S_ISLNK(real_lstat(path).st_mode)
            except (OSError, ValueError):
                return False

        def makedirs(path, exist_ok=False):
            if isdir(path):
                if not exist_ok:
                    raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
                return
            parent = os.path.dirname(path)
            if parent and parent != path and not isdir(parent):
                makedirs(parent, exist_ok=True)
            try:
                real_mkdir(path)
            except FileExistsError:
                if not exist_ok:
                    raise

        real_open, real_os_open = builtins.open, os.open
        real_listdir, real_scandir = os.listdir, os.scandir
        real_rmdir, real_unlink, real_replace = os.rmdir, os.unlink, os.replace

        def rmtree(path):
            for entry in real_listdir(path):
                full = os.path.join(path, entry)
                if isdir(full) and not islink(full):
                    rmtree(full)
                else:
                    real_unlink(full)
            real_rmdir(path)

        def copyfile(src, dst):
            with real_open(src, "rb") as fin, real_open(dst, "wb") as fout:
                while chunk := fin.read(1 << 20):
                    fout.write(chunk)

        def copytree(src, dst):
            makedirs(dst, exist_ok=True)
            for entry in real_listdir(src):
                s, d = os.path.join(src, entry), os.path.join(dst, entry)
                if isdir(s) and not islink(s):
                    copytree(s, d)
                else:
                    copyfile(s, d)

        o.update(lexists=lexists, isdir=isdir, isfile=isfile, islink=islink,
                 makedirs=makedirs, rmtree=rmtree, copyfile=copyfile, copytree=copytree)
        me = self

        def open_(file, mode="r", *args, **kwargs):
            if not isinstance(file, (str, bytes, os.PathLike)) or me._passes(file):
                return real_open(file, mode, *args, **kwargs)
            if any(c in mode for c in "wax+"):
                target = me.for_write(file, f"open({{}}, {mode!r})",
                                      keep="w" not in mode and "x" not in mode,
                                      exclusive="x" in mode)
            else:
                target = me.for_read(file)
            return real_open(target, mode, *args, **kwargs)

        def os_open(path, flags, mode=0o777, *, dir_fd=None):
            if dir_fd is not None or me._passes(path) or not flags & _WRITE_FLAGS:
                if dir_fd is None and not me._passes(path):
                    path = me.for_read(path)
                return real_os_open(path, flags, mode, dir_fd=dir_fd)
            exclusive = bool(flags & os.O_CREAT and flags & os.O_EXCL)
            target = me.for_write(path, "os.open({})", keep=not flags & os.O_TRUNC,
                                  exclusive=exclusive)
            return real_os_open(target, flags, mode)

        def reader(real):
            def read(path, *args, dir_fd=None, **kwargs):
                if dir_fd is not None or me._passes(path):
                    return real(path, *args, dir_fd=dir_fd, **kwargs)
                return real(me.for_read(path), *args, **kwargs)
            return read

        def listdir(path="."):
            if me._passes(path):
                return real_listdir(path)
            p = os.path.abspath(os.fsdecode(path))
            names: dict[str, None] = {}
            if not me._hidden(p) and isdir(p):
                names.update((n, None) for n in real_listdir(p)
                             if os.path.join(p, n) not in me.deleted)
            if me._has_shadow(p) and isdir(me._shadow(p)):
                names.update((n, None) for n in real_listdir(me._shadow(p)))
            if not names and not me.is_dir(p):
                return real_listdir(me.for_read(path))  # the real error
            out = list(names)
            return [os.fsencode(n) for n in out] if isinstance(path, bytes) else out

        class _Scan:
            """``os.scandir`` of the user's folder and its copy here, as one."""

            def __init__(self, path):
                p = os.path.abspath(os.fsdecode(path))
                self._its = []
                shadow = me._shadow(p)
                shadowed = set()
                if me._has_shadow(p) and isdir(shadow):
                    shadowed = set(real_listdir(shadow))
                if not me._hidden(p) and isdir(p):
                    self._its.append(e for e in real_scandir(path)
                                     if e.name not in shadowed
                                     and os.path.join(p, e.name) not in me.deleted)
                if shadowed:
                    self._its.append(iter(real_scandir(shadow)))
                if not self._its:
                    self._its.append(iter(real_scandir(me.for_read(path))))

            def __iter__(self):
                for it in self._its:
                    yield from it

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def close(self):
                pass

        def scandir(path="."):
            if isinstance(path, int) or me._passes(path):
                return real_scandir(path)
            return _Scan(path)

        def mkdir(path, mode=0o777, *, dir_fd=None):
            if dir_fd is not None or me._passes(path):
                return real_mkdir(path, mode, dir_fd=dir_fd)
            p = os.path.abspath(os.fsdecode(path))
            me._record("os.mkdir({})", p)
            if me.exists(p):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
            if not me.is_dir(os.path.dirname(p)):
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
            makedirs(me._shadow(p), exist_ok=True)

        def remove(path, *, dir_fd=None):
            if dir_fd is not None or me._passes(path):
                return real_unlink(path, dir_fd=dir_fd)
            p = os.path.abspath(os.fsdecode(path))
            if not me.exists(p):
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
            if me.is_dir(p):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
            me._remove(p, "os.remove({})")

        def rmdir(path, *, dir_fd=None):
            if dir_fd is not None or me._passes(path):
                return real_rmdir(path, dir_fd=dir_fd)
            p = os.path.abspath(os.fsdecode(path))
            if not me.is_dir(p):
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
            if listdir(p):
                raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), path)
            me._remove(p, "os.rmdir({})")

        def move(what):
            def rename(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
                if src_dir_fd is not None or dst_dir_fd is not None or \
                        (me._passes(src) and me._passes(dst)):
                    return o[what](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
                s = os.path.abspath(os.fsdecode(src))
                source = me.for_read(s) if not me._passes(src) else s
                if not lexists(source):
                    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), src)
                target = os.fsdecode(dst) if me._passes(dst) else \
                    me.for_write(dst, f"os.{what}(..., {{}})", keep=False)
                if source.startswith(me.root + os.sep) or me._passes(src):
                    real_replace(source, target)
                elif isdir(source):
                    copytree(source, target)
                else:
                    copyfile(source, target)
                if not me._passes(src) and not me._hidden(s) and lexists(s):
                    me.deleted.add(s)
            return rename

        def changer(real, what):
            def change(path, *args, dir_fd=None, **kwargs):
                if dir_fd is not None or me._passes(path):
                    return real(path, *args, dir_fd=dir_fd, **kwargs)
                p = os.path.abspath(os.fsdecode(path))
                if not me.exists(p):
                    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
                if me.is_dir(p):
                    me._record(f"os.{what}({{}})", p)
                    return None  # a folder's mode or times: left as they are
                return real(me.for_write(p, f"os.{what}({{}})", keep=True), *args, **kwargs)
            return change

        def truncate(path, length):
            if isinstance(path, int) or me._passes(path):
                return o["truncate"](path, length)
            return o["truncate"](me.for_write(path, "os.truncate({})", keep=True), length)

        def rmtree_(path, ignore_errors=False, onerror=None, **kwargs):
            if me._passes(path):
                return o["rmtree_real"](path, ignore_errors, onerror, **kwargs)
            p = os.path.abspath(os.fsdecode(path))
            if not me.exists(p):
                if ignore_errors:
                    return None
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
            me._remove(p, "shutil.rmtree({})")

        o["rmtree_real"] = shutil.rmtree
        builtins.open = io.open = open_
        os.open = os_open
        os.stat, os.lstat = reader(os.stat), reader(os.lstat)
        os.listdir, os.scandir, os.mkdir, os.rmdir = listdir, scandir, mkdir, rmdir
        os.remove = os.unlink = remove
        os.rename, os.replace = move("rename"), move("replace")
        os.truncate = truncate
        os.chmod, os.utime = changer(os.chmod, "chmod"), changer(os.utime, "utime")
        shutil.rmtree = rmtree_
        if hasattr(shutil, "_copyxattr"):
            shutil._copyxattr = lambda *args, **kwargs: None
        tempfile.tempdir = os.path.join(self.private, "tmp")
        os.makedirs(tempfile.tempdir, exist_ok=True)


def _rel(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith(".." + os.sep + "..") else rel


def _refuse_processes(child: _Child) -> None:
    """os.fork, multiprocessing and torch.multiprocessing refuse, with what to do instead."""
    import multiprocessing.process

    from .planner import PlanError

    script_dir = child.writes.script_dir

    def refuse(what: str):
        def refused(*args, **kwargs):
            where = _user_line(script_dir)
            err = PlanError(
                f"the script starts another process ({what}"
                f"{f' at {where}' if where else ''}): the planner plans one process and "
                "does not start the script's workers. Plan it as one process (without its "
                "multi-process option, such as --multiprocessing-distributed, or with a "
                "world size of 1) and give --ddp N for the memory of each of N ranks. "
                "(Shell commands through subprocess may run.)", kind="processes")
            child.refused.append(err)
            raise err
        return refused

    for name in ("fork", "forkpty"):
        if hasattr(os, name):
            setattr(os, name, refuse(f"os.{name}"))
    multiprocessing.process.BaseProcess.start = refuse("multiprocessing's Process.start")
    try:
        import torch.multiprocessing as tmp
        import torch.multiprocessing.spawn as tmp_spawn
    except ImportError:  # pragma: no cover - torch always has it
        return
    for module in (tmp, tmp_spawn):
        for name in ("spawn", "start_processes"):
            if hasattr(module, name):
                setattr(module, name, refuse(f"torch.multiprocessing.{name}"))


def _watch_parent() -> None:
    """End this process group if the caller dies (a notebook kernel killed or restarted)."""
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="planner-parent-watch").start()


def main(argv: list[str]) -> None:
    """The child: ``python -m helpers.memory.sandbox FOLDER FD`` (or ``--server SOCKET``)."""
    if argv[0] == "--server":
        _serve(int(argv[1]))
    else:
        _plan_here(argv[0], int(argv[1]))


def _serve(sock_fd: int) -> None:
    """The planner server: import the planner once, then fork a process for each plan."""
    import socket

    global _serving
    from . import planner

    _serving = True
    _warm_up(planner)
    sock = socket.socket(fileno=sock_fd)
    parent = os.getppid()
    children: set[int] = set()
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    try:
        while True:
            ready = sel.select(timeout=0.2)
            while children:  # the ends of earlier plans
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                children.discard(pid)
                sock.send(pickle.dumps(("exit", pid, os.waitstatus_to_exitcode(status))))
            if os.getppid() != parent:
                return
            if not ready:
                continue
            data, fds, _, _ = socket.recv_fds(sock, 65536, 8)
            if not data:
                return
            _, folder = pickle.loads(data)
            pid = os.fork()
            if pid == 0:  # the plan's process
                try:
                    os.setpgid(0, 0)
                    sel.close()
                    sock.close()
                    null = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(null, 0)
                    os.dup2(fds[0], 1)
                    os.dup2(fds[1], 2)
                    for fd in (null, fds[0], fds[1]):
                        os.close(fd)
                    _plan_here(folder, fds[2])
                finally:
                    os._exit(70)
            try:
                os.setpgid(pid, pid)  # also here: the caller may kill the group at once
            except OSError:
                pass
            for fd in fds:
                os.close(fd)
            children.add(pid)
            sock.send(pickle.dumps(("pid", pid)))
    except OSError:
        return
    finally:
        for pid in children:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass


_WARM_UP = """\
import torch
from torch import nn
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).cuda()
opt = torch.optim.Adam(model.parameters())
for _ in range(3):
    x, y = torch.randn(4, 8).cuda(), torch.randint(0, 2, (4,)).cuda()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
"""


def _warm_up(planner) -> None:
    """Plan a tiny script once in the server: torch's lazy imports and first-use set-up
    (about 2 s) are then done once, not in every forked plan."""
    folder = tempfile.mkdtemp(prefix="helpers-fit-warm-")
    try:
        path = os.path.join(folder, "warm_up.py")
        with open(path, "w") as f:
            f.write(_WARM_UP)
        planner.will_it_fit(path)
    except Exception:  # noqa: BLE001 - only slower without it
        pass
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _plan_here(folder: str, beat_fd: int) -> None:
    """Plan the request in ``folder`` in this process, write the result and end it."""
    global _child
    real_exit = os._exit
    with open(os.path.join(folder, _REQUEST), "rb") as f:
        request = pickle.load(f)
    real_open = open
    _watch_parent()
    sys.dont_write_bytecode = True
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["environ"])  # the caller's, without the kit's PYTHONPATH
    call = request["call"]
    script = os.path.abspath(os.fspath(call["script"]))
    sys.path[0] = os.path.dirname(script)  # as `python script.py` (-m put the cwd there)
    from . import planner

    _child = child = _Child(folder, beat_fd, script)
    try:
        _refuse_processes(child)
        child.writes.install()
        plan = planner.will_it_fit(**call)
        plan.notes.update(child.writes.notes())
        for err in child.refused:  # the script caught the refusal and went on
            plan.notes[str(err)] = None
        result = ("plan", plan)
    except planner.PlanError as exc:
        if child.refused and exc is not child.refused[0]:
            exc = child.refused[0]  # the refusal is why, whatever the script did next
        result = ("error", (str(exc), exc.kind, exc.details))
    except BaseException:  # noqa: BLE001 - a planner bug: give it back, do not lose it
        import traceback

        result = ("internal", traceback.format_exc())
    try:
        data = pickle.dumps(result)
    except Exception as exc:  # noqa: BLE001
        data = pickle.dumps(("internal", f"the plan could not be passed back: {exc!r}"))
    with real_open(os.path.join(folder, _RESULT + ".part"), "wb") as f:
        f.write(data)
    _real_rename(os.path.join(folder, _RESULT + ".part"), os.path.join(folder, _RESULT))
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    real_exit(0)


_real_rename = os.rename

if __name__ == "__main__":
    # run as the package's module, not as __main__: the planner reaches the same _child
    from helpers.memory import sandbox as _module

    _module.main(sys.argv[1:])
