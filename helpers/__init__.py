"""helpers: the small package the gpu-lessons notebooks import.

``import helpers`` is cheap: it imports neither torch nor TensorFlow.  Names are loaded from
their module on first use (``helpers.device_report`` imports :mod:`helpers.device`, and so
on); framework-specific modules import their framework only then.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    # foundation
    "setup": "environment",
    "pick_device": "environment",
    "SetupReport": "environment",
    "device_report": "device",
    "DeviceReport": "device",
    "check": "exercises",
    "NotSolved": "exercises",
    "progress": "progress",
    "Table": "fmt",
    "fmt_bytes": "fmt",
    "fmt_mib": "fmt",
    "fmt_gib": "fmt",
    "fmt_seconds": "fmt",
    "fmt_rate": "fmt",
    "fmt_ratio": "fmt",
    "MiB": "fmt",
    "GiB": "fmt",
    "classification_data": "data",
    "image_data": "data",
    "torch_dataset": "data",
    "torch_loader": "data",
    "MLP": "models",
    "SmallCNN": "models",
    "count_parameters": "models",
    "headless": "runtime",
    "reveal": "instructor",
    # lesson 03: launching distributed runs, saving and resuming training
    "DDPPlan": "launch",
    "RunResult": "launch",
    "command_text": "launch",
    "ddp_plan": "launch",
    "free_port": "launch",
    "run_captured": "launch",
    "script_path": "launch",
    "tf_config": "launch",
    "torchrun_command": "launch",
    "CheckpointInfo": "checkpoint",
    "load_checkpoint": "checkpoint",
    "read_checkpoint": "checkpoint",
    "rng_state": "checkpoint",
    "save_checkpoint": "checkpoint",
    "set_rng_state": "checkpoint",
    "unwrap": "checkpoint",
    # monitoring (lesson 04)
    "MemoryGauge": "gauge",
    "MemoryReading": "gauge",
    "GpuWatch": "gauge",
    "read_memory": "gauge",
    "watch_gpus": "gauge",
    "LivePlot": "liveplot",
    "LivePlotSummary": "liveplot",
    # throughput (lesson 09)
    "SlowDataset": "throughput",
    "StepTimer": "throughput",
    "StepTimes": "throughput",
    "compare": "throughput",
    "Comparison": "throughput",
    "RungResult": "throughput",
    "throughput_gpu_results": "throughput",
    "RecordedResults": "throughput",
    # results recorded on a real GPU by tests/gpu/ scripts, shown labelled on CPU machines
    "recorded_gpu_results": "recorded",
    "RecordedGpuResults": "recorded",
    # memory (issue 3): exact accounting, virtual GPU, full-scale mode
    "ResNet": "models",
    "TransformerBlock": "models",
    "VirtualGPU": "memory.virtual",
    "SimulatedCuda": "memory.cuda_standin",  # CPU rehearsals of CUDA code (tests/rehearsal)
    "FakeNvml": "fake_nvml",
    "current_virtual_gpu": "memory.state",
    "full_scale": "memory.virtual",
    "measure_step": "memory.measure",
    "MemoryReport": "memory.report",
    "parse_capacity": "memory.capacity",
    "KNOWN_GPUS": "memory.capacity",
    "measure_keras_step": "memory.keras",
    # mixed precision (issue 7)
    "amp_settings": "amp",
    "AmpSettings": "amp",
    "trace_dtypes": "amp",
    "compare_memory": "amp",
    "compare_times": "timing",
    "TimeComparison": "timing",
    "keras_mixed_policy": "keras_amp",
    "keras_policy": "keras_amp",
    "onednn_setting": "keras_amp",
    # batch size (issue 6): the finder
    "find_batch_size": "batch_size",
    "BatchSizeResult": "batch_size",
    "BatchSizeError": "batch_size",
    "is_oom_error": "batch_size",
    # the out-of-memory challenge (lesson 08)
    "LargeResNet": "oom",
    "SyntheticImages": "oom",
    "TrainingCheck": "oom",
    "check_training": "oom",
    "count_flops": "oom",
    "fix_table": "oom",
    "plot_fixes": "oom",
}

_SUBMODULES = {
    "amp", "batch_size", "build", "checkpoint", "data", "device", "environment", "exercises",
    "fmt", "gauge", "instructor", "keras_amp", "launch", "liveplot", "memory", "models", "nvml",
    "oom", "progress", "recorded", "runtime", "throughput", "timing", "validate",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
        value = getattr(module, name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'helpers' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS) | _SUBMODULES)
