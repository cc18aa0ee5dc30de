"""Live memory gauges and a ``watch nvidia-smi`` view for notebooks (lesson 04).

A gauge shows one device's memory as stacked, labelled bands::

    GPU0 [#######.....] 31.2/48.0 GiB (65%) tensors 24.1 cache 5.1 other 2.0 | source: ...

* **tensors**: bytes held by live tensors (``torch.cuda.memory_allocated`` plus TensorFlow's
  ``get_memory_info(...)["current"]``);
* **cache**: memory the framework's caching allocator keeps for reuse
  (``memory_reserved - memory_allocated``);
* **other**: everything else the driver counts as used: the CUDA context, other processes,
  TensorFlow's pool, the driver's own reserve;
* **free**.

Where the numbers come from, first match wins (a reading always names its source):

1. the virtual GPU (``helpers.current_virtual_gpu()``) when one is active: exact bytes;
2. a real NVIDIA GPU through NVML (v2 memory info, what ``nvidia-smi`` shows), split with
   ``torch.cuda`` and TensorFlow statistics when those frameworks are already in use;
3. otherwise this process's resident memory (RSS) against the machine's RAM, via psutil.

Every number is read through a :mod:`helpers.memory.sources` source (``VirtualGpuSource``,
``NvmlSource``, ``CudaSource``, ``TensorFlowSource``, ``ProcessRamSource``); this module
arranges them into bands.  Nothing here imports torch or TensorFlow: their statistics are
read only if the notebook already imported them, and never in a way that would start a CUDA
context or TensorFlow's runtime.  A missing driver, library (psutil included) or widget
front end gives plain text, never a traceback.  The views share :mod:`helpers.watch.base`.
"""

from __future__ import annotations

import html
import sys
import time
from dataclasses import dataclass, replace

from ..core import nvml
from ..core.checks import LARGEST, shown, whole_number
from ..core.fmt import GiB, MiB, ShownAsTable
from ..memory import sources
from .base import LiveView, check_interval, polling_threads, stop_poller

__all__ = [
    "MemoryReading",
    "MemoryGauge",
    "GpuWatch",
    "read_memory",
    "watch_gpus",
    "polling_threads",
    "stop_poller",
    "reset_caches",
]

PROCESS_QUERY_INTERVAL = 10.0  # seconds between NVML per-process queries (never per tick)

# Okabe & Ito's colour-blind-safe palette: readable on light and dark backgrounds. Every band
# also carries its name as text, and the cache band is striped, so colour is never the only cue.
BAND_STYLE = {
    "tensors": ("#0072B2", "#ffffff", ""),
    "process": ("#0072B2", "#ffffff", ""),
    "cache": (
        "#E69F00",
        "#000000",
        "background-image:repeating-linear-gradient(135deg,rgba(255,255,255,.35) 0 4px,"
        "transparent 4px 8px);",
    ),
    "other": ("#CC79A7", "#000000", ""),
}
# Neutral parts follow the JupyterLab theme (light or dark).  Elsewhere (VS Code, Colab,
# nbviewer) the fallbacks inherit the host's text colour or use translucent grey, which
# reads on light and dark backgrounds alike.
_FONT = "var(--jp-ui-font-family, sans-serif)"
_TEXT = "var(--jp-ui-font-color1, inherit)"
_MUTED = "var(--jp-ui-font-color2, inherit)"
_BORDER = "var(--jp-border-color1, rgba(128, 128, 128, 0.6))"
_FREE = "var(--jp-layout-color2, rgba(128, 128, 128, 0.15))"


# --------------------------------------------------------------------------------- readings
@dataclass(frozen=True, repr=False)
class MemoryReading(ShownAsTable):
    """One device's memory at one moment, split into bands (bytes).

    Attributes:
        label: short device name: ``"GPU0"``, ``"vGPU"`` or ``"RAM"``.
        source: where the numbers come from, in words.
        total_bytes: capacity of the device.
        bands: ``(name, bytes)`` pairs that add up to the used memory, in display order.
        exact: True when the numbers are exact and reproducible (the virtual GPU).
        detail: an extra sentence (per-process split, why a fallback was used), or "".
    """

    label: str
    source: str
    total_bytes: int
    bands: tuple[tuple[str, int], ...]
    exact: bool = False
    detail: str = ""

    @property
    def used_bytes(self) -> int:
        return sum(b for _, b in self.bands)

    @property
    def free_bytes(self) -> int:
        return max(0, self.total_bytes - self.used_bytes)

    @property
    def fraction(self) -> float:
        return self.used_bytes / self.total_bytes if self.total_bytes > 0 else 0.0

    def band(self, name: str) -> int:
        """Bytes in band ``name`` (0 if this source has no such band)."""
        return dict(self.bands).get(name, 0)

    def _unit(self) -> tuple[str, int]:
        return ("GiB", GiB) if self.total_bytes >= GiB else ("MiB", MiB)

    def bar(self, width: int = 12) -> str:
        """The used share as ``[#######.....]``."""
        width = whole_number(width, "width", 1, 1000)
        filled = min(width, int(self.fraction * width))
        return "[" + "#" * filled + "." * (width - filled) + "]"

    def text(self, width: int = 12, *, source: bool = True) -> str:
        """One stable line, e.g. ``GPU0 [###.........] 12.0/48.0 GiB (25%) tensors 9.0 ...``."""
        unit, scale = self._unit()
        parts = [
            f"{self.label} {self.bar(width)} {self.used_bytes / scale:.1f}/"
            f"{self.total_bytes / scale:.1f} {unit} ({round(100 * self.fraction)}%)"
        ]
        parts += [f"{name} {b / scale:.1f}" for name, b in self.bands]
        line = " ".join(parts)
        return f"{line} | source: {self.source}" if source else line

    def html(self) -> str:
        """A static HTML gauge: stacked bands with labels, legend and source."""
        unit, scale = self._unit()
        esc = html.escape
        total = max(1, self.total_bytes)
        segments, legend = [], []
        for name, n_bytes in self.bands:
            bg, fg, extra = BAND_STYLE.get(name, BAND_STYLE["other"])
            pct = 100.0 * n_bytes / total
            inside = esc(name) if pct >= 12 else ""
            segments.append(
                f'<div class="gl-band gl-band-{esc(name)}" title="{esc(name)} '
                f'{n_bytes / scale:.1f} {unit}" style="width:{pct:.2f}%;background-color:{bg};'
                f"{extra}color:{fg};overflow:hidden;white-space:nowrap;font-size:11px;"
                f'line-height:20px;padding-left:{2 if inside else 0}px">{inside}</div>'
            )
            legend.append(
                f'<span style="margin-right:12px;white-space:nowrap"><span style="display:'
                f"inline-block;width:10px;height:10px;background-color:{bg};{extra}"
                f'vertical-align:middle;margin-right:4px"></span>{esc(name)} '
                f"{n_bytes / scale:.1f} {unit}</span>"
            )
        free_pct = max(0.0, 100.0 * self.free_bytes / total)
        segments.append(
            f'<div class="gl-band gl-band-free" title="free {self.free_bytes / scale:.1f} '
            f'{unit}" style="flex:1;color:{_MUTED};font-size:11px;line-height:20px;'
            f'padding-left:4px;white-space:nowrap;overflow:hidden">'
            f'{"free" if free_pct >= 12 else ""}</div>'
        )
        legend.append(
            f'<span style="white-space:nowrap"><span style="display:inline-block;width:10px;'
            f"height:10px;background:{_FREE};border:1px solid {_BORDER};vertical-align:middle;"
            f'margin-right:4px"></span>free {self.free_bytes / scale:.1f} {unit}</span>'
        )
        detail = (
            f'<div class="gl-gauge-detail" style="color:{_MUTED}">{esc(self.detail)}</div>'
            if self.detail else ""
        )
        attrs = " ".join(
            f'data-{k}="{esc(str(v))}"'
            for k, v in (
                ("label", self.label), ("source", self.source),
                ("total-bytes", self.total_bytes), ("used-bytes", self.used_bytes),
                ("text", self.text()),
            )
        )
        return (
            f'<div class="gl-gauge" {attrs} style="font-family:{_FONT};color:{_TEXT};'
            f'font-size:12px;max-width:640px;margin:2px 0">'
            f'<div class="gl-gauge-title"><b>{esc(self.label)}</b> '
            f"{self.used_bytes / scale:.1f} / {self.total_bytes / scale:.1f} {unit} used "
            f'({round(100 * self.fraction)}%) <span style="color:{_MUTED}">source: '
            f"{esc(self.source)}</span></div>"
            f'<div class="gl-gauge-bar" role="img" aria-label="{esc(self.text())}" '
            f'style="display:flex;height:20px;border:1px solid {_BORDER};border-radius:3px;'
            f'overflow:hidden;background:{_FREE};margin:2px 0">{"".join(segments)}</div>'
            f'<div class="gl-gauge-legend">{"".join(legend)}</div>{detail}</div>'
        )

    _html = html


# ------------------------------------------------------------------------------- sources
_SOURCE_HELP = (
    "source must be 'auto', 'cuda', 'cuda:N', a GPU number N, 'virtual', 'ram', 'cpu', "
    "a torch.device, or a virtual-GPU object with capacity_bytes, allocated_bytes, "
    "reserved_bytes and context_bytes"
)
_VGPU_ATTRS = ("capacity_bytes", "allocated_bytes", "reserved_bytes", "context_bytes")


def _parse_source(source) -> tuple[str, object]:
    """Validate a source spec; returns (kind, argument)."""
    try:
        is_vgpu = all(hasattr(source, a) for a in _VGPU_ATTRS)
    except Exception:  # noqa: BLE001 - a property that raises: a broken virtual GPU
        is_vgpu = True
    if is_vgpu:
        return "virtual", source
    if type(source).__name__ == "device" and hasattr(source, "type"):  # torch.device
        source = str(source)
    if isinstance(source, int) and not isinstance(source, bool) and 0 <= source <= LARGEST:
        return "cuda", source
    if isinstance(source, str):
        s = source.strip().lower()
        if s in ("auto", "virtual", "ram"):
            return s, None
        if s in ("cpu", "mps"):
            return "ram", None
        if s == "cuda":
            return "cuda", None
        if s.startswith("cuda:") and s[5:].isdigit():
            return "cuda", int(s[5:])
    raise ValueError(f"{_SOURCE_HELP}; got {shown(source)}")


def _active_virtual_gpu():
    """The active virtual GPU's source, or None (also when torch is not imported: a virtual
    GPU is a torch dispatch mode, so there is none without it)."""
    if "torch" not in sys.modules:
        return None
    try:
        source = sources.memory_source("cpu")  # the active virtual GPU, else process RAM
    except Exception:  # noqa: BLE001 - a gauge must never break the notebook
        return None
    return source if isinstance(source, sources.VirtualGpuSource) else None


def _vgpu_name(source) -> str:
    return str(getattr(source.gpu, "name", "virtual GPU"))


def _read_virtual(source) -> MemoryReading:
    capacity, allocated, reserved, context = (
        whole_number(value, name) for value, name in (
            (source.total, "capacity_bytes"), (source.read(), "allocated_bytes"),
            (source.reserved(), "reserved_bytes"), (source.outside(), "context_bytes")))
    return MemoryReading(
        label="vGPU",
        source=f"virtual GPU '{_vgpu_name(source)}' (exact accounting on the CPU)",
        total_bytes=capacity,
        bands=(("tensors", allocated), ("cache", max(0, reserved - allocated)),
               ("other", context)),
        exact=True,
        detail="other = the simulated CUDA context",
    )


def _read_ram(detail: str = "") -> MemoryReading:
    source = sources.ProcessRamSource()
    if not source.available:  # no psutil: say so instead of failing
        return MemoryReading(label="RAM", source=f"no memory reading: {source.why_not}",
                             total_bytes=0, bands=(), detail=detail)
    rss = source.read()
    return MemoryReading(
        label="RAM",
        source="this process's RSS against system RAM (psutil)",
        total_bytes=source.total,
        bands=(("process", rss), ("other", max(0, source.device_used() - rss))),
        detail=detail,
    )


_torch_index: dict[int, int] = {}


def _torch_index_for(nvml_index: int) -> int:
    """torch's device number for NVML's GPU ``nvml_index`` (they differ under
    CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER); matched by UUID, identity if unknown.

    -1 while this process has not started CUDA: reading the UUIDs through
    ``torch.cuda.get_device_properties`` would start it (and there are no torch statistics
    to show before that anyway)."""
    if nvml_index in _torch_index:
        return _torch_index[nvml_index]
    if not nvml.cuda_started():
        return -1
    torch, result = sys.modules["torch"], -1
    try:
        uuids = {g.index: g.uuid for g in nvml.list_gpus()}
        wanted = uuids.get(nvml_index, "")
        for i in range(torch.cuda.device_count()):
            uuid = str(getattr(torch.cuda.get_device_properties(i), "uuid", ""))
            if uuid and wanted and uuid in wanted:
                result = i
                break
        else:
            result = nvml_index if not wanted else -1
    except Exception:  # noqa: BLE001
        result = nvml_index
    _torch_index[nvml_index] = result
    return result


def _torch_source(torch_index: int):
    """torch.cuda's counters of device ``torch_index``, only if this process already uses
    CUDA (a gauge never starts a CUDA context), else None."""
    try:
        return sources.CudaSource(f"cuda:{torch_index}") if (
            torch_index >= 0 and nvml.cuda_started()) else None
    except Exception:  # noqa: BLE001
        return None


def _torch_stats(torch_index: int) -> tuple[int, int] | None:
    """(allocated, reserved) bytes from torch.cuda, only if this process already uses CUDA."""
    source = _torch_source(torch_index)
    try:
        return None if source is None else (source.read(), source.reserved())
    except Exception:  # noqa: BLE001
        return None


def _tf_current(tf_index: int) -> int | None:
    """Bytes in live TensorFlow tensors on GPU ``tf_index``, only if TF's runtime already
    runs (asking it to list its devices would start it; so would importing anything)."""
    tf = sys.modules.get("tensorflow")
    context = sys.modules.get("tensorflow.python.eager.context")
    if tf is None or context is None or tf_index < 0:
        return None
    try:
        if context.context()._context_handle is None:  # runtime not started: leave it so
            return None
        if len(tf.config.list_logical_devices("GPU")) <= tf_index:
            return None
        source = sources.TensorFlowSource(tf.config.experimental, f"GPU:{tf_index}")
        return source.read() if source.available else None
    except Exception:  # noqa: BLE001
        return None


_proc_cache: dict[int, tuple[float, str]] = {}


def _process_detail(index: int) -> str:
    """This process's and other processes' share of GPU ``index`` (throttled NVML query)."""
    now = time.monotonic()
    cached = _proc_cache.get(index)
    if cached and now - cached[0] < PROCESS_QUERY_INTERVAL:
        return cached[1]
    import os

    procs = nvml.gpu_processes(index)
    if procs is None:
        text = "per-process memory: not reported by this driver"
    elif any(p.used_bytes is None for p in procs):
        text = f"{len(procs)} process(es) on this GPU; the driver hides their memory"
    elif procs and _foreign_pids(procs):
        text = (f"per-process memory: PIDs not visible in this container (NVML reports the "
                f"host's); {len(procs)} process(es) "
                f"{sum(p.used_bytes for p in procs) / GiB:.1f} GiB in all")
    else:
        mine = sum(p.used_bytes for p in procs if p.pid == os.getpid())
        others = [p for p in procs if p.pid != os.getpid()]
        text = (f"this process {mine / GiB:.1f} GiB (includes its CUDA context); "
                f"{len(others)} other process(es) {sum(p.used_bytes for p in others) / GiB:.1f}"
                " GiB")
    _proc_cache[index] = (now, text + f" (checked every {PROCESS_QUERY_INTERVAL:.0f} s)")
    return _proc_cache[index][1]


def _foreign_pids(procs) -> bool:
    """True when NVML's PIDs come from another PID namespace (a container without the host's):
    none is this process although it uses CUDA, or none exists here at all."""
    import os

    if any(p.pid == os.getpid() for p in procs):
        return False
    return nvml.cuda_started() or not any(os.path.exists(f"/proc/{p.pid}") for p in procs)


def _cuda_reading(index: int, mem: nvml.GpuMemory | None) -> MemoryReading | None:
    torch_index = _torch_index_for(index) if "torch" in sys.modules else -1
    stats = _torch_stats(torch_index)
    tf_bytes = _tf_current(torch_index if torch_index >= 0 else index)
    parts = []
    if mem is not None:
        total, free = mem.total_bytes, mem.free_bytes
        parts.append("NVML v2")
    elif stats is not None:  # no NVML, but torch runs on CUDA: ask the driver through torch
        free, total = _torch_source(torch_index).free_and_total()
        parts.append("torch.cuda.mem_get_info")
    else:
        return None
    allocated, reserved = stats if stats is not None else (0, 0)
    if stats is not None:
        parts.append("torch.cuda")
    if tf_bytes is not None:
        parts.append("TensorFlow")
    tensors = allocated + (tf_bytes or 0)
    cache = max(0, reserved - allocated)
    other = max(0, total - free - tensors - cache)
    detail = _process_detail(index) if mem is not None else ""
    if stats is None and tf_bytes is None:
        detail = ("no framework statistics yet (torch.cuda and TensorFlow unused in this "
                  "process): everything used counts as other. " + detail).strip()
    return MemoryReading(
        label=f"GPU{index}", source=" + ".join(parts), total_bytes=int(total),
        bands=(("tensors", tensors), ("cache", cache), ("other", other)), detail=detail,
    )


def _nvml_memory(index: int) -> nvml.GpuMemory | None:
    source = sources.NvmlSource(index)
    return source.memory() if source.available else None


def _read_cuda(index: int | None, fallback_note: bool) -> MemoryReading:
    if index is None:  # the GPU this process uses, else the first
        try:
            index = int(sys.modules["torch"].cuda.current_device()) if nvml.cuda_started() else 0
        except Exception:  # noqa: BLE001
            index = 0
    ok, why = nvml.nvml_status()
    reading = None
    if ok and index < nvml.gpu_count():
        reading = _cuda_reading(index, _nvml_memory(index))
    elif not ok and _torch_stats(index) is not None:  # a GPU torch uses, but no NVML
        reading = _cuda_reading(index, None)
    if reading is not None:
        return reading
    if ok:
        why = f"NVML sees {nvml.gpu_count()} GPU(s), so there is no GPU {index}"
    note = f"No GPU to read ({why}); showing RAM instead." if fallback_note else ""
    return _read_ram(detail=note)


def read_memory(source="auto") -> MemoryReading:
    """Read one device's memory now (no widget).

    Args:
        source: ``"auto"`` (virtual GPU if active, else GPU through NVML/torch, else RAM),
            ``"cuda"``/``"cuda:N"``/``N`` (a real GPU; falls back to RAM with a note),
            ``"virtual"`` (the active virtual GPU; falls back likewise), ``"ram"``/``"cpu"``,
            a ``torch.device``, or a virtual-GPU object.

    Returns:
        A :class:`MemoryReading`; print it for one line, display it for an HTML gauge.
    """
    kind, arg = _parse_source(source)
    return _read(kind, arg)


def _read(kind: str, arg) -> MemoryReading:
    if kind == "virtual":
        try:
            source = _active_virtual_gpu() if arg is None else sources.VirtualGpuSource(arg)
            if source is None:
                return _read_ram(detail="No virtual GPU is active; showing RAM instead.")
            return _read_virtual(source)
        except Exception as exc:  # noqa: BLE001
            return _read_ram(detail=f"The virtual GPU could not be read ({exc}); showing RAM.")
    if kind == "ram":
        return _read_ram()
    if kind == "cuda":
        return _read_cuda(arg, fallback_note=True)
    # auto
    source = _active_virtual_gpu()
    if source is not None:
        try:
            return _read_virtual(source)
        except Exception:  # noqa: BLE001
            pass
    return _read_cuda(None, fallback_note=False)


_stop_poller = stop_poller  # the name tests/rehearsal/test_tensorflow_and_edges.py uses


def reset_caches() -> None:
    """Forget the NVML-to-torch GPU numbering and the last per-process query
    (``helpers.FakeNvml`` calls this when it swaps the GPUs a test sees)."""
    _torch_index.clear()
    _proc_cache.clear()


# -------------------------------------------------------------------------------- gauges
class MemoryGauge(LiveView):
    """A live memory gauge for one device (lesson 04).

    Display it (last line of a cell), then call :meth:`update` from your training loop, or
    let it poll in the background::

        gauge = helpers.MemoryGauge(poll=0.5)
        gauge

    Args:
        source: which device; see :func:`read_memory` (default ``"auto"``).
        poll: seconds between background updates (0.25 s to a day), or None for updates on
            demand.
        width: characters in the text bar (4 to 80).

    Creating a gauge stops the previous gauge's poller (or hands it over), so re-running a
    cell never leaves threads behind.  Headless (nbval, scripts) it displays as one line of
    text plus static HTML.
    """

    kind = "gauge"
    static_html = True

    def __init__(self, source="auto", *, poll: float | None = None, width: int = 12):
        self._source = _parse_source(source)
        self.width = whole_number(width, "width", 4, 80)
        poll = None if poll is None else check_interval(poll, "poll")
        self._init_view()
        t0 = time.perf_counter()
        self.reading = _read(*self._source)
        self.busy_seconds += time.perf_counter() - t0
        self.peak_used_bytes = self.reading.used_bytes
        if poll is None:
            stop_poller(self.kind)  # a new gauge (or a re-run cell) stops the old poller
        else:
            self.start(poll)

    def _refresh(self):
        try:
            self.reading = _read(*self._source)
        except Exception as exc:  # noqa: BLE001 - e.g. the driver lost the GPU mid-run
            self.reading = replace(self.reading, detail=(
                f"Reading failed ({type(exc).__name__}: {exc}); showing the last reading."))
        self.peak_used_bytes = max(self.peak_used_bytes, self.reading.used_bytes)

    def _value(self) -> MemoryReading:
        return self.reading

    def read(self) -> MemoryReading:
        """A fresh reading without redrawing the gauge."""
        return _read(*self._source)

    @property
    def source(self) -> str:
        return self.reading.source

    def _frame(self) -> str:
        return self.reading.html()

    html = _frame

    def text(self) -> str:
        return self.reading.text(self.width)


@dataclass(frozen=True)
class WatchRow:
    reading: MemoryReading
    name: str
    utilisation: str  # e.g. "GPU-Util 97%  mem 40%" or "CPU 12%"
    extra: str = ""  # temperature, power


def _cpu_utilisation() -> str:
    try:
        import psutil
    except ImportError:
        return "CPU n/a (psutil is not installed)"
    return f"CPU {psutil.cpu_percent(interval=None):.0f}%"


class GpuWatch(LiveView):
    """``watch -n 1 nvidia-smi`` inside the notebook: every GPU's memory and utilisation.

    Without NVML it says why and shows what this machine has instead: the active virtual
    GPU (no utilisation: it is simulated) and RAM with CPU utilisation.  It never lists
    processes on each tick (that query is slow); see :func:`helpers.core.nvml.gpu_processes`.
    """

    kind = "watch"
    static_html = True

    def __init__(self, interval: float | None = 1.0, *, width: int = 12):
        interval = None if interval is None else check_interval(interval)
        self.width = whole_number(width, "width", 4, 80)
        self.interval = interval
        self._init_view()
        _cpu_utilisation()  # prime psutil: its first call always returns 0.0
        self.header, self.rows = self._read_rows()
        if interval is None:
            stop_poller(self.kind)
        else:
            self.start(interval)

    def _read_rows(self) -> tuple[str, list[WatchRow]]:
        ok, detail = nvml.nvml_status()
        rows = []
        if ok and nvml.gpu_count() > 0:
            header = f"NVIDIA {detail} (NVML), {nvml.gpu_count()} GPU(s)"
            for i in range(nvml.gpu_count()):
                st = nvml.gpu_status(i)
                if st is None:  # NVML may not open it: another job's, hidden by a cgroup
                    continue
                reading = _cuda_reading(i, _nvml_memory(i))
                if reading is None:
                    continue
                util = (f"GPU-Util {st.gpu_util_pct}%  mem-bw {st.memory_util_pct}%"
                        if st.gpu_util_pct is not None else "GPU-Util n/a")
                extra = []
                if st.temperature_c is not None:
                    extra.append(f"{st.temperature_c} C")
                if st.power_w is not None:
                    limit = f"/{st.power_limit_w:.0f}" if st.power_limit_w else ""
                    extra.append(f"{st.power_w:.0f}{limit} W")
                rows.append(WatchRow(reading, st.name, util, "  ".join(extra)))
            return header, rows
        header = f"No NVIDIA GPU ({detail.rstrip('.?')}); showing this machine instead."
        source = _active_virtual_gpu()
        if source is not None:
            try:
                rows.append(WatchRow(_read_virtual(source), _vgpu_name(source),
                                     "GPU-Util n/a (simulated)"))
            except Exception:  # noqa: BLE001
                pass
        rows.append(WatchRow(_read_ram(), "system RAM", _cpu_utilisation()))
        return header, rows

    def _refresh(self):
        try:
            self.header, self.rows = self._read_rows()
        except Exception as exc:  # noqa: BLE001 - keep the last rows, say what went wrong
            self.header = f"Reading failed ({type(exc).__name__}: {exc}); last rows shown."

    def _value(self):
        return self.rows

    def text(self) -> str:
        lines = [self.header]
        for row in self.rows:
            extra = f"  {row.extra}" if row.extra else ""
            lines.append(f"{row.reading.text(self.width, source=False)}  {row.utilisation}"
                         f"{extra}  ({row.name})")
        return "\n".join(lines)

    def _frame(self) -> str:
        esc = html.escape
        every = f"every {self.interval:g} s" if self.polling or self.interval else "on demand"
        body = "".join(
            f'<tr><td style="vertical-align:top;padding-right:8px"><b>{esc(r.name)}</b><br>'
            f'<span style="color:{_MUTED}">{esc(r.utilisation)}'
            f'{"<br>" + esc(r.extra) if r.extra else ""}</span></td>'
            f'<td style="width:100%">{r.reading.html()}</td></tr>'
            for r in self.rows
        )
        return (
            f'<div class="gl-watch" style="font-family:{_FONT};color:{_TEXT};font-size:12px">'
            f'<div style="color:{_MUTED}">{esc(self.header)} &middot; updated {every}</div>'
            f'<table style="border-collapse:collapse;width:100%;max-width:820px">{body}'
            f"</table></div>"
        )

    html = _frame


def watch_gpus(interval: float | None = 1.0) -> GpuWatch:
    """A :class:`GpuWatch` refreshed every ``interval`` seconds (None: on ``update()``)."""
    return GpuWatch(interval)
