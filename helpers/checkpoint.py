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
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

__all__ = [
    "FORMAT",
    "CheckpointInfo",
    "load_checkpoint",
    "read_checkpoint",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "unwrap",
]

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
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].cpu().numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"].cpu())
    restored = ["python", "numpy", "torch"]
    cuda = list(state.get("cuda", []))
    if cuda and torch.cuda.is_available():
        for i, s in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s.cpu(), i)
        restored.append("cuda")
    return restored


_PLAIN = (type(None), bool, int, float, str)


def _check_plain(value, where: str) -> None:
    """Only what torch.load(weights_only=True) can read back may go into ``extra``."""
    if isinstance(value, _PLAIN) or isinstance(value, torch.Tensor):
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where} has a non-string key {k!r}")
            _check_plain(v, f"{where}[{k!r}]")
        return
    raise TypeError(
        f"{where} is a {type(value).__name__}; a checkpoint holds only tensors, numbers, "
        "strings, None and lists/dicts of them (torch.load(weights_only=True) reads nothing else)"
    )


def _nonneg_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def save_checkpoint(path, *, model: nn.Module, optimizer=None, scaler=None, epoch: int,
                    step: int = 0, extra: dict | None = None) -> Path:
    """Write model, optimizer, GradScaler, RNG states, epoch and step to one file, atomically.

    Args:
        path: file to write (its folder is created). Under DDP call this on rank 0 only.
        model: the model, wrapped in DDP/DataParallel or not: ``model.module`` is saved.
        optimizer: a ``torch.optim.Optimizer`` (or None).
        scaler: a ``torch.amp.GradScaler`` (or None).
        epoch: epochs completed (resume starts at this epoch).
        step: batches already done inside ``epoch`` (0 at an epoch boundary).
        extra: small values to keep (numbers, strings, tensors, lists/dicts of them).

    Returns:
        The path written.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or Path, got {type(path).__name__}")
    plain = unwrap(model)
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
    _nonneg_int(epoch, "epoch")
    _nonneg_int(step, "step")
    extra = {} if extra is None else extra
    if not isinstance(extra, dict):
        raise TypeError(f"extra must be a dict, got {type(extra).__name__}")
    _check_plain(extra, "extra")

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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)  # atomic: readers see the old file or the new one
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_checkpoint(path, map_location="cpu") -> dict:
    """Load a checkpoint written by :func:`save_checkpoint` as a dict (weights_only=True)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or Path, got {type(path).__name__}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    state = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a checkpoint written by save_checkpoint "
                         f"(format {FORMAT!r})")
    return state


@dataclass
class CheckpointInfo:
    """What :func:`load_checkpoint` restored."""

    path: str
    epoch: int
    step: int
    extra: dict = field(default_factory=dict)
    restored: list[str] = field(default_factory=list)

    def text(self) -> str:
        return (f"resumed {Path(self.path).name} at epoch {self.epoch}, step {self.step}; "
                f"restored: {', '.join(self.restored)}")

    def __repr__(self) -> str:
        return self.text()


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
    if not isinstance(restore_rng, bool):
        raise TypeError(f"restore_rng must be True or False, got {restore_rng!r}")
    state = read_checkpoint(path, map_location=map_location)
    restored = []
    weights = state["model"]
    if weights and all(k.startswith("module.") for k in weights):  # saved from a wrapper
        nn.modules.utils.consume_prefix_in_state_dict_if_present(weights, "module.")
    plain.load_state_dict(weights)
    restored.append("model")
    for name, obj in (("optimizer", optimizer), ("scaler", scaler)):
        if obj is None:
            continue
        if state[name] is None:
            raise ValueError(f"{path} holds no {name} state; load it without {name}=")
        obj.load_state_dict(state[name])
        restored.append(name)
    if restore_rng:
        restored += [f"rng:{r}" for r in set_rng_state(state["rng"])]
    return CheckpointInfo(str(path), state["epoch"], state["step"], state["extra"], restored)
