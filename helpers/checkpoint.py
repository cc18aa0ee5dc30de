"""Save training state and resume exactly where a run stopped (lesson 03, ddp_train.py).

One file holds everything a run needs to continue: the model's weights (unwrapped from
DistributedDataParallel or DataParallel, so they load into a plain model), the optimizer
and GradScaler state, every random-number generator (Python, NumPy, torch CPU and CUDA),
the epoch and step, and any small ``extra`` values (e.g. running loss sums).

Files are written atomically (a temporary file, then a rename), so a job killed while
saving leaves the previous checkpoint intact, and read with ``torch.load(...,
weights_only=True)``, the safe default since PyTorch 2.6: a checkpoint holds tensors,
numbers, strings and containers of them, never pickled code. Each temporary name is unique
to its writer (host, process, thread), the temporary files a killed save left are removed by
the next save to the same path, and only a regular file or a new path is ever replaced (never
a symlink, FIFO or device node). A sha256 of the contents is stored and checked on load, so
one changed byte is a ValueError (files saved before the checksum was stored load as before).
A refused load changes nothing: every part is checked before any is applied. Imports torch.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pickle
import random
import socket
import stat
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .core.checks import device_arg, flag, shown, text, whole_number
from .core.fmt import ShownAsTable

__all__ = ["FORMAT", "CheckpointInfo", "load_checkpoint", "read_checkpoint", "rng_state",
           "save_checkpoint", "set_rng_state", "unwrap"]

FORMAT = "gpu-lessons-checkpoint/1"
_WRAPPERS = (nn.parallel.DistributedDataParallel, nn.DataParallel)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside a DDP/DataParallel wrapper (or the model itself)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    while isinstance(model, _WRAPPERS):
        model = model.module
    return model


def rng_state() -> dict:
    """Every RNG state a training loop may use: Python, NumPy, torch CPU and all CUDA devices."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    return {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> list[str]:
    """Restore what :func:`rng_state` returned; returns the generators restored.

    All or nothing: a state with any bad part (a wrong-size torch state, a broken NumPy or
    CUDA part) is a ValueError and leaves every generator as it was.
    """
    if not isinstance(state, dict) or not {"python", "numpy", "torch"} <= set(state):
        raise ValueError("state must be a dict from rng_state() with keys python, numpy, "
                         f"torch (and cuda); got {type(state).__name__}")
    before = rng_state()
    try:
        version, internal, gauss = state["python"]
        n = state["numpy"]
        numpy_state = (n["kind"], n["keys"].cpu().numpy().astype(np.uint32), n["pos"],
                       n["has_gauss"], n["gauss"])
        torch_state = state["torch"].cpu()
        cuda = state.get("cuda", [])
        if not isinstance(cuda, (list, tuple)) or \
                not all(isinstance(c, torch.Tensor) for c in cuda):
            raise TypeError("its cuda part is not a list of tensors")
        cuda = [c.cpu() for c in cuda]
        random.setstate((version, tuple(internal), gauss))
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        restored = ["python", "numpy", "torch"]
        if cuda and torch.cuda.is_available():
            for i, s in enumerate(cuda[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(s, i)
            restored.append("cuda")
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError, IndexError) as exc:
        _put_back(before)
        raise ValueError(f"state is not what rng_state() returned ({type(exc).__name__}: "
                         f"{str(exc)[:200]}); no generator was changed") from None
    return restored


def _put_back(before: dict) -> None:
    """Restore a state that :func:`rng_state` just returned (known good)."""
    random.setstate(before["python"])
    n = before["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["gauss"]))
    torch.set_rng_state(before["torch"])
    for i, s in enumerate(before["cuda"]):
        torch.cuda.set_rng_state(s, i)


_DEEPEST = 100  # nesting levels allowed in ``extra`` (pickle itself fails near 1,000)


def _plain(value, where: str, path: tuple = ()):
    """``value`` as exactly what ``torch.load(weights_only=True)`` reads back: NumPy scalars
    and subclasses of bool/int/float/str/list/tuple/dict become the plain built-in (the
    loader refuses even a ``np.float64``, a ``defaultdict`` or an ``IntEnum``); anything else,
    a non-string key, a cycle or nesting deeper than 100 levels is an error naming the part.
    """
    if value is None or isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    for kind in (int, float, str):
        if isinstance(value, kind):
            return kind.__str__(value) if kind is str else kind(value)
    if isinstance(value, np.generic) and value.ndim == 0 and value.dtype.kind in "iuf":
        return value.item()
    if not isinstance(value, (list, tuple, dict)):
        raise TypeError(
            f"{where} is a {type(value).__name__}; a checkpoint holds only tensors, numbers, "
            "strings, None and lists/dicts of them (torch.load(weights_only=True) reads "
            "nothing else)")
    if any(value is seen for seen in path):
        raise ValueError(f"{where} contains itself (a cycle); a checkpoint holds trees only")
    if len(path) >= _DEEPEST:
        raise ValueError(f"extra is nested more than {_DEEPEST} levels deep (at {where[:80]}...)")
    inner = (*path, value)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where} has a non-string key {shown(k)}")
            out[str.__str__(k)] = _plain(v, f"{where}[{k!r}]", inner)
        return out
    items = [_plain(v, f"{where}[{i}]", inner) for i, v in enumerate(value)]
    return tuple(items) if isinstance(value, tuple) else items


def _file(path) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or Path, got {type(path).__name__}")
    if "\0" in text(os.fspath(path), "path", longest=4096):
        raise ValueError(f"path holds a NUL character: {shown(os.fspath(path))}")
    path = Path(path)
    if len(os.fsencode(path.name)) > _NAME_MAX:
        raise ValueError(f"path's file name is {len(os.fsencode(path.name))} bytes long; a "
                         f"file name holds at most {_NAME_MAX} bytes: {shown(path.name)}")
    return path


def _check_parts(optimizer, scaler) -> None:
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")


def _real_weights(plain: nn.Module) -> dict:
    """``plain.state_dict()``, refused (ValueError naming ``model``) when a tensor holds no
    data: a meta-device or fake-tensor model would save a file no real model can load."""
    from .memory.virtual import is_fake  # torch's private names stay in helpers/memory

    weights = plain.state_dict()
    for name, t in weights.items():
        if isinstance(t, torch.Tensor) and (t.is_meta or is_fake(t)):
            kind = "on the meta device" if t.is_meta else f"a {type(t).__name__}"
            raise ValueError(f"model's {name!r} is {kind}: it holds no data to save; "
                             "save a model whose weights are real tensors (e.g. after "
                             "model.to_empty(device=...) and loading its weights)")
    return weights


def _writable(path: Path, what: str = "path") -> None:
    """Refuse to replace anything but a regular file: a device node, FIFO, socket or
    symlink at ``path`` would be replaced by the rename (as root, /dev/null too)."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # a new path (its folder is made later)
        return
    if stat.S_ISDIR(mode):
        raise ValueError(f"{what} {path} is a folder; give the checkpoint's file name")
    if not stat.S_ISREG(mode):
        kind = ("a symbolic link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a device node" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise ValueError(f"{what} {path} is {kind}: a checkpoint is written only to a "
                         "regular file or a new path (saving replaces what is there)")


_NAME_MAX = 255  # bytes in one file name (ext4, XFS, APFS, NTFS)
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def _temp_prefix(path: Path) -> str:
    """``.NAME.HASH.`` where NAME is the file's name cut short enough that a temp name fits
    in NAME_MAX (a legal 250-character name stays legal) and HASH tells apart long names
    that share their start."""
    name = path.name
    tag = hashlib.sha256(os.fsencode(name)).hexdigest()[:8]
    while len(os.fsencode(name)) > _NAME_MAX - 64:
        name = name[:-1]
    return f".{name}.{tag}."


def _temp_name(path: Path) -> Path:
    """A temp name unique to this writer (host, process, thread, random) beside ``path``."""
    name = (f"{_temp_prefix(path)}{_HOST}-{os.getpid()}-{threading.get_native_id()}-"
            f"{os.urandom(4).hex()}.tmp")
    return path.with_name(name)


def _remove_stale_temps(path: Path) -> list[Path]:
    """Delete temp files that a killed save to ``path`` on this host left behind (their
    writer process no longer exists); returns what was removed."""
    prefix = _temp_prefix(path)
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    legacy = f".{path.name}.tmp"  # the name earlier versions of the kit used: .NAME.tmpPID
    for entry in entries:
        if entry.name.startswith(legacy) and entry.name[len(legacy):].isdigit():
            pid = int(entry.name[len(legacy):])
        elif entry.name.startswith(prefix) and entry.name.endswith(".tmp"):
            parts = entry.name[len(prefix):-len(".tmp")].split("-")
            if len(parts) != 4 or parts[0] != _HOST or not parts[1].isdigit():
                continue  # another host's writer (a shared file system): it may be running
            pid = int(parts[1])
        else:
            continue
        try:
            os.kill(pid, 0)
            continue  # the writer is alive
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue
        try:
            if entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            pass
    return removed


def _digest(value, h) -> None:
    """Feed a checkpoint's contents into hash ``h`` in a fixed order, tensors as raw bytes."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.layout != torch.strided:
            t = t.to_dense()
        t = t.cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, dict):
        h.update(f"D{len(value)}".encode())
        for k, v in value.items():
            _digest(k, h)
            _digest(v, h)
    elif isinstance(value, (list, tuple)):
        h.update(f"{'L' if isinstance(value, list) else 'U'}{len(value)}".encode())
        for v in value:
            _digest(v, h)
    else:
        h.update(f"V{type(value).__name__}:{value!r};".encode())


def _checksum(state: dict) -> str:
    """sha256 of every part of ``state`` except the checksum itself."""
    h = hashlib.sha256()
    _digest({k: v for k, v in state.items() if k != "sha256"}, h)
    return h.hexdigest()


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _write_failed(exc: BaseException) -> bool:
    """Whether ``exc`` from torch.save means the disk (or a quota/file-size limit) ran out."""
    if isinstance(exc, OSError):
        return exc.errno in _DISK_FULL
    return isinstance(exc, RuntimeError) and any(
        words in str(exc) for words in ("unexpected pos", "PytorchStreamWriter failed writing",
                                        "No space left"))


def save_checkpoint(path, *, model: nn.Module, optimizer=None, scaler=None, epoch: int,
                    step: int = 0, extra: dict | None = None) -> Path:
    """Write model, optimizer, GradScaler, RNG states, epoch and step to one file, atomically.

    The file is written under a temporary name and read back (``weights_only=True``) before
    it replaces ``path``, so a save never leaves an unreadable checkpoint where a good one was;
    a full disk is an OSError (ENOSPC) that names the file and says the old one was kept.

    Args:
        path: file to write (its folder is created): a regular file or a new path, never a
            symlink, FIFO or device node. Under DDP call this on rank 0 only.
        model: the model, wrapped in DDP/DataParallel or not: ``model.module`` is saved. A
            model on the meta device or made of fake tensors is refused (it holds no data).
        optimizer: a ``torch.optim.Optimizer`` (or None).
        scaler: a ``torch.amp.GradScaler`` (or None).
        epoch: epochs completed (resume starts at this epoch).
        step: batches already done inside ``epoch`` (0 at an epoch boundary).
        extra: small values to keep (numbers, strings, tensors, lists/dicts of them). NumPy
            scalars (``np.mean(...)``) and subclasses of the built-in types are stored as the
            plain built-in, which is what loading returns.

    Returns:
        The path written.
    """
    path = _file(path)
    plain = unwrap(model)
    weights = _real_weights(plain)
    _check_parts(optimizer, scaler)
    epoch = whole_number(epoch, "epoch")
    step = whole_number(step, "step")
    extra = {} if extra is None else extra
    if not isinstance(extra, dict):
        raise TypeError(f"extra must be a dict, got {type(extra).__name__}")
    extra = _plain(extra, "extra")

    state = {
        "format": FORMAT,
        "epoch": epoch,
        "step": step,
        "model": weights,
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": rng_state(),
        "extra": extra,
    }
    _writable(path)
    state["sha256"] = _checksum(state)  # load_checkpoint recomputes it: damage is detected
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(path)  # left by a save that was killed (kill -9, a node lost)
    tmp = _temp_name(path)  # unique per writer: two threads never share one
    try:
        try:
            torch.save(state, tmp)
        except (OSError, RuntimeError) as exc:
            if not _write_failed(exc):
                raise
            kept = (f"the previous checkpoint at {path} was kept unchanged" if path.exists()
                    else f"no file was written at {path}")
            raise OSError(errno.ENOSPC, f"could not save the checkpoint {path}: the disk (or "
                          f"a quota or file-size limit) ran out while writing it "
                          f"({type(exc).__name__}: {' '.join(str(exc).split())[:160]}); "
                          f"{kept}. Free some space and save again") from None
        _load(tmp, "cpu", shown=path)  # it must read back before it replaces the old file
        _writable(path)  # nothing else appeared there meanwhile
        os.replace(tmp, path)  # atomic: readers see the old file or the new one
    finally:
        tmp.unlink(missing_ok=True)
    return path


# the parts of a checkpoint and the types they must have
_PARTS = {"epoch": int, "step": int, "model": dict, "optimizer": (dict, type(None)),
          "scaler": (dict, type(None)), "rng": dict, "extra": dict}


def _load(path: Path, map_location, shown: Path) -> dict:
    """Read ``path`` with ``weights_only=True``; every way it can be damaged or foreign is a
    ValueError that names ``shown`` and what is wrong."""
    problem = f"{shown} is not a checkpoint written by save_checkpoint (format {FORMAT!r})"
    if path.stat().st_size == 0:
        raise ValueError(f"{problem}: the file is empty")
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": we say it better
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError, KeyError, ValueError,
            TypeError, AttributeError) as exc:
        # torch's own message suggests weights_only=False: never do that for a file you did
        # not write yourself, it runs whatever code the file holds
        if "Unsupported global" in str(exc):  # a pickled class or function
            raise ValueError(f"{problem}: it holds objects other than tensors, numbers, "
                             "strings and containers of them") from None
        raise ValueError(f"{problem}: it is not a PyTorch file, or it is cut short "
                         f"({type(exc).__name__} while reading it)") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(problem)
    for part, kind in _PARTS.items():
        if part not in state or not isinstance(state[part], kind) or \
                isinstance(state[part], bool):
            raise ValueError(f"{shown} is damaged: its {part!r} part is missing or has the "
                             "wrong type")
    if not all(isinstance(k, str) for k in state["model"]):
        raise ValueError(f"{shown} is damaged: its model weights are not a state_dict")
    if "sha256" in state:  # files saved before checksums were stored have none
        if not isinstance(state["sha256"], str) or state["sha256"] != _checksum(state):
            raise ValueError(f"{shown} is damaged: its contents do not match the sha256 "
                             "checksum stored when it was saved (a changed byte, e.g. a "
                             "disk or copy error)")
    return state


def read_checkpoint(path, map_location="cpu") -> dict:
    """Load a checkpoint written by :func:`save_checkpoint` as a dict (weights_only=True).

    A missing file is a FileNotFoundError; an empty, cut-short, foreign or damaged file
    (one whose contents no longer match their stored sha256) a ValueError naming the file and
    what is wrong. The dict holds the parts only: the checksum, once verified, is left out.
    """
    path = _file(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    state = _load(path, device_arg(map_location, "map_location"), shown=path)
    state.pop("sha256", None)
    return state


@dataclass(repr=False)
class CheckpointInfo(ShownAsTable):
    """What :func:`load_checkpoint` restored."""

    path: str
    epoch: int
    step: int
    extra: dict = field(default_factory=dict)
    restored: list[str] = field(default_factory=list)

    def text(self) -> str:
        return (f"resumed {Path(self.path).name} at epoch {self.epoch}, step {self.step}; "
                f"restored: {', '.join(self.restored)}")


def load_checkpoint(path, *, model: nn.Module, optimizer=None, scaler=None,
                    map_location="cpu", restore_rng: bool = True) -> CheckpointInfo:
    """Restore what :func:`save_checkpoint` wrote into ``model`` (and optimizer, scaler, RNGs).

    Args:
        path: the checkpoint file.
        model: a model of the same architecture, plain or wrapped in DDP/DataParallel.
        optimizer, scaler: restored when given (the checkpoint must hold their state).
        map_location: where tensors are loaded: ``"cpu"`` (default, always works), a
            device such as ``"cuda:0"`` or ``torch.device(...)``. A checkpoint saved on a
            GPU loads on a machine without one only through ``map_location="cpu"``.
        restore_rng: also restore Python, NumPy, torch and CUDA random states.

    Returns:
        A :class:`CheckpointInfo` with the epoch, step and extra values.
    """
    plain = unwrap(model)
    _check_parts(optimizer, scaler)
    flag(restore_rng, "restore_rng")
    state = read_checkpoint(path, map_location=map_location)
    weights = state["model"]
    if weights and all(k.startswith("module.") for k in weights):  # saved from a wrapper
        nn.modules.utils.consume_prefix_in_state_dict_if_present(weights, "module.")
    parts = {"model": (plain, weights), "optimizer": (optimizer, state["optimizer"]),
             "scaler": (scaler, state["scaler"])}
    # check every part first: a refusal must leave the model, optimizer, scaler and RNGs
    # as they were (torch's load_state_dict copies the layers that fit before it complains)
    for name, (obj, saved) in parts.items():
        if obj is None:
            continue
        if saved is None:
            raise ValueError(f"{path} holds no {name} state; load it without {name}=")
        problem = _MISFITS[name](obj, saved)
        if problem:
            raise ValueError(f"{path} was saved from a different {name} than the {name}= "
                             f"given ({problem[:400]}); nothing was changed")
    if restore_rng:
        _check_rng(state["rng"], path)
    restored = []
    for name, (obj, saved) in parts.items():
        if obj is None:
            continue
        try:
            obj.load_state_dict(saved)
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as exc:
            said = " ".join(str(exc).split())
            raise ValueError(f"{path} was saved from a different {name} than the {name}= "
                             f"given ({type(exc).__name__}: {said[:400]})") from None
        restored.append(name)
    if restore_rng:
        restored += [f"rng:{r}" for r in set_rng_state(state["rng"])]
    return CheckpointInfo(str(path), state["epoch"], state["step"], state["extra"], restored)


def _model_misfit(model: nn.Module, saved: dict) -> str:
    """What torch's strict load_state_dict would refuse, found without changing the model."""
    current = model.state_dict()
    missing = [k for k in current if k not in saved]
    unexpected = [k for k in saved if k not in current]
    if missing or unexpected:
        return (f"Missing key(s) in state_dict: {', '.join(missing[:5]) or 'none'}; "
                f"unexpected key(s): {', '.join(unexpected[:5]) or 'none'}")
    for k, mine in current.items():
        theirs = saved[k]
        if isinstance(mine, torch.Tensor) != isinstance(theirs, torch.Tensor):
            return f"{k} is {'not ' if isinstance(mine, torch.Tensor) else ''}a tensor"
        if isinstance(mine, torch.Tensor) and theirs.shape != mine.shape:
            return (f"size mismatch for {k}: copying a param with shape {tuple(theirs.shape)} "
                    f"from checkpoint, the shape in current model is {tuple(mine.shape)}")
    return ""


def _optimizer_misfit(optimizer, saved: dict) -> str:
    """What Optimizer.load_state_dict would refuse (its own checks, made first)."""
    groups, theirs = optimizer.param_groups, saved.get("param_groups")
    if not isinstance(saved.get("state"), dict) or not isinstance(theirs, list) or \
            not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in theirs):
        return "its optimizer state is not an Optimizer.state_dict()"
    if len(groups) != len(theirs):
        return (f"{len(theirs)} parameter group(s) saved, the optimizer has {len(groups)}")
    sizes = [len(g["params"]) for g in groups], [len(g["params"]) for g in theirs]
    if sizes[0] != sizes[1]:
        return (f"parameter groups of sizes {sizes[1]} saved, the optimizer's are "
                f"{sizes[0]}")
    ids = {i for g in theirs for i in g["params"]}
    if not set(saved["state"]) <= ids:
        return "its optimizer state names parameters its groups do not hold"
    return ""


def _scaler_misfit(scaler, saved: dict) -> str:
    """What GradScaler.load_state_dict would refuse."""
    if not scaler.is_enabled():
        return ""
    if not saved:
        return "the saved GradScaler was disabled; this one is enabled"
    needed = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
    missing = [k for k in needed if k not in saved]
    return f"the GradScaler state lacks {', '.join(missing)}" if missing else ""


_MISFITS = {"model": _model_misfit, "optimizer": _optimizer_misfit, "scaler": _scaler_misfit}


def _check_rng(state, path) -> None:
    """Refuse a checkpoint whose RNG part :func:`set_rng_state` would refuse, before any
    other part is applied (set_rng_state is tried, then the generators are put back)."""
    before = rng_state()
    try:
        set_rng_state(state)
    except ValueError as exc:
        raise ValueError(f"{path} is damaged: its rng part: {exc}") from None
    finally:
        _put_back(before)
