"""Memory gauge and watch view: readings, sources, fallbacks, HTML, pollers (lesson 04)."""

import sys
import threading
import time
import types

import pytest

import helpers
from helpers.core import nvml
from helpers.core.fmt import GiB, MiB
from helpers.memory import state
from helpers.watch import base, gauge


class StandInVGPU:
    """The memory engine's virtual-GPU interface, as lesson 04 relies on it."""

    def __init__(self, capacity=48 * GiB, allocated=0, reserved=0, context=0, name="L40S"):
        self.name = name
        self.capacity_bytes = capacity
        self.allocated_bytes = allocated
        self.reserved_bytes = reserved
        self.context_bytes = context
        self.peak_allocated_bytes = allocated
        self.peak_reserved_bytes = reserved


def spec_example():
    return StandInVGPU(allocated=int(24.1 * GiB), reserved=int(29.2 * GiB),
                       context=int(2.0 * GiB))


@pytest.fixture(autouse=True)
def no_pollers_left():
    yield
    for kind in ("gauge", "watch"):
        gauge._stop_poller(kind)
    assert gauge.polling_threads() == []


@pytest.fixture
def active_vgpu(monkeypatch):
    """Make the active virtual GPU a stand-in (torch must be imported)."""
    import torch  # noqa: F401 - a virtual GPU only exists where torch does

    vgpu = spec_example()
    monkeypatch.setattr(state, "current_virtual_gpu", lambda: vgpu)
    return vgpu


# ------------------------------------------------------------------ readings and text
def test_virtual_gpu_reading_matches_the_documented_text_form():
    reading = helpers.read_memory(spec_example())
    assert reading.text(source=False) == (
        "vGPU [#######.....] 31.2/48.0 GiB (65%) tensors 24.1 cache 5.1 other 2.0")
    assert reading.text().endswith("| source: virtual GPU 'L40S' (exact accounting on the CPU)")
    assert reading.exact
    assert reading.free_bytes == 48 * GiB - reading.used_bytes
    assert reading.band("cache") == int(29.2 * GiB) - int(24.1 * GiB)
    assert str(reading) == repr(reading) == reading.text()


def test_small_devices_print_in_mib_and_bars_scale():
    v = StandInVGPU(capacity=512 * MiB, allocated=128 * MiB, reserved=192 * MiB,
                    context=64 * MiB)
    reading = helpers.read_memory(v)
    assert reading.text(width=8, source=False) == (
        "vGPU [####....] 256.0/512.0 MiB (50%) tensors 128.0 cache 64.0 other 64.0")
    empty = helpers.read_memory(StandInVGPU(capacity=GiB))
    assert empty.bar(4) == "[....]" and empty.fraction == 0.0


def test_auto_prefers_the_active_virtual_gpu(active_vgpu):
    reading = helpers.read_memory("auto")
    assert reading.label == "vGPU"
    active_vgpu.allocated_bytes += GiB  # live attributes: the next reading sees the change
    assert helpers.read_memory().band("tensors") == reading.band("tensors") + GiB


def test_without_the_memory_engine_auto_reads_ram(monkeypatch):
    monkeypatch.setattr(state, "current_virtual_gpu", lambda: None)
    reading = helpers.read_memory()
    assert reading.label in ("RAM", "GPU0")
    if reading.label == "RAM":
        import psutil

        assert reading.total_bytes == psutil.virtual_memory().total
        assert [name for name, _ in reading.bands] == ["process", "other"]
        assert 0 < reading.band("process") < reading.total_bytes
        assert "RSS" in reading.source


def test_unavailable_sources_fall_back_to_ram_and_say_why(monkeypatch):
    monkeypatch.setattr(nvml, "nvml_status", lambda: (False, "no driver in this test"))
    monkeypatch.setattr(gauge, "_torch_stats", lambda i: None)
    reading = helpers.read_memory("cuda:3")
    assert reading.label == "RAM" and "no driver in this test" in reading.detail
    monkeypatch.setattr(state, "current_virtual_gpu", lambda: None)
    reading = helpers.read_memory("virtual")
    assert reading.label == "RAM" and "No virtual GPU is active" in reading.detail

    class Broken:
        name = "broken"
        capacity_bytes = allocated_bytes = reserved_bytes = 1

        @property
        def context_bytes(self):
            raise RuntimeError("engine stopped")

    reading = helpers.read_memory(Broken())
    assert reading.label == "RAM" and "engine stopped" in reading.detail


@pytest.mark.parametrize("bad", ["gpu0", "cuda:x", -1, 1.5, True, None, [0]])
def test_bad_sources_are_rejected_with_what_is_accepted(bad):
    with pytest.raises(ValueError, match="'auto', 'cuda', 'cuda:N'"):
        helpers.read_memory(bad)


def test_torch_devices_and_names_are_accepted():
    import torch

    assert gauge._parse_source(torch.device("cpu")) == ("ram", None)
    assert gauge._parse_source("cuda:2") == ("cuda", 2)
    assert gauge._parse_source(1) == ("cuda", 1)
    assert gauge._parse_source(" RAM ") == ("ram", None)


def test_gauge_never_starts_cuda_or_tensorflow():
    import torch

    assert gauge._torch_stats(0) is None  # not initialised here (CPU build or unused)
    assert not torch.cuda.is_initialized()


# ------------------------------------------------------------------ NVML through a fake
class FakeNVML(types.ModuleType):
    """Enough of pynvml for two GPUs; this process holds 3 GiB on GPU 0."""

    class NVMLError(Exception):
        pass

    nvmlMemory_v2 = 2
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, pid):
        super().__init__("pynvml")
        self.pid = pid
        self.process_queries = 0

    def nvmlInit(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return "580.95.05"

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA L40S"

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}"

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        # v2: used excludes the driver's reserve; total = used + free + reserved
        return types.SimpleNamespace(total=48 * GiB, used=int(30.7 * GiB),
                                     free=int(16.8 * GiB), reserved=int(0.5 * GiB))

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=97 - h, memory=40)

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 62

    def nvmlDeviceGetPowerUsage(self, h):
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 350_000

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self.process_queries += 1
        return [types.SimpleNamespace(pid=self.pid, usedGpuMemory=3 * GiB),
                types.SimpleNamespace(pid=1, usedGpuMemory=GiB)]


@pytest.fixture
def fake_nvml(monkeypatch):
    import os

    fake = FakeNVML(os.getpid())
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(nvml, "_state", {"initialised": False, "error": None})
    monkeypatch.setattr(gauge, "_proc_cache", {})
    monkeypatch.setattr(gauge, "_torch_index", {})
    monkeypatch.setattr(state, "current_virtual_gpu", lambda: None)
    return fake


def test_gpu_reading_splits_nvml_with_framework_statistics(fake_nvml, monkeypatch):
    monkeypatch.setattr(gauge, "_torch_stats", lambda i: (int(24.1 * GiB), int(29.2 * GiB)))
    monkeypatch.setattr(gauge, "_tf_current", lambda i: None)
    reading = helpers.read_memory("cuda:0")
    assert reading.text() == ("GPU0 [#######.....] 31.2/48.0 GiB (65%) tensors 24.1 cache 5.1 "
                              "other 2.0 | source: NVML v2 + torch.cuda")
    assert "this process 3.0 GiB" in reading.detail and "1 other process(es) 1.0" in (
        reading.detail)
    monkeypatch.setattr(gauge, "_tf_current", lambda i: GiB)
    assert helpers.read_memory(0).source == "NVML v2 + torch.cuda + TensorFlow"


def test_gpu_reading_without_framework_statistics_counts_all_as_other(fake_nvml, monkeypatch):
    monkeypatch.setattr(gauge, "_torch_stats", lambda i: None)
    monkeypatch.setattr(gauge, "_tf_current", lambda i: None)
    reading = helpers.read_memory()  # auto: a GPU through NVML
    assert reading.label == "GPU0" and reading.band("tensors") == 0
    assert reading.band("other") == reading.used_bytes
    assert "no framework statistics" in reading.detail


def test_process_list_is_queried_at_most_every_ten_seconds(fake_nvml, monkeypatch):
    monkeypatch.setattr(gauge, "_torch_stats", lambda i: None)
    g = helpers.MemoryGauge(0)
    for _ in range(20):
        g.update(force=True)
    assert g.updates == 20 and fake_nvml.process_queries == 1


def test_missing_gpu_number_falls_back(fake_nvml, monkeypatch):
    monkeypatch.setattr(gauge, "_torch_stats", lambda i: None)
    reading = helpers.read_memory("cuda:5")
    assert reading.label == "RAM" and "no GPU 5" in reading.detail


def test_nvml_status_rows_and_processes(fake_nvml):
    st = nvml.gpu_status(1)
    assert (st.name, st.gpu_util_pct, st.temperature_c, st.power_w, st.power_limit_w) == (
        "NVIDIA L40S", 96, 62, None, 350.0)
    assert nvml.gpu_count() == 2
    assert [p.used_bytes for p in nvml.gpu_processes(0)] == [3 * GiB, GiB]
    with pytest.raises(ValueError, match="no GPU 2"):
        nvml.gpu_status(2)


def test_watch_shows_every_gpu_with_utilisation(fake_nvml, monkeypatch):
    monkeypatch.setattr(gauge, "_torch_stats", lambda i: None)
    w = helpers.GpuWatch(interval=None)
    lines = w.text().splitlines()
    assert lines[0] == "NVIDIA driver 580.95.05 (NVML), 2 GPU(s)"
    assert lines[1].startswith("GPU0 [#######.....] 31.2/48.0 GiB (65%) tensors 0.0 cache 0.0")
    assert "GPU-Util 97%  mem-bw 40%  62 C  (NVIDIA L40S)" in lines[1]
    assert "GPU-Util 96%" in lines[2]
    assert w.html().count('class="gl-gauge"') == 2


def test_watch_without_nvml_explains_and_shows_this_machine(active_vgpu, monkeypatch):
    monkeypatch.setattr(nvml, "nvml_status", lambda: (False, "NVML could not start (test)"))
    w = helpers.watch_gpus(interval=None)
    assert w.header == "No NVIDIA GPU (NVML could not start (test)); showing this machine instead."
    assert [r.name for r in w.rows] == ["L40S", "system RAM"]
    assert w.rows[0].utilisation == "GPU-Util n/a (simulated)"
    assert w.rows[1].utilisation.startswith("CPU ")
    assert not w.polling


# ------------------------------------------------------------------ HTML
def test_html_has_labelled_bands_theme_colours_and_source():
    page = helpers.read_memory(spec_example()).html()
    for band in ("tensors", "cache", "other", "free"):
        assert f"gl-band-{band}" in page
    assert ">tensors</div>" in page  # labels inside wide bands, not colour alone
    assert "tensors 24.1 GiB" in page and "free 16.8 GiB" in page  # legend
    assert "var(--jp-ui-font-color1" in page and "var(--jp-layout-color2" in page
    assert "#0072B2" in page and "#E69F00" in page  # Okabe-Ito, colour-blind safe
    assert "source: virtual GPU &#x27;L40S&#x27;" in page
    assert 'data-used-bytes="' in page and 'data-text="vGPU [#######.....]' in page


def test_html_escapes_names():
    v = StandInVGPU(name="<b>x</b>", allocated=GiB, reserved=GiB)
    page = helpers.read_memory(v).html()
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page


# ------------------------------------------------------------------ gauges and pollers
def test_fifty_reruns_leave_at_most_one_polling_thread():
    gauges = [helpers.MemoryGauge(poll=0.25) for _ in range(50)]
    assert gauge.polling_threads() == ["helpers-gauge-poller"]
    assert gauges[-1].polling and not any(g.polling for g in gauges[:-1])
    helpers.MemoryGauge()  # a new gauge without polling also stops the old poller
    assert gauge.polling_threads() == []


def test_gauge_and_watch_pollers_are_independent_and_stop():
    g = helpers.MemoryGauge(poll=0.3)
    w = helpers.GpuWatch(interval=0.3)
    assert gauge.polling_threads() == ["helpers-gauge-poller", "helpers-watch-poller"]
    helpers.MemoryGauge(poll=0.25)  # replaces only the gauge poller
    assert w.polling and not g.polling
    w.stop()
    assert gauge.polling_threads() == ["helpers-gauge-poller"]


def test_poller_updates_the_gauge_from_its_thread():
    v = StandInVGPU(capacity=GiB, allocated=10 * MiB, reserved=10 * MiB)
    g = helpers.MemoryGauge(v, poll=0.25)
    v.allocated_bytes = v.reserved_bytes = 100 * MiB
    deadline = time.monotonic() + 10
    while g.reading.band("tensors") != 100 * MiB and time.monotonic() < deadline:
        time.sleep(0.05)
    assert g.reading.band("tensors") == 100 * MiB
    assert g.peak_used_bytes == 100 * MiB
    g.stop()
    assert not g.polling


@pytest.mark.parametrize("interval", [0.1, 0, -1, "1", float("nan"), True, 1e300, 10**400])
def test_polling_intervals_outside_a_quarter_second_to_a_day_are_refused(interval):
    """Fuzz case 11: poll=1e300 was accepted, then the poller thread died (OverflowError)."""
    with pytest.raises((TypeError, ValueError), match="poll"):
        helpers.MemoryGauge(poll=interval)
    with pytest.raises((TypeError, ValueError), match="interval"):
        helpers.GpuWatch(interval=interval)
    assert gauge.polling_threads() == []


def test_update_is_throttled_unless_forced():
    v = StandInVGPU(capacity=GiB, allocated=MiB, reserved=MiB)
    g = helpers.MemoryGauge(v)
    first = g.update()
    v.allocated_bytes = v.reserved_bytes = 2 * MiB
    assert g.update() is first  # within min_interval: no new reading, nearly free
    assert g.update(force=True).band("tensors") == 2 * MiB
    assert g.busy_seconds > 0 and g.updates == 2


def test_headless_display_is_text_and_static_html():
    g = helpers.MemoryGauge(spec_example())
    bundle = g._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert bundle["text/plain"].startswith("vGPU [#######.....] 31.2/48.0 GiB")
    assert 'class="gl-gauge"' in bundle["text/html"]
    assert g.widget() is None and repr(g) == g.text()


def test_live_display_is_a_widget_updated_in_place(monkeypatch):
    monkeypatch.setattr(base, "headless", lambda: False)
    v = StandInVGPU(capacity=GiB, allocated=MiB, reserved=MiB)
    g = helpers.MemoryGauge(v)
    bundle = g._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == g.text()
    widget = g.widget()
    assert "gl-gauge-widget" in widget._dom_classes
    v.allocated_bytes = v.reserved_bytes = 300 * MiB
    g.update(force=True)
    assert g.widget() is widget and f'data-used-bytes="{300 * MiB}"' in widget.value


def test_gauge_validates_width():
    with pytest.raises(ValueError, match="width"):
        helpers.MemoryGauge(width=2)


def test_stopping_from_the_poller_thread_itself_does_not_deadlock():
    g = helpers.MemoryGauge(StandInVGPU(capacity=GiB), poll=0.25)
    done = threading.Event()
    original = g._refresh

    def refresh_then_stop():
        original()
        g.stop()
        done.set()

    g._refresh = refresh_then_stop
    assert done.wait(10)
    deadline = time.monotonic() + 5
    while gauge.polling_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gauge.polling_threads() == []


def test_a_failing_source_keeps_the_last_reading_and_says_why(monkeypatch):
    g = helpers.MemoryGauge(spec_example())
    before = g.reading

    def broken(kind, arg):
        raise RuntimeError("GPU has fallen off the bus")

    monkeypatch.setattr(gauge, "_read", broken)
    after = g.update(force=True)  # inside a training loop: must not raise
    assert after.used_bytes == before.used_bytes
    assert "GPU has fallen off the bus" in after.detail


# ------------------------------------------------ CUDA-only paths (rehearsed on the CPU)
@pytest.fixture
def cuda_torch(monkeypatch):
    """torch.cuda as on a 2-GPU machine, CUDA not initialised; get_device_properties would
    initialise it (torch.cuda._lazy_init), so calls are recorded."""
    import torch

    calls = []
    state = {"initialised": False}

    def properties(i):
        calls.append(i)
        state["initialised"] = True  # what torch.cuda._lazy_init() does
        return types.SimpleNamespace(uuid=f"GPU-{1 - i}")  # torch's order is NVML's reversed

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: state["initialised"])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(gauge, "_tf_current", lambda i: None)
    return types.SimpleNamespace(calls=calls, state=state)


def test_gauge_does_not_initialise_cuda_to_match_gpus(fake_nvml, cuda_torch):
    helpers.read_memory("cuda:0")
    helpers.GpuWatch(interval=None).text()
    assert cuda_torch.calls == [] and not cuda_torch.state["initialised"]
    assert gauge._torch_index_for(0) == -1  # no torch statistics before CUDA starts
    cuda_torch.state["initialised"] = True  # the learner's code started CUDA
    assert gauge._torch_index_for(0) == 1 and gauge._torch_index_for(1) == 0


class OldDriverNVML(FakeNVML):
    """pynvml over a driver without nvmlDeviceGetComputeRunningProcesses_v3."""

    class NVMLLibraryMismatchError(Exception):  # pynvml's is not an NVMLError
        pass

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        raise self.NVMLLibraryMismatchError(
            "Unversioned function called and the pyNVML version does not match the NVML lib "
            "version. Either use matching pyNVML and NVML lib versions or use a versioned "
            "function such as nvmlDeviceGetComputeRunningProcesses_v2")


def test_an_old_driver_without_the_process_query_degrades(fake_nvml, monkeypatch):
    import os

    monkeypatch.setitem(sys.modules, "pynvml", OldDriverNVML(os.getpid()))
    monkeypatch.setattr(gauge, "_torch_stats", lambda i: None)
    assert nvml.gpu_processes(0) is None
    reading = helpers.read_memory("cuda:0")
    assert "per-process memory: not reported by this driver" in reading.detail
    assert helpers.MemoryGauge(0).reading.label == "GPU0"
    assert helpers.GpuWatch(interval=None).text().startswith("NVIDIA driver 580.95.05")
    old = sys.modules["pynvml"]  # where pynvml offers the _v2 query, it answers instead
    old.nvmlDeviceGetComputeRunningProcesses_v2 = types.MethodType(
        FakeNVML.nvmlDeviceGetComputeRunningProcesses, old)
    assert [p.used_bytes for p in nvml.gpu_processes(0)] == [3 * GiB, GiB]


def test_container_pids_are_said_to_be_invisible(fake_nvml, monkeypatch):
    """Without the host's PID namespace NVML's PIDs never match os.getpid()."""
    host_pids = [2**22 + 12345, 2**22 + 12346]  # above Linux's default pid_max: not here
    monkeypatch.setattr(fake_nvml, "nvmlDeviceGetComputeRunningProcesses", lambda h: [
        types.SimpleNamespace(pid=pid, usedGpuMemory=2 * GiB) for pid in host_pids])
    monkeypatch.setattr(gauge, "_torch_stats", lambda i: None)
    monkeypatch.setattr(gauge, "_tf_current", lambda i: None)
    detail = helpers.read_memory("cuda:0").detail
    assert ("per-process memory: PIDs not visible in this container (NVML reports the host's);"
            " 2 process(es) 4.0 GiB in all") in detail, detail
    assert "this process 0.0 GiB" not in detail


def test_a_pid_that_exists_here_but_is_not_this_cuda_process_is_foreign(fake_nvml, cuda_torch,
                                                                        monkeypatch):
    import os

    cuda_torch.state["initialised"] = True  # this process uses CUDA, yet NVML lists only
    monkeypatch.setattr(fake_nvml, "pid", 1)  # PIDs 1 and 1, which exist here
    assert os.path.exists("/proc/1")
    monkeypatch.setattr(gauge, "_torch_stats", lambda i: None)
    assert "PIDs not visible in this container" in helpers.read_memory("cuda:0").detail
    monkeypatch.setattr(gauge, "_proc_cache", {})
    monkeypatch.setattr(fake_nvml, "pid", os.getpid())  # the host's PID namespace
    assert "this process 3.0 GiB" in helpers.read_memory("cuda:0").detail
