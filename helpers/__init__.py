"""helpers: the small package the gpu-lessons notebooks import.

``import helpers`` is cheap: it imports neither torch nor TensorFlow.  Names are loaded from
their module on first use (``helpers.device_report`` imports :mod:`helpers.core.device`, and so
on); framework-specific modules import their framework only then.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    # foundation
    "setup": "core.environment",
    "pick_device": "core.environment",
    "SetupReport": "core.environment",
    "device_report": "core.device",
    "DeviceReport": "core.device",
    "check": "core.exercises",
    "NotSolved": "core.exercises",
    "Table": "core.fmt",
    "fmt_bytes": "core.fmt",
    "fmt_mib": "core.fmt",
    "fmt_gib": "core.fmt",
    "fmt_seconds": "core.fmt",
    "fmt_rate": "core.fmt",
    "fmt_ratio": "core.fmt",
    "MiB": "core.fmt",
    "GiB": "core.fmt",
    "classification_data": "core.data",
    "image_data": "core.data",
    "torch_dataset": "core.data",
    "torch_loader": "core.data",
    "rehearse_batch_job": "core.batch_job",
    "BatchJobResult": "core.batch_job",
    "MLP": "models",
    "SmallCNN": "models",
    "count_parameters": "models",
    "headless": "core.runtime",
    "reveal": "authoring.instructor",
    # lesson 03: launching distributed runs, saving and resuming training
    "DDPPlan": "launch",
    "RunResult": "launch",
    "command_text": "launch",
    "ddp_plan": "launch",
    "free_port": "launch",
    "run_captured": "launch",
    "run_command": "launch",
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
    "MemoryGauge": "watch.gauge",
    "MemoryReading": "watch.gauge",
    "GpuWatch": "watch.gauge",
    "read_memory": "watch.gauge",
    "watch_gpus": "watch.gauge",
    "LivePlot": "watch.liveplot",
    "LivePlotSummary": "watch.liveplot",
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
    "recorded_gpu_results": "core.recorded",
    "RecordedGpuResults": "core.recorded",
    # memory (lessons 04-08): exact accounting, virtual GPU, full-scale mode
    "ResNet": "models",
    "TransformerBlock": "models",
    "VirtualGPU": "memory.virtual",
    "first_matmul_memory": "memory.workspaces",  # lesson 04: the cuBLAS workspace, measured
    "SimulatedCuda": "memory.cuda_standin",  # CPU rehearsals of CUDA code (tests/rehearsal)
    "virtual_cuda": "memory.notebook_cuda",  # plain CUDA code in notebook cells, on a virtual card
    "FakeNvml": "core.fake_nvml",
    "FakeGpu": "core.fake_nvml",  # lesson 04: a node whose NVML order is not cuda:N
    "current_virtual_gpu": "memory.state",
    "full_scale": "memory.virtual",
    "measure_step": "memory.measure",
    "MemoryReport": "memory.report",
    "parse_capacity": "memory.capacity",
    "KNOWN_GPUS": "memory.capacity",
    # Keras track (lessons 05 and 08): a step's memory line and the Keras virtual card
    "measure_keras_memory": "tf.memory_fit",
    "KerasMemoryFit": "tf.memory_fit",
    # lesson 10: plan a cluster job from an unmodified script
    "will_it_fit": "memory.planner",
    "Plan": "memory.planner",
    "PlanError": "memory.planner",
    "KerasVirtualGPU": "tf.virtual_card",
    "KerasOOM": "tf.virtual_card",
    "keras_resnet": "tf.models",
    # mixed precision (lesson 07)
    "amp_settings": "amp",
    "AmpSettings": "amp",
    "tf32_settings": "amp",
    "trace_dtypes": "amp",
    "compare_memory": "amp",
    "compare_times": "core.timing",
    "TimeComparison": "core.timing",
    "keras_mixed_policy": "tf.policies",
    "keras_policy": "tf.policies",
    "onednn_setting": "tf.policies",
    # batch size (lesson 05): the finder
    "find_batch_size": "batch_size",
    "BatchSizeResult": "batch_size",
    "BatchSizeError": "batch_size",
    "is_oom_error": "memory.errors",
    "warm_up_cuda": "memory.errors",
    # the out-of-memory challenge (lesson 08)
    "LargeResNet": "oom",
    "SyntheticImages": "oom",
    "TrainingCheck": "oom",
    "check_training": "oom",
    "loop_step": "oom",
    "count_flops": "oom",
    "fix_table": "oom",
    "plot_fixes": "oom",
    # reached by the notebooks (00, 04, 07, 09)
    "nvml_status": "core.nvml",
    "gpu_memory": "core.nvml",
    "gpu_count": "core.nvml",
    "gpu_utilization": "core.nvml",
    "polling_threads": "watch.gauge",
    "recorded_tables": "amp",
}

_SUBMODULES = {
    # layers (folders)
    "core", "memory", "tf", "watch", "authoring",
    # topics
    "amp", "batch_size", "checkpoint", "launch", "models", "oom", "throughput",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        if _EXPORTS[name] in ("core.environment", "core.device"):
            # the TensorFlow side of setup() and device_report() installs itself on import
            # (helpers.tf.runtime imports TensorFlow only when it is used)
            importlib.import_module(".tf.runtime", __name__)
        module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
        value = getattr(module, name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'helpers' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS) | _SUBMODULES)
