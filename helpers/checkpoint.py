"""Save training state and resume exactly where a run stopped (lesson 03, ddp_train.py).

One file holds everything a run needs to continue: the model's weights (unwrapped from
DistributedDataParallel or DataParallel, so they load into a plain model), the optimizer
and GradScaler state, every random-number generator (Python, NumPy, torch CPU and CUDA),
the epoch and step, and any small ``extra`` values (e.g. running loss sums).

Files are written atomically (a temporary file, then a rename), so a job killed while
saving leaves the previous checkpoint intact, and read with ``torch.load(...,
weights_only=True)``, the safe default since PyTorch 2.6: a checkpoint holds tensors,
numbers, strings and containers of them, never pickled code. Imports torch.
"""

from __future__ import annotations

import os
import pickle
import random
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
    """Restore what :func:`rng_state` returned; returns the generators restored."""
    if not isinstance(state, dict) or not {"python", "numpy", "torch"} <= set(state):
        raise ValueError("state must be a dict from rng_state() with keys python, numpy, "
                         f"torch (and cuda); got {type(state).__name__}")
    try:
        version, internal, gauss = state["python"]
        n = state["numpy"]
        numpy_state = (n["kind"], n["keys"].cpu().numpy().astype(np.uint32), n["pos"],
                       n["has_gauss"], n["gauss"])
        torch_state = state["torch"].cpu()
        random.setstate((version, tuple(internal), gauss))
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
        raise ValueError(f"state is not what rng_state() returned ({type(exc).__name__}: "
                         f"{str(exc)[:200]})") from None
    restored = ["python", "numpy", "torch"]
    cuda = list(state.get("cuda", []))
    if cuda and torch.cuda.is_available():
        for i, s in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s.cpu(), i)
        restored.append("cuda")
    return restored


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
    return Path(path)


def _check_parts(optimizer, scaler) -> None:
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")


def save_checkpoint(path, *, model: nn.Module, optimizer=None, scaler=None, epoch: int,
                    step: int = 0, extra: dict | None = None) -> Path:
    """Write model, optimizer, GradScaler, RNG states, epoch and step to one file, atomically.

    The file is written under a temporary name and read back (``weights_only=True``) before
    it replaces ``path``, so a save never leaves an unreadable checkpoint where a good one was.

    Args:
        path: file to write (its folder is created). Under DDP call this on rank 0 only.
        model: the model, wrapped in DDP/DataParallel or not: ``model.module`` is saved.
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
        "model": plain.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": rng_state(),
        "extra": extra,
    }
    if path.is_dir():
        raise ValueError(f"path {path} is a folder; give the checkpoint's file name")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        torch.save(state, tmp)
        _load(tmp, "cpu", shown=path)  # it must read back before it replaces the old file
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
    return state


def read_checkpoint(path, map_location="cpu") -> dict:
    """Load a checkpoint written by :func:`save_checkpoint` as a dict (weights_only=True).

    A missing file is a FileNotFoundError; an empty, cut-short, foreign or damaged file a
    ValueError naming the file and what is wrong.
    """
    path = _file(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    return _load(path, device_arg(map_location, "map_location"), shown=path)


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
    restored = []
    weights = state["model"]
    if weights and all(k.startswith("module.") for k in weights):  # saved from a wrapper
        nn.modules.utils.consume_prefix_in_state_dict_if_present(weights, "module.")
    parts = {"model": (plain, weights), "optimizer": (optimizer, state["optimizer"]),
             "scaler": (scaler, state["scaler"])}
    for name, (obj, saved) in parts.items():
        if obj is None:
            continue
        if saved is None:
            raise ValueError(f"{path} holds no {name} state; load it without {name}=")
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
