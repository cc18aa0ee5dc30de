"""Mixed precision in PyTorch, made visible (lesson 07).

* :func:`amp_settings`: the autocast dtype for a device and whether a ``GradScaler`` is
  needed (fp16: yes; bf16: no), with the reason, and what "fp32" means there (TF32);
* :func:`tf32_settings`: PyTorch's TF32 switches as they are now, and whether they apply on
  the device (NVIDIA GPUs of compute capability 8.0 and newer), to state with an fp32 baseline;
* :func:`trace_dtypes`: run a function and list the operations that ran, with the dtypes
  they read and produced, so you can see what autocast casts and what it keeps in fp32;
* :func:`compare_memory`: memory reports of the same step in different precisions, side by
  side, with the ratio of each category to a baseline.

Imports torch (load it through ``helpers``: ``helpers.amp_settings``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .core.checks import whole_number
from .core.fmt import ShownAsTable, Table, fmt_bytes, fmt_ratio
from .core.timing import fmt_in_unit
from .memory.engine import device_type, watch_ops

__all__ = ["AmpSettings", "amp_settings", "TF32Settings", "tf32_settings", "trace_dtypes",
           "DtypeTrace", "OpDtypes", "compare_memory", "MemoryComparison", "parse_dtype",
           "short_name", "recorded_tables"]

_DTYPES = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
}
_SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
          torch.float64: "fp64"}


def parse_dtype(dtype) -> torch.dtype:
    """``"bf16"``/``"bfloat16"``/``torch.bfloat16`` or ``"fp16"``/``"float16"``/``"half"``/
    ``torch.float16`` as a torch dtype (the two autocast can use)."""
    if isinstance(dtype, torch.dtype) and dtype in (torch.bfloat16, torch.float16):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    raise ValueError(
        "dtype must be torch.bfloat16 or torch.float16 (or 'bf16', 'bfloat16', 'fp16', "
        f"'float16', 'half'), got {dtype!r}"
    )


def short_name(dtype) -> str:
    """``torch.bfloat16`` -> ``"bf16"`` (other dtypes: their name without ``torch.``)."""
    return _SHORT.get(dtype, str(dtype).removeprefix("torch."))


@dataclass(frozen=True, repr=False)
class AmpSettings(ShownAsTable):
    """How to run mixed precision on one kind of device.

    ``dtype`` is what autocast computes in, ``use_scaler`` whether gradients need loss
    scaling (fp16, whose range is small) or not (bf16, which has fp32's range).
    """

    device_type: str
    dtype: torch.dtype
    use_scaler: bool
    reason: str
    #: the TF32 switches when the settings were made (what an fp32 baseline runs in)
    tf32: TF32Settings | None = None

    @property
    def name(self) -> str:
        return short_name(self.dtype)

    def autocast(self, enabled: bool = True) -> torch.autocast:
        """``torch.amp.autocast(device_type=..., dtype=...)`` for these settings."""
        return torch.amp.autocast(device_type=self.device_type, dtype=self.dtype,
                                  enabled=enabled)

    def grad_scaler(self, **kwargs) -> torch.amp.GradScaler:
        """``torch.amp.GradScaler(device)``, enabled only where it is needed (fp16)."""
        return torch.amp.GradScaler(self.device_type, enabled=self.use_scaler, **kwargs)

    def text(self) -> str:
        scaler = "GradScaler needed" if self.use_scaler else "no GradScaler needed"
        return f"{self.device_type}: autocast to {self.name} ({scaler}): {self.reason}"


def amp_settings(device=None, dtype=None) -> AmpSettings:
    """The autocast dtype to use on ``device`` and whether a ``GradScaler`` is needed.

    Args:
        device: a torch device or its name (default: ``helpers.pick_device()``).
        dtype: insist on ``"bf16"`` or ``"fp16"`` (or the torch dtypes); by default the best
            for the device: bf16 on CPUs and on GPUs that support it (NVIDIA Ampere and
            newer), fp16 on older NVIDIA GPUs and on Apple's MPS.

    Returns:
        :class:`AmpSettings` with ``autocast()`` and ``grad_scaler()`` ready to use, and
        ``tf32``: :func:`tf32_settings` for the device (what its fp32 baseline runs in).
    """
    kind = _amp_device(device)
    if dtype is not None:
        chosen = parse_dtype(dtype)
        reason = "asked for"
    elif kind == "cuda":
        if not torch.cuda.is_available():
            chosen, reason = torch.float16, ("no CUDA GPU here to ask about bf16; every "
                                             "NVIDIA GPU computes fp16")
        elif torch.cuda.is_bf16_supported(including_emulation=False):
            chosen, reason = torch.bfloat16, "this GPU computes bf16 natively"
        else:
            chosen, reason = torch.float16, "bf16 needs an Ampere or newer NVIDIA GPU"
    elif kind == "mps":
        chosen, reason = torch.float16, "Apple GPUs compute fp16 natively"
    else:
        chosen, reason = torch.bfloat16, ("CPU autocast supports bf16 best (fp16 is slow "
                                          "on most CPUs)")
    return AmpSettings(kind, chosen, chosen == torch.float16, reason, tf32_settings(kind))


def _amp_device(device) -> str:
    kind = device_type(device)
    if kind not in ("cpu", "cuda", "mps"):
        raise ValueError(f"mixed precision settings are known for cpu, cuda and mps devices, "
                         f"not {kind!r}")
    return kind


# ------------------------------------------------------------------------------ TF32
# PyTorch's TF32 switches (the fp32_precision API of torch 2.9+; torch's own compiler reads it)
# with their defaults. The older spellings set the same state: allow_tf32 and
# set_float32_matmul_precision("high"). Mixing the two kinds makes the older getters raise a
# RuntimeError, so only the new ones are read here.
_TF32_SWITCHES = (
    ("fp32 matmul (cuBLAS)", "torch.backends.cuda.matmul.fp32_precision",
     lambda: torch.backends.cuda.matmul.fp32_precision, "IEEE fp32"),
    ("cuDNN convolution", "torch.backends.cudnn.conv.fp32_precision",
     lambda: torch.backends.cudnn.conv.fp32_precision, "TF32"),
    ("cuDNN RNN", "torch.backends.cudnn.rnn.fp32_precision",
     lambda: torch.backends.cudnn.rnn.fp32_precision, "TF32"),
)
_TF32_CAPABILITY = (8, 0)


def _runs_in(value: str) -> str:
    """An fp32_precision value in words ("none": not set here, which means IEEE fp32)."""
    return {"tf32": "TF32", "ieee": "IEEE fp32", "none": "IEEE fp32"}.get(value, value)


@dataclass(frozen=True, repr=False)
class TF32Settings(ShownAsTable):
    """PyTorch's TF32 switches and whether they act on one device.

    TF32 is a tensor-core mode of NVIDIA GPUs from Ampere (compute capability 8.0) on: fp32
    inputs are rounded to 10 mantissa bits (fp16's precision, fp32's range) and products are
    summed in fp32. Elsewhere the switches change nothing and fp32 is IEEE fp32.
    """

    device_type: str
    capability: tuple[int, int] | None
    values: tuple[str, ...]   # fp32_precision of matmul, cuDNN conv, cuDNN RNN, as read

    @property
    def applies(self) -> bool:
        """True on an NVIDIA GPU of compute capability 8.0 or newer."""
        return (self.device_type == "cuda" and self.capability is not None
                and tuple(self.capability) >= _TF32_CAPABILITY)

    @property
    def matmul_tf32(self) -> bool:
        """fp32 matrix multiplications run in TF32 on this device."""
        return self.applies and self.values[0] == "tf32"

    @property
    def conv_tf32(self) -> bool:
        """cuDNN convolutions in fp32 run in TF32 on this device."""
        return self.applies and self.values[1] == "tf32"

    def where(self) -> str:
        if self.device_type != "cuda":
            return f"this {self.device_type}"
        if self.capability is None:
            return "cuda without a GPU"
        return f"this GPU (compute capability {self.capability[0]}.{self.capability[1]})"

    def baseline(self) -> str:
        """One line: what an fp32 step runs in here, and what to do about it."""
        if not self.applies:
            why = ("TF32 needs an NVIDIA GPU of compute capability 8.0 or newer"
                   if self.device_type == "cuda" else "TF32 is a mode of NVIDIA GPUs")
            return f"fp32 baseline: IEEE fp32 on {self.where()} ({why}; the switches do nothing)"
        parts = [f"matmuls {_runs_in(self.values[0])}", f"convolutions {_runs_in(self.values[1])}"]
        advice = ("" if self.matmul_tf32 else
                  "; torch.backends.cuda.matmul.fp32_precision = 'tf32' speeds fp32 matmuls up")
        return (f"fp32 baseline on {self.where()}: {', '.join(parts)}: state it with every "
                f"fp32 time{advice}")

    def table(self) -> Table:
        rows = [[what, f"{name} = {value!r}", default,
                 _runs_in(value) if self.applies else "IEEE fp32"]
                for (what, name, _, default), value in zip(_TF32_SWITCHES, self.values,
                                                           strict=True)]
        return Table(["fp32 operation", "switch, as set now", "default",
                      f"runs in on {self.device_type}"], rows)

    def text(self) -> str:
        return f"{self.table().text()}\n{self.baseline()}"

    def _html(self) -> str:
        return f"{self.table()._repr_html_()}<p>{self.baseline()}</p>"


def tf32_settings(device=None) -> TF32Settings:
    """PyTorch's TF32 switches as set now, and whether they act on ``device``.

    Args:
        device: a torch device or its name (default: ``helpers.pick_device()``).

    Returns:
        :class:`TF32Settings`: a table of the switches (``fp32_precision`` of cuBLAS matmuls,
        cuDNN convolutions and RNNs), their defaults, what fp32 runs in on the device, and
        ``baseline()``, the line to print next to an fp32 time. On CUDA the compute
        capability comes from ``torch.cuda.get_device_capability()``.
    """
    kind = _amp_device(device)
    capability = None
    if kind == "cuda" and torch.cuda.is_available():
        capability = tuple(torch.cuda.get_device_capability())
    values = tuple(str(read()) for _, _, read, _ in _TF32_SWITCHES)
    return TF32Settings(kind, capability, values)


# ------------------------------------------------------------------------------ tracing
@dataclass(frozen=True)
class OpDtypes:
    """One ATen operation as it ran: the dtypes it read and produced, and how often."""

    op: str
    inputs: tuple[str, ...]
    output: str
    calls: int


def _float_dtypes(obj, out: list) -> None:
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            out.append(short_name(obj.dtype))
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _float_dtypes(x, out)


@dataclass(frozen=True, repr=False)
class DtypeTrace(ShownAsTable):
    """What :func:`trace_dtypes` saw: one row per (operation, input dtypes, output dtype)."""

    rows: tuple[OpDtypes, ...]
    result: object = None

    def ops_in(self, dtype, skip=("_to_copy",)) -> list[str]:
        """Operations whose output had ``dtype`` ("fp32", "bf16" or a torch dtype), in the
        order they first ran; casts (``_to_copy``) are left out unless ``skip=()``."""
        name = short_name(dtype) if isinstance(dtype, torch.dtype) else str(dtype)
        seen: list[str] = []
        for r in self.rows:
            if r.output == name and r.op not in seen and r.op not in skip:
                seen.append(r.op)
        return seen

    def table(self, skip=("_to_copy",)) -> Table:
        rows = [[r.op, r.output, ", ".join(r.inputs) or "-", r.calls]
                for r in self.rows if r.op not in skip]
        return Table(["operation", "output", "inputs", "calls"], rows)

    @property
    def casts(self) -> int:
        """How many tensors were converted from one dtype to another (``_to_copy``)."""
        return sum(r.calls for r in self.rows if r.op == "_to_copy"
                   and r.inputs and r.inputs[0] != r.output)

    def text(self) -> str:
        return f"{self.table().text()}\ncasts between dtypes: {self.casts}"

    def _html(self) -> str:
        return f"{self.table()._repr_html_()}<p>casts between dtypes: {self.casts}</p>"


def trace_dtypes(fn, *args, **kwargs) -> DtypeTrace:
    """Run ``fn(*args, **kwargs)`` and record every ATen operation with its float dtypes.

    Views (``view``, ``t``, ``detach``, ...) and operations on integer tensors only are left
    out; casts appear as ``_to_copy`` (hidden from the table, counted in ``casts``). Run it
    inside or around ``torch.autocast`` to see which operations autocast moved to bf16/fp16
    and which it kept in fp32. The result of ``fn`` is kept in ``.result``.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a function to run, got {type(fn).__name__}")
    counts: dict[tuple, int] = {}

    def count(op, args, kwargs, out):
        ins: list[str] = []
        _float_dtypes([*args, *kwargs.values()], ins)
        outs: list[str] = []
        _float_dtypes(out, outs)
        if ins or outs:
            key = (op, tuple(ins), outs[0] if outs else "-")
            counts[key] = counts.get(key, 0) + 1

    with watch_ops(count):
        result = fn(*args, **kwargs)
    rows = tuple(OpDtypes(op, ins, out, n) for (op, ins, out), n in counts.items())
    return DtypeTrace(rows, result)


# ------------------------------------------------------------------------------ memory
_ROWS = (("parameters", "parameters"), ("gradients", "gradients"),
         ("optimizer_state", "optimizer state"), ("activations", "activations"),
         ("temporaries", "temporaries"), ("inputs", "inputs"))


@dataclass(frozen=True, repr=False)
class MemoryComparison(ShownAsTable):
    """Memory reports of one step in several variants, side by side (exact bytes)."""

    reports: dict
    baseline: str

    def bytes(self, name: str, category: str = "peak") -> int:
        """Bytes of ``category`` ("peak" or a category such as "activations") in ``name``."""
        if name not in self.reports:
            raise KeyError(f"no report named {name!r}; compared: {', '.join(self.reports)}")
        report = self.reports[name]
        if category == "peak":
            return int(report.peak_bytes)
        if category not in report.category_max:
            raise KeyError(f"unknown category {category!r}; known: peak, "
                           f"{', '.join(report.category_max)}")
        return int(report.category_max[category])

    def ratio(self, name: str, category: str = "peak") -> float:
        """``name``'s bytes of ``category`` divided by the baseline's."""
        base = self.bytes(self.baseline, category)
        return self.bytes(name, category) / base if base else float("nan")

    def _get(self, name: str, category: str) -> int:
        """Like :meth:`bytes`, 0 for a category a report does not have."""
        report = self.reports[name]
        return int(report.peak_bytes if category == "peak" else
                   report.category_max.get(category, 0))

    def table(self) -> Table:
        others = [n for n in self.reports if n != self.baseline]
        headers = ["largest", *self.reports, *(f"{n}/{self.baseline}" for n in others)]
        rows = []
        for key, title in (*_ROWS, ("peak", "peak")):
            values = [self._get(n, key) for n in self.reports]
            if key != "peak" and not any(values):
                continue
            base = self._get(self.baseline, key)
            ratios = [fmt_ratio(self._get(n, key) / base, measured=False) if base else "-"
                      for n in others]
            rows.append([title, *(fmt_bytes(v) for v in values), *ratios])
        phases = [getattr(self.reports[n], "peak_phase", None) for n in self.reports]
        if all(phases):
            rows.append(["peak during", *phases, *([""] * len(others))])
        return Table(headers, rows)


def compare_memory(reports: Mapping, baseline: str | None = None) -> MemoryComparison:
    """Put memory reports of the same step side by side (``helpers.measure_step`` reports).

    Args:
        reports: ``{"fp32": report, "bf16": report, ...}``: two or more reports with
            ``peak_bytes`` and ``category_max`` (``MemoryReport``).
        baseline: the report the ratios divide by (default: the first).

    Returns:
        A :class:`MemoryComparison`: a table of each category's largest size and the peak,
        with exact ratios, and ``bytes(name, category)`` / ``ratio(name, category)``.
    """
    if not isinstance(reports, Mapping) or len(reports) < 2:
        raise TypeError("reports must be a dict of two or more {name: MemoryReport}")
    for name, report in reports.items():
        if not isinstance(name, str):
            raise TypeError(f"report names must be strings, got {name!r}")
        if not isinstance(getattr(report, "category_max", None), Mapping) \
                or getattr(report, "peak_bytes", None) is None:
            raise TypeError(f"report {name!r} is not a memory report with a peak "
                            f"(got {type(report).__name__}); use helpers.measure_step")
        whole_number(report.peak_bytes, f"report {name!r}'s peak_bytes")
        for key, value in report.category_max.items():
            whole_number(value, f"report {name!r}'s category_max[{key!r}]")
    baseline = next(iter(reports)) if baseline is None else baseline
    if baseline not in reports:
        raise ValueError(f"baseline {baseline!r} is not one of {', '.join(reports)}")
    return MemoryComparison(dict(reports), baseline)


# ------------------------------------------------------------------------------ recorded
def _by_precision(rows, key, fmt, what, ratio, versus, title) -> Table:
    """One row per (model, batch): ``row[key]`` by precision, then each one against fp32."""
    names = [p for p in ("fp32", "bf16", "fp16") if any(p in row[key] for row in rows)]
    others = [p for p in names if p != "fp32"]
    body = [[row["model"], row["batch"],
             *(fmt(row[key][p]) if p in row[key] else "-" for p in names),
             *(ratio(row[key], p) if p in row[key] and row[key].get("fp32") else "-"
               for p in others)] for row in rows]
    return Table(["model", "batch", *(f"{p} {what}" for p in names),
                  *(f"{p}{versus}" for p in others)], body, title=title)


def recorded_tables(recorded) -> list[Table]:
    """Tables of the figures ``tests/gpu/test_amp_gpu.py`` recorded on a GPU (lesson 07).

    Args:
        recorded: what ``helpers.recorded_gpu_results("amp")`` returned (or its ``data``).

    Returns:
        Tables for memory, PyTorch speed and Keras speed (those present). Memory figures are
        exact bytes; times and speed-ups were measured, so they carry a ``~``.
    """
    data = getattr(recorded, "data", recorded)
    if not isinstance(data, Mapping):
        raise TypeError("recorded must be helpers.recorded_gpu_results('amp') or its data "
                        f"dict, got {type(recorded).__name__}")
    tables = []
    if data.get("memory"):
        tables.append(_by_precision(
            data["memory"], "peak_bytes", fmt_bytes, "peak",
            lambda v, p: fmt_ratio(v[p] / v["fp32"], measured=False), "/fp32",
            "GPU memory, 2 Adam steps (max_memory_allocated)"))
    if data.get("speed"):
        tables.append(_by_precision(
            data["speed"], "seconds", fmt_in_unit, "step",
            lambda v, p: fmt_ratio(v["fp32"] / v[p]), " speed-up",
            "GPU time per training step (best of interleaved rounds)"))
    keras = data.get("keras") or {}
    if keras.get("seconds"):
        secs = keras["seconds"]
        rows = [[policy, fmt_in_unit(t), "baseline" if policy == "float32" else
                 fmt_ratio(secs["float32"] / t) if "float32" in secs else "-"]
                for policy, t in secs.items()]
        tables.append(Table(["Keras policy", "step", "speed-up"], rows,
                            title=f"Keras on the GPU, Dense {keras.get('width')} x batch "
                                  f"{keras.get('batch')}"))
    return tables
