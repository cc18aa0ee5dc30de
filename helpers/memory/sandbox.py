"""The planner's own process: a training script planned by :func:`~.planner.will_it_fit` runs
here, never in the caller's process (lesson 10).

``will_it_fit`` starts ``python -m helpers.memory.sandbox FOLDER FD`` once per plan (the main
run, the fixes and the batch search all run in it), in a session of its own, with the working
folder where the caller is. The arguments go in, and the :class:`~.planner.Plan` (or the
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


def in_child() -> bool:
    """Is this the planner's own process (where the script may run)?"""
    return _child is not None


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
    proc = None
    read_fd = write_fd = -1
    try:
        with open(os.path.join(folder, _REQUEST), "wb") as f:
            pickle.dump({"call": call, "pythonpath": os.environ.get("PYTHONPATH")}, f)
        read_fd, write_fd = os.pipe()
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_KIT_ROOT, os.environ.get("PYTHONPATH")) if p)
        proc = subprocess.Popen(
            [sys.executable, "-m", "helpers.memory.sandbox", folder, str(write_fd)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(write_fd,), start_new_session=True, env=env)
        os.close(write_fd)
        write_fd = -1
        timed_out = _relay(proc, read_fd, time_limit)
        _kill_group(proc)
        _drain(proc)
        result = None
        path = os.path.join(folder, _RESULT)
        if not timed_out and os.path.exists(path):
            with open(path, "rb") as f:
                result = pickle.load(f)
    finally:
        if proc is not None:
            _kill_group(proc)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        for fd in (read_fd, write_fd):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
    if timed_out:
        raise PlanError(
            f"the script did not stop within time_limit={time_limit:g} s (+ a grace of "
            f"{_grace(time_limit):.0f} s): the planner ended its process. A bare `except:` "
            "around the training loop swallows the planner's stop (catch Exception instead), "
            "or a call never returned.", kind="time")
    if result is None:
        code = proc.returncode
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


def _write(stream_name: str, decoder, data: bytes) -> None:
    text_ = decoder.decode(data)
    if text_:
        stream = getattr(sys, stream_name)  # looked up each time: pytest's capsys swaps it
        stream.write(text_)
        stream.flush()


def _relay(proc, beat_fd: int, time_limit: float) -> bool:
    """Relay the child's output until it exits; True when it overstayed its time (then the
    caller kills it). A byte on ``beat_fd`` starts a run: the limit counts from there."""
    import codecs

    decoders = {proc.stdout.fileno(): ("stdout", codecs.getincrementaldecoder("utf-8")("replace")),
                proc.stderr.fileno(): ("stderr", codecs.getincrementaldecoder("utf-8")("replace"))}
    sel = selectors.DefaultSelector()
    for fd in (*decoders, beat_fd):
        sel.register(fd, selectors.EVENT_READ)
    deadline = time.monotonic() + STARTUP_S + time_limit + _grace(time_limit)
    try:
        while True:
            for key, _ in sel.select(timeout=0.1):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fd)
                elif key.fd == beat_fd:
                    deadline = time.monotonic() + time_limit + _grace(time_limit)
                else:
                    _write(*decoders[key.fd], data)
            if proc.poll() is not None:
                return False
            if time.monotonic() > deadline:
                return True
    finally:
        sel.close()
        proc._relay_decoders = decoders  # what _drain goes on with


def _drain(proc, seconds: float = 2.0) -> None:
    """What the child wrote before it ended (its group is dead: the pipes reach EOF, unless a
    process that left the group holds them; then give up after ``seconds``)."""
    decoders = getattr(proc, "_relay_decoders", {})
    open_fds = dict(decoders)
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
                    _write(*decoders[key.fd], data)
    for name, decoder in decoders.values():
        _write(name, decoder, b"")


def _kill_group(proc) -> None:
    """Kill the child's process group (its session: the script's subprocesses too)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not refused
        pass


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
    """The child: ``python -m helpers.memory.sandbox FOLDER FD``."""
    global _child
    folder, beat_fd = argv[0], int(argv[1])
    real_exit = os._exit
    with open(os.path.join(folder, _REQUEST), "rb") as f:
        request = pickle.load(f)
    real_open = open
    _watch_parent()
    sys.dont_write_bytecode = True
    if request["pythonpath"] is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = request["pythonpath"]
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
