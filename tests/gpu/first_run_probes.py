"""The first GPU run's facts and probes (tests/gpu/first_run.sh, steps 2 and 3).

    python tests/gpu/first_run_probes.py facts  --out DIR   # facts.json: the node
    python tests/gpu/first_run_probes.py probes --out DIR   # probes.json: what the review asked

``facts``: driver and GPUs (nvidia-smi, NVML), MIG mode, the GPU visibility verdict, Python,
torch, CUDA, cuDNN (and the cuDNN library files next to torch), TensorFlow if any, whether
``/proc/<pid>/status`` has ``VmHWM`` (the kernels' host-memory budget reads it), CPU count.

``probes`` (turn-3 GPU review, section 6), each measured on GPU 0:

* ``workspace``: what one training step leaves in ``memory_allocated()`` once its tensors are
  gone (the cuBLAS workspaces: one per thread that ran matrix products), against
  ``torch.backends.cuda.cublas_workspace_size()``;
* ``cap``: whether a cuBLAS workspace counts against ``set_per_process_memory_fraction``
  (test_memory_gpu's out-of-memory check rests on it);
* ``layouts``: lesson 09's small convnet in NCHW and channels-last: the largest difference of
  the outputs with cuDNN's default TF32 convolutions and with TF32 off (the lesson asserts
  ``atol=1e-5``);
* ``nvml``: GPU-Util of the process's GPU through the kit (``gpu_utilization_or_why``) and
  StepTimer's note after a few steps.

Without a usable GPU (the dry run on a CPU) every probe runs its CPU stand-in instead (a
virtual GPU with workspaces, CPU convolutions) and says so: ``"device": "cpu (dry run)"``.
Each probe that raises is recorded with its error; the others still run. Exit status 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
MiB = 2**20


def _run(cmd: list[str], timeout: int = 30) -> str:
    if shutil.which(cmd[0]) is None:
        return f"{cmd[0]}: not found"
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return (done.stdout + done.stderr).strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{' '.join(cmd)}: {type(exc).__name__}: {exc}"


def facts() -> dict:
    out = {"python": platform.python_version(), "executable": sys.executable,
           "cpu_count": os.cpu_count(), "platform": platform.platform(),
           "nvidia_smi": _run(["nvidia-smi"]),
           "nvidia_smi_mig": _run(["nvidia-smi", "--query-gpu=index,name,mig.mode.current,"
                                   "driver_version,memory.total", "--format=csv"]),
           "nvidia_smi_list": _run(["nvidia-smi", "-L"]),
           "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
    status = Path("/proc/self/status")
    out["vmhwm_in_proc_status"] = status.is_file() and "VmHWM:" in status.read_text()
    from helpers.core.gpu_visibility import gpu_visibility

    vis = gpu_visibility()
    out["gpu_visibility"] = {"verdict": vis.verdict, "message": vis.message,
                             "driver": vis.driver, "details": vis.details,
                             "nvml_gpus": [dataclasses.asdict(g) for g in vis.nvml_gpus]}
    import torch

    out["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                    "file": torch.__file__, "arch_list": _try(torch.cuda.get_arch_list),
                    "cudnn": _try(torch.backends.cudnn.version)}
    lib = Path(torch.__file__).parent.parent / "nvidia"
    out["nvidia_libraries"] = sorted(str(Path(p).relative_to(lib))
                                     for p in glob.glob(str(lib / "*" / "lib" / "*.so*")))
    if vis.usable:
        props = torch.cuda.get_device_properties(0)
        out["gpu0"] = {"name": props.name, "total_bytes": props.total_memory,
                       "capability": f"{props.major}.{props.minor}",
                       "uuid": str(getattr(props, "uuid", "")),
                       "bf16": torch.cuda.is_bf16_supported()}
    try:
        import tensorflow as tf

        out["tensorflow"] = {"version": tf.__version__, **tf.sysconfig.get_build_info()}
    except ImportError as exc:
        out["tensorflow"] = f"absent ({exc})"
    return out


def _try(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a fact that cannot be read says why
        return f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------- probes
def _clear_workspaces(torch) -> None:
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def probe_workspace(torch, device) -> dict:
    """Bytes a training step leaves allocated once its tensors are freed (the workspaces)."""
    from torch import nn

    _clear_workspaces(torch)
    before = torch.cuda.memory_allocated(device)
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    x = torch.randn(64, 512, device=device)
    model(x).square().mean().backward()
    torch.cuda.synchronize(device)
    params = sum(p.numel() * 4 for p in model.parameters())
    del model, x
    torch.cuda.synchronize(device)
    left = torch.cuda.memory_allocated(device) - before
    size = _try(lambda: int(torch.backends.cuda.cublas_workspace_size()))
    return {"left_after_one_step_bytes": left, "parameters_bytes": params,
            "cublas_workspace_size": size,
            "workspaces_held": round(left / size, 2) if isinstance(size, int) and size else None}


def probe_cap(torch, device) -> dict:
    """Does a cuBLAS workspace count against set_per_process_memory_fraction? Fill the cap to
    within half a workspace, then run one matrix product on fresh workspaces."""
    ws = _try(lambda: int(torch.backends.cuda.cublas_workspace_size()))
    ws = ws if isinstance(ws, int) and ws > 0 else 32 * MiB
    torch.cuda.empty_cache()
    _clear_workspaces(torch)
    total = torch.cuda.get_device_properties(device).total_memory
    cap = 256 * MiB
    torch.cuda.set_per_process_memory_fraction(cap / total, device)
    filler = a = None
    try:
        a = torch.randn(64, 64, device=device)
        room = cap - torch.cuda.memory_reserved(device)
        filler = torch.empty(max(0, room - ws // 2 - 2 * MiB), dtype=torch.uint8,
                             device=device)
        _clear_workspaces(torch)
        try:
            (a @ a).sum().item()
            counted, error = False, None
        except torch.OutOfMemoryError as exc:
            counted, error = True, str(exc).splitlines()[0]
    finally:
        del filler, a
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()
    return {"cap_bytes": cap, "workspace_bytes": ws, "workspace_counted_against_cap": counted,
            "error": error}


def probe_layouts(torch, device) -> dict:
    """Lesson 09 cell 96: NHWC against NCHW outputs, TF32 convolutions on (default) and off."""
    from torch import nn

    def small_convnet():
        return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                             nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))

    torch.manual_seed(0)
    nchw = small_convnet().to(device)
    nhwc = small_convnet().to(device, memory_format=torch.channels_last)
    nhwc.load_state_dict(nchw.state_dict())
    x = torch.randn(16, 3, 32, 32, device=device)
    out = {}
    conv = torch.backends.cudnn.conv
    saved = getattr(conv, "fp32_precision", None)
    for name, precision in (("default", saved), ("tf32_off", "ieee")):
        if precision is not None:
            conv.fp32_precision = precision
        with torch.no_grad():
            diff = (nhwc(x.to(memory_format=torch.channels_last)) - nchw(x)).abs().max().item()
        out[name] = {"cudnn.conv.fp32_precision": getattr(conv, "fp32_precision", None),
                     "max_abs_difference": diff, "allclose_atol_1e-5": diff <= 1e-5}
    if saved is not None:
        conv.fp32_precision = saved
    return out


def probe_nvml(torch, device) -> dict:
    import helpers
    from helpers.core import nvml

    ok, why = nvml.nvml_status()
    out = {"nvml": why if ok else f"unavailable: {why}",
           "gpu0_utilization": nvml.gpu_utilization_or_why(0) if ok and nvml.gpu_count()
           else None}
    timer = helpers.StepTimer(sync=device, show=False)
    x = torch.randn(2048, 2048, device=device)
    for _ in timer.wrap(range(20)):
        (x @ x).sum().item()
        timer.step(samples=1)
    out["steptimer"] = {"note": timer.gpu_util_note, "samples": timer.util[:5],
                        "summary": str(timer.close())}
    return out


def probes() -> dict:
    import torch

    from helpers.core.gpu_visibility import gpu_visibility

    usable = gpu_visibility().usable
    device = torch.device("cuda", 0) if usable else torch.device("cpu")
    out = {"device": str(device) if usable else "cpu (dry run: CPU stand-ins, no GPU figures)"}
    table = {"workspace": probe_workspace, "cap": probe_cap, "layouts": probe_layouts,
             "nvml": probe_nvml}
    if not usable:  # the stand-ins: the same code where it can run on the CPU
        table = {"workspace": _virtual_workspace, "cap": _virtual_cap,
                 "layouts": probe_layouts, "nvml": probe_nvml}
    for name, probe in table.items():
        try:
            out[name] = probe(torch, device)
        except Exception as exc:  # noqa: BLE001 - record it, run the other probes
            out[name] = {"error": f"{type(exc).__name__}: {exc}",
                         "traceback": traceback.format_exc()[-2000:]}
    return out


def _virtual_workspace(torch, device) -> dict:
    import helpers

    with helpers.VirtualGPU("H200", workspaces=True, device="cpu"):
        first = helpers.first_matmul_memory()
    return {"stand_in": "VirtualGPU('H200', workspaces=True)", "first_matmul": str(first)}


def _virtual_cap(torch, device) -> dict:
    import helpers

    with helpers.VirtualGPU("256 MiB", workspaces=True, device="cpu") as gpu:
        a = torch.randn(64, 64)
        (a @ a).sum().item()
        held = gpu.workspace_bytes
    return {"stand_in": "VirtualGPU('256 MiB', workspaces=True)", "workspace_bytes_held": held}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["facts", "probes"])
    parser.add_argument("--out", type=Path, required=True, help="folder for <what>.json")
    args = parser.parse_args(argv)
    result = facts() if args.what == "facts" else probes()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.what}.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps(result, indent=1, default=str)[:6000])
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
