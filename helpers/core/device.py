"""``device_report()``: what hardware and software this kernel has (lesson 00).

The report is one object: print it for text, display it in a notebook for an HTML table.
With no GPU it says so plainly and what the lessons will do instead.
"""

from __future__ import annotations

import html
import os
import platform
import sys
from dataclasses import dataclass, field

from . import environment
from .checks import flag
from .fmt import ShownAsTable, fmt_gib

__all__ = ["DeviceReport", "GpuRow", "device_report"]

NO_GPU_PLAN = (
    "No GPU here. Every lesson still runs: code picks the device with pick_device(), "
    "memory lessons use the virtual GPU (exact accounting on the CPU, real "
    "torch.OutOfMemoryError), multi-GPU lessons use 2 CPU processes over gloo and 2 logical "
    "TensorFlow devices, and GPU-only timings are shown as recorded results, clearly labelled."
)


@dataclass(frozen=True)
class GpuRow:
    index: int
    name: str
    total_bytes: int
    source: str  # "NVML" or "torch"


@dataclass(repr=False)
class DeviceReport(ShownAsTable):
    python: str
    platform: str
    cpu_cores: int
    ram_bytes: int
    torch: str | None = None
    torch_cuda_available: bool = False
    torch_cuda_version: str | None = None
    cudnn_version: str | None = None
    mps_available: bool = False
    driver: str | None = None
    nvml_note: str = ""
    gpus: list[GpuRow] = field(default_factory=list)
    tensorflow: str | None = None
    tf_built_with_cuda: bool | None = None
    tf_devices: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus) or self.torch_cuda_available

    def rows(self) -> list[tuple[str, str]]:
        rows = [
            ("Python", self.python),
            ("Platform", self.platform),
            ("CPU cores", str(self.cpu_cores)),
            ("RAM", fmt_gib(self.ram_bytes, 1)),
            ("PyTorch", self.torch or "not installed"),
        ]
        if self.torch:
            cuda = "yes" if self.torch_cuda_available else "no"
            if self.torch_cuda_version:
                cuda += f" (built for CUDA {self.torch_cuda_version})"
            else:
                cuda += " (CPU-only build)"
            rows.append(("  CUDA usable", cuda))
            if self.cudnn_version:
                rows.append(("  cuDNN", self.cudnn_version))
            rows.append(("  Apple MPS usable", "yes" if self.mps_available else "no"))
        rows.append(("NVIDIA driver", self.driver or f"none ({self.nvml_note})"))
        rows += [(f"GPU {g.index}", f"{g.name}, {fmt_gib(g.total_bytes, 1)} ({g.source})")
                 for g in self.gpus] or [("GPUs", "none")]
        rows.append(("TensorFlow", self.tensorflow or "not installed / not checked"))
        if self.tensorflow:
            rows += [("  built with CUDA", "yes" if self.tf_built_with_cuda else "no"),
                     ("  physical devices", ", ".join(self.tf_devices) or "none")]
        return rows

    def text(self) -> str:
        rows = self.rows()
        width = max(len(k) for k, _ in rows)
        lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
        lines += [f"Note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _html(self) -> str:
        body = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
            f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
            for k, v in self.rows()
        )
        notes = "".join(f"<p>{html.escape(n)}</p>" for n in self.notes)
        return f"<table>{body}</table>{notes}"


def _ram_bytes() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:  # pragma: no cover
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def device_report(*, tensorflow: bool = True) -> DeviceReport:
    """Collect versions, GPUs and TensorFlow devices into one :class:`DeviceReport`.

    Args:
        tensorflow: also import TensorFlow (quietly) and list its physical devices. Costs a
            few seconds the first time; pass False to skip.
    """
    flag(tensorflow, "tensorflow")
    from .nvml import list_gpus, nvml_status

    report = DeviceReport(
        python=platform.python_version(),
        platform=f"{platform.system()} {platform.machine()}",
        cpu_cores=os.cpu_count() or 1,
        ram_bytes=_ram_bytes(),
    )
    ok, detail = nvml_status()
    if ok:
        report.driver = detail.removeprefix("driver ")
        report.gpus = [GpuRow(g.index, g.name, g.total_bytes, "NVML") for g in list_gpus()]
    else:
        report.nvml_note = detail

    try:
        import torch
    except ImportError:
        report.notes.append("PyTorch is not installed: run `make lab` (README) to install it.")
    else:
        report.torch = torch.__version__
        report.torch_cuda_version = torch.version.cuda
        report.torch_cuda_available = torch.cuda.is_available()
        if report.torch_cuda_available:
            report.cudnn_version = str(torch.backends.cudnn.version())
            if not report.gpus:  # no NVML: ask torch instead
                for i in range(torch.cuda.device_count()):
                    props = torch.cuda.get_device_properties(i)
                    report.gpus.append(GpuRow(i, props.name, props.total_memory, "torch"))
        mps = getattr(torch.backends, "mps", None)
        report.mps_available = bool(mps is not None and mps.is_available())

    if tensorflow:
        support = environment.tensorflow_support  # set by helpers.tf.runtime
        described = support.describe() if support is not None else None
        if described is not None:
            report.tensorflow, report.tf_built_with_cuda, report.tf_devices = described
        elif support is not None:
            report.notes.append("TensorFlow is not installed; lessons 02, 03 and 07 need it.")

    if not report.has_gpu:
        if report.mps_available:
            report.notes.append(
                "Apple GPU (MPS) found: PyTorch lessons run on it; CUDA-only parts "
                "(NVML, torch.cuda memory statistics) fall back as on a CPU."
            )
        report.notes.append(NO_GPU_PLAN)
    if sys.version_info[:2] != (3, 11):
        report.notes.append(
            f"The kit is tested on Python 3.11; this is {report.python}."
        )
    return report
