"""GPU checks of lesson 07's claims: what mixed precision saves in memory and time, on a GPU.

On a machine with a CUDA GPU::

    python tests/gpu/test_amp_gpu.py           # measures, prints, writes the results file
    python -m pytest tests/gpu/test_amp_gpu.py -m gpu -q    # the same, as tests

Without a GPU the tests skip with the reason, and the script says so and exits 0 without
writing anything (``--selftest-cpu`` runs the same code paths on the CPU with tiny sizes, to
check the script itself; it writes nothing either).

What it measures:

1. Memory: two Adam steps of the lesson's models in fp32, bf16 and fp16 (autocast), with
   ``helpers.measure_step`` on the GPU: exact tensor bytes by category and
   ``torch.cuda.max_memory_allocated``. Claims checked (on the exact tensor bytes):
   parameters, gradients and optimizer state do not shrink; the peak never halves; it
   falls clearly for activation-dominated runs and barely for the parameter-dominated one.
   Each row also holds the CPU full-scale prediction the lesson shows.
2. Speed: time per training step in fp32, bf16 and fp16 (with ``GradScaler``), measured
   side by side with ``helpers.compare_times`` (interleaved rounds, best of each, CUDA
   synchronised). Printed and recorded; speed-ups are never asserted.
3. Keras, when TensorFlow sees the GPU: a training step under the float32,
   mixed_float16 and mixed_bfloat16 policies, timed the same way.

Results (hardware, driver, versions, settings, date, figures) go to
``tests/gpu/results/amp.json``; lesson 07b shows them on CPU machines, labelled, through
``helpers.recorded_gpu_results("amp")``.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import os
import platform
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import helpers  # noqa: E402
from helpers.core.recorded import KIND, results_dir  # noqa: E402

pytestmark = pytest.mark.gpu
NO_GPU = "needs a CUDA GPU (torch.cuda.is_available() is False): run it on a GPU machine"
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
RESULTS_NAME = "amp"
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}

# (model, batch, activation-dominated?) for the memory check: the lesson's MLP at its batch
# size (parameter-dominated) and at a large one, and the lesson's ResNet-18.
MEMORY_RUNS = [("mlp", 256, False), ("mlp", 16384, True), ("resnet18", 256, True)]
# (model, batch) for the speed check: the lesson's MLP, then runs large enough for tensor
# cores to matter.
SPEED_RUNS = [("mlp", 256), ("mlp-wide", 8192), ("resnet50", 64), ("transformer", 16)]


def build(name: str, batch: int, device):
    """Model, optimizer, batch and loss function for ``name`` on ``device`` ("cuda", "cpu",
    or None: fake CPU tensors, inside ``helpers.full_scale()``)."""
    torch.manual_seed(0)
    classes = 10
    if name == "mlp":            # the lesson model
        model, shape = helpers.MLP(256, 1024, 4, 10), (256,)
    elif name == "mlp-wide":
        model, shape = helpers.MLP(1024, 4096, 4, 10), (1024,)
    elif name == "mlp-tiny":     # --selftest-cpu
        model, shape = helpers.MLP(16, 32, 2, 10), (16,)
    elif name in ("resnet18", "resnet50"):
        model, shape, classes = helpers.ResNet(int(name[6:])), (3, 224, 224), 1000
    elif name == "cnn-tiny":     # --selftest-cpu
        model, shape = helpers.SmallCNN(3, 10, 8), (3, 32, 32)
    elif name == "transformer":
        model, shape = helpers.TransformerBlock(1024, 16), (512, 1024)
    elif name == "transformer-tiny":
        model, shape = helpers.TransformerBlock(32, 4), (8, 32)
    else:
        raise ValueError(f"unknown model {name!r}")
    model = model if device is None else model.to(device)  # fake tensors cannot be moved
    dev = "cpu" if device is None else device
    x = torch.randn(batch, *shape, device=dev)
    if name.startswith("transformer"):
        y = torch.randn(batch, *shape, device=dev)
        loss_fn = nn.functional.mse_loss
    else:
        y = torch.randint(0, classes, (batch,), device=dev)
        loss_fn = nn.functional.cross_entropy
    return model, torch.optim.Adam(model.parameters()), x, y, loss_fn


def train_step(model, optimizer, x, y, loss_fn, precision: str, *, scaler: bool):
    """One training step in ``precision``; fp16 with a GradScaler when ``scaler``."""
    dtype = DTYPES[precision]
    device_type = x.device.type
    grad_scaler = torch.amp.GradScaler(device_type, enabled=scaler and precision == "fp16")

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.amp.autocast(device_type=device_type, dtype=dtype or torch.float32,
                                enabled=dtype is not None):
            loss = loss_fn(model(x), y)
        grad_scaler.scale(loss).backward()
        grad_scaler.step(optimizer)
        grad_scaler.update()

    return step


def precisions(device: str) -> list[str]:
    """fp32 and fp16 everywhere; bf16 where the GPU computes it natively (and on the CPU)."""
    names = ["fp32"]
    if device != "cuda" or torch.cuda.is_bf16_supported(including_emulation=False):
        names.append("bf16")
    names.append("fp16")
    return names


def cleanup() -> None:
    """Free the GPU memory of the previous run (nothing to do on the CPU)."""
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _measure(name, batch, precision, device):
    """(exact tensor peak, allocator peak or None, category_max) of two Adam steps."""
    cleanup()
    cuda = device == "cuda"
    start = torch.cuda.memory_allocated() if cuda else 0
    with helpers.full_scale("cpu") if device is None else contextlib.nullcontext():
        model, opt, x, y, loss_fn = build(name, batch, device)
        step = train_step(model, opt, x, y, loss_fn, precision, scaler=False)
        report = helpers.measure_step(step, model=model, optimizer=opt, inputs=(x, y),
                                      steps=2)
    allocator = report.cuda.peak_allocated_bytes - start if report.cuda is not None else None
    del model, opt, x, y, step
    cleanup()
    cats = {k: report.category_max[k] for k in ("parameters", "gradients", "optimizer_state",
                                                "activations")}
    return report.peak_bytes, allocator, cats


def memory_row(name: str, batch: int, act_dominated: bool, device: str = "cuda") -> dict:
    """Peaks of one model in every precision on ``device``, and the CPU's prediction."""
    row = {"model": name, "batch": batch, "activation_dominated": act_dominated,
           "peak_bytes": {}, "tensor_peak_bytes": {}, "categories": {},
           "cpu_full_scale_peak_bytes": {}}
    for p in precisions(device):
        tensors, allocator, cats = _measure(name, batch, p, device)
        row["tensor_peak_bytes"][p] = tensors
        row["peak_bytes"][p] = allocator if allocator is not None else tensors
        row["categories"][p] = cats
        row["cpu_full_scale_peak_bytes"][p] = _measure(name, batch, p, None)[0]
    return row


def check_memory_claims(row: dict) -> list[str]:
    """The lesson's memory claims for one row; returns what failed (empty: all hold)."""
    failed = []
    exact = row["tensor_peak_bytes"]
    for p in exact:
        if p == "fp32":
            continue
        for cat in ("parameters", "gradients", "optimizer_state"):
            if row["categories"][p][cat] != row["categories"]["fp32"][cat]:
                failed.append(f"{row['model']} {p}: {cat} changed")
        ratio = exact[p] / exact["fp32"]
        if ratio <= 0.5:
            failed.append(f"{row['model']} b{row['batch']} {p}: peak ratio {ratio:.2f} <= 0.5")
        if row["activation_dominated"] and ratio >= 0.8:
            failed.append(f"{row['model']} b{row['batch']} {p}: activation-dominated, yet "
                          f"ratio {ratio:.2f}")
        if not row["activation_dominated"] and ratio < 0.9:
            failed.append(f"{row['model']} b{row['batch']} {p}: parameter-dominated, yet "
                          f"ratio {ratio:.2f}")
    return failed


def speed_row(name: str, batch: int, device: str = "cuda", *, rounds: int = 5,
              number: int = 5) -> dict:
    """Time per training step in every precision, side by side."""
    cleanup()
    steps, keep = {}, []
    for p in precisions(device):
        model, opt, x, y, loss_fn = build(name, batch, device)
        keep.append((model, opt, x, y))
        steps[p] = train_step(model, opt, x, y, loss_fn, p, scaler=True)
    times = helpers.compare_times(steps, rounds=rounds, number=number, warmup=3, sync=device)
    del steps, keep
    cleanup()
    return {"model": name, "batch": batch, "seconds": times.best_seconds,
            "speedup": {p: times.speedup(p) for p in times.names}}


def keras_speed(*, width: int = 4096, batch: int = 4096, rounds: int = 5,
                number: int = 5) -> dict:
    """A Keras training step under float32 and the mixed policies, when TF sees a GPU."""
    try:
        from helpers.tf.policies import tensorflow as _tf

        tf = _tf()
    except ImportError as exc:
        return {"skipped": f"TensorFlow is not installed ({exc})"}
    if not tf.config.list_physical_devices("GPU"):
        return {"skipped": "TensorFlow sees no GPU (install tensorflow[and-cuda])"}
    import numpy as np

    keras = tf.keras
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, width)).astype("float32")
    y = rng.integers(0, 10, size=batch)
    fns = {}
    for policy in ("float32", "mixed_float16", "mixed_bfloat16"):
        with helpers.keras_policy(policy):
            model = keras.Sequential([
                keras.Input((width,)), keras.layers.Dense(width, activation="relu"),
                keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10),
                keras.layers.Activation("softmax", dtype="float32")])
        model.compile(optimizer=keras.optimizers.Adam(), loss="sparse_categorical_crossentropy")
        fns[policy] = lambda m=model: m.train_on_batch(x, y)
    times = helpers.compare_times(fns, rounds=rounds, number=number, warmup=2)
    return {"width": width, "batch": batch, "seconds": times.best_seconds,
            "speedup": {p: times.speedup(p) for p in times.names},
            "onednn": helpers.onednn_setting(),
            # TensorFlow's default: fp32 matmuls and convolutions in TF32 on Ampere and newer
            "tf32": helpers.tf32_enabled()}


def hardware() -> dict:
    props = torch.cuda.get_device_properties(0)
    hw = {"gpu": props.name, "total_bytes": int(props.total_memory),
          "capability": f"{props.major}.{props.minor}", "torch": torch.__version__,
          "cuda": torch.version.cuda, "cudnn": str(torch.backends.cudnn.version()),
          "python": platform.python_version()}
    try:
        import pynvml

        pynvml.nvmlInit()
        hw["driver"] = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - NVML missing: record why
        hw["driver"] = f"unknown ({type(exc).__name__})"
    return hw


def settings() -> dict:
    """Settings that change fp32 speed on GPUs (TF32) and the comparison's method."""
    tf32 = helpers.tf32_settings("cuda")   # the fp32_precision switches (never raises)
    return {"fp32_precision": dict(zip(("cuda.matmul", "cudnn.conv", "cudnn.rnn"),
                                       tf32.values, strict=True)),
            "fp32_baseline": tf32.baseline(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "timing": "helpers.compare_times: best of 5 interleaved rounds of 5 steps, "
                      "CUDA synchronised; fp16 with GradScaler",
            "memory": "helpers.measure_step, 2 Adam steps, no GradScaler"}


def run_all(write: bool = True) -> dict:
    results = {
        "kind": KIND, "script": "tests/gpu/test_amp_gpu.py",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "hardware": hardware(), "settings": settings(),
        "memory": [memory_row(n, b, a) for n, b, a in MEMORY_RUNS],
        "speed": [speed_row(n, b) for n, b in SPEED_RUNS],
    }
    results["claims_failed"] = [f for row in results["memory"]
                                for f in check_memory_claims(row)]
    results["keras"] = keras_speed()
    if write:
        results_dir().mkdir(parents=True, exist_ok=True)
        path = results_dir() / f"{RESULTS_NAME}.json"
        path.write_text(json.dumps(results, indent=2) + "\n")
    return results


def format_results(results: dict) -> str:
    hw = results.get("hardware", {})
    head = (f"{hw.get('gpu', 'no GPU')} (driver {hw.get('driver', '-')}, torch "
            f"{hw.get('torch', torch.__version__)})")
    parts = [head] + [t.text() for t in helpers.amp.recorded_tables(results)]
    failed = results.get("claims_failed", [])
    parts.append("memory claims: " + ("all hold" if not failed else "FAILED: " +
                                      "; ".join(failed)))
    return "\n\n".join(parts)


# ---------------------------------------------------------------- as tests
@pytest.fixture(scope="module")
def gpu_results():
    results = run_all(write=True)
    print(format_results(results))
    return results


@requires_cuda
def test_amp_memory_claims_hold_on_the_gpu(gpu_results):
    assert gpu_results["claims_failed"] == []


@requires_cuda
def test_speedups_are_measured_and_recorded(gpu_results):
    for row in gpu_results["speed"]:
        assert set(row["seconds"]) >= {"fp32", "fp16"}
        assert all(s > 0 for s in row["seconds"].values())
    assert (results_dir() / f"{RESULTS_NAME}.json").is_file()
    assert helpers.recorded_gpu_results(RESULTS_NAME) is not None


def test_skips_without_a_gpu_with_the_reason(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the checks above ran")
    path = results_dir() / f"{RESULTS_NAME}.json"
    before = path.stat().st_mtime_ns if path.exists() else None
    assert main([]) == 0
    assert "needs a CUDA GPU" in capsys.readouterr().out
    assert (path.stat().st_mtime_ns if path.exists() else None) == before


@pytest.mark.slow
def test_selftest_runs_every_code_path_on_the_cpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the real checks run instead")
    results = _selftest_cpu()
    assert results["claims_failed"] == [], results["claims_failed"]
    text = format_results(results)
    assert "fp32 peak" in text and "bf16 speed-up" in text


# ---------------------------------------------------------------- as a script
def _selftest_cpu() -> dict:
    """Every code path (except Keras and hardware) with the CPU standing in for the GPU."""
    memory = [memory_row("mlp-tiny", 8, False, "cpu"), memory_row("cnn-tiny", 8, True, "cpu")]
    return {"memory": memory,
            "speed": [speed_row("mlp-tiny", 64, "cpu", rounds=2, number=1)],
            "claims_failed": [f for row in memory for f in check_memory_claims(row)]}


def main(argv: list[str]) -> int:
    if "--selftest-cpu" in argv:
        results = _selftest_cpu()
        print(format_results(results))
        return 0 if not results["claims_failed"] else 1
    if not torch.cuda.is_available():
        print(f"skipped: {NO_GPU}. Nothing was measured or written.")
        return 0
    os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    results = run_all(write=True)
    print(format_results(results))
    print(f"written: {results_dir() / (RESULTS_NAME + '.json')}")
    return 0 if not results["claims_failed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
