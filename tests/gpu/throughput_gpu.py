"""Record lessons 09 and 09b's throughput ladders on a real CUDA GPU.

Runs the same workloads as solutions/09_throughput.ipynb (the starved loop on
``helpers.SlowDataset``, the DataLoader rungs) and solutions/09b_faster_steps.ipynb (the
training-step rungs) plus the rungs only a
GPU can run, ``pin_memory`` + ``non_blocking`` and CUDA graphs
(``torch.compile(mode="reduce-overhead")``), and ``torch.compile`` on the GPU.  It writes one
small JSON file with the hardware, versions, date and figures, which the lesson shows,
labelled, under its own measurements::

    python tests/gpu/throughput_gpu.py                 # tests/gpu/results/09_throughput.json
    python tests/gpu/throughput_gpu.py --out run.json  # somewhere else

Without a CUDA GPU it says so and records nothing (exit code 0): a CPU run must never pass
for a GPU record.  ``--device cpu --out FILE`` runs the CPU rungs only, for testing this
script; such a file names no GPU, and ``helpers.recorded_gpu_results`` refuses it.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import sys
from functools import partial
from pathlib import Path

import helpers
from helpers.core.recorded import KIND, results_dir
from helpers.throughput import RESULTS_NAME

NAME = RESULTS_NAME


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def hardware(device) -> dict:
    import torch

    info = {"cpu_cores": _cores(), "machine": platform.machine()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    gpu_count=torch.cuda.device_count())
        ok, detail = helpers.core.nvml.nvml_status()
        if ok:
            info["driver"] = detail.removeprefix("driver ")
    return info


def versions() -> dict:
    import numpy
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "numpy": numpy.__version__, "helpers": helpers.__version__}


def ladders(device, quick: bool = False) -> dict:
    """Measure every rung; returns {"rungs": [...], "gpu_util": {...}, "settings": {...}}."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    helpers.setup(seed=0, deterministic=False)  # time the kernels a real run uses
    cores = _cores()
    torch.set_num_threads(max(1, cores // 2))
    workers = min(4, cores)
    epochs, rounds = (1, 1) if quick else (3, 2)
    dataset = helpers.SlowDataset(n_samples=128 if quick else 512, n_features=256,
                                  n_classes=10, latency_s=5e-4)
    torch.manual_seed(0)
    model = helpers.MLP(in_features=256, hidden=128, depth=3, n_classes=10).to(device)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    log = io.StringIO()
    # bf16 only where the GPU computes it natively (is_bf16_supported() alone also counts
    # emulated bf16 on a V100 or T4); fp16 with a GradScaler there
    amp = helpers.amp_settings(device)
    scaler = amp.grad_scaler()

    def train_step(net, xb, yb, mixed=False):
        xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        with amp.autocast(enabled=mixed):
            loss = loss_fn(net(xb), yb)
        optimizer.zero_grad(set_to_none=True)
        if mixed:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        return loss.detach()

    def train(batches, n_epochs, *, net=None, log_every_step=True, mixed=False):
        seen = 0
        for epoch in range(n_epochs):
            for xb, yb in batches:
                loss = train_step(model if net is None else net, xb, yb, mixed=mixed)
                if log_every_step:
                    print(f"epoch {epoch} loss {loss.item():.4f}", file=log)
                seen += len(xb)
        return seen

    def loader(batch_size=64, **options):
        generator = torch.Generator().manual_seed(0)
        return DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=generator,
                          **options)

    def timed(loader_options):
        timer = helpers.StepTimer(sync=device, show=False)
        data = loader(**loader_options)
        for _ in range(epochs):
            for xb, yb in timer.wrap(data):
                train_step(model, xb, yb)
                timer.step(samples=len(xb))
        del data
        return timer.summary()

    train(loader(), 1)  # warm-up: CUDA context, kernels, allocator
    starved = timed({})
    # as in the lesson: plain workers start anew every epoch; kept-alive loaders are
    # started once before timing (a long run pays that start-up once)
    keep = {"num_workers": workers, "persistent_workers": True, "prefetch_factor": 4}
    warm = {"+ persistent workers, prefetch 4": loader(**keep)}
    skipped = {}
    if device.type == "cuda":
        warm["+ pin_memory, non_blocking"] = loader(**keep, pin_memory=True)
    else:
        skipped["+ pin_memory, non_blocking"] = "needs a CUDA GPU"
    for data in warm.values():
        train(data, 1)
    input_runs = {
        "0 workers (baseline)": lambda: train(loader(), epochs),
        f"{workers} workers, new each epoch": lambda: train(loader(num_workers=workers),
                                                            epochs),
    }
    input_runs.update({name: partial(train, data, epochs) for name, data in warm.items()})
    input_ladder = helpers.compare(input_runs, rounds=rounds, skipped=skipped, sync=device)
    del warm, input_runs, data  # shut the kept-alive workers down
    fed = timed(dict(keep, pin_memory=device.type == "cuda"))

    x_all = torch.stack([torch.from_numpy(dataset.decode(i)[0])
                         for i in range(len(dataset))]).to(device)
    y_all = torch.as_tensor(dataset.labels).to(device)

    def memory_batches(batch_size):
        order = torch.randperm(len(y_all), generator=torch.Generator().manual_seed(0))
        return [(x_all[i], y_all[i]) for i in order.to(device).split(batch_size)]

    n = 4 * epochs
    step_runs = {
        "batch 64, .item() every step": lambda: train(memory_batches(64), n),
        "no per-step sync": lambda: train(memory_batches(64), n, log_every_step=False),
        "+ batch 256": lambda: train(memory_batches(256), n, log_every_step=False),
    }
    amp_rung = f"+ {amp.name} autocast" + (", GradScaler" if amp.use_scaler else "")
    step_runs[amp_rung] = lambda: train(memory_batches(256), n, log_every_step=False,
                                        mixed=True)
    skipped = {}
    gpu_rungs = {"+ torch.compile": "default", "+ CUDA graphs (reduce-overhead)":
                 "reduce-overhead"}
    if device.type == "cuda":
        for name, mode in gpu_rungs.items():
            compiled = torch.compile(model, mode=mode)
            for _ in range(3):  # compile, then let CUDA graphs record
                train(memory_batches(256), 1, net=compiled, log_every_step=False, mixed=True)
            step_runs[name] = partial(train, memory_batches(256), n, net=compiled,
                                      log_every_step=False, mixed=True)
    else:  # torch.compile runs on a CPU too (lesson 09 measures it there); this script
        # records GPU results, so it compiles on a CUDA GPU only
        skipped.update({"+ torch.compile": "compiled on a CUDA GPU only in this script",
                        "+ CUDA graphs (reduce-overhead)": "needs a CUDA GPU"})
    step_ladder = helpers.compare(step_runs, rounds=1 if quick else 3, skipped=skipped,
                                  sync=device)

    rungs = []
    for part, ladder in [("PyTorch input", input_ladder), ("training step", step_ladder)]:
        for row in ladder.rows:
            if row.ran:
                rungs.append({"part": part, "name": row.name,
                              "samples_per_second": round(row.samples_per_second, 1),
                              "speedup": round(ladder.speedup(row.name), 3)})
    return {
        "settings": {"workers": workers, "compute_threads": torch.get_num_threads(),
                     "latency_ms_per_sample": dataset.latency_s * 1e3,
                     "samples_per_epoch": len(dataset), "epochs": epochs, "rounds": rounds,
                     "model": "helpers.MLP(256, 128, depth 3, 10 classes)",
                     "timing": ("each clock read after torch.cuda.synchronize"
                                if device.type == "cuda" else "cpu: nothing to synchronise"),
                     "deterministic": False},
        "rungs": rungs,
        "step_timer": {
            "starved": {"wait_share": round(starved.wait_share, 3),
                        "gpu_util_pct": starved.gpu_util_pct},
            "fed": {"wait_share": round(fed.wait_share, 3), "gpu_util_pct": fed.gpu_util_pct},
        },
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help=f"JSON file (default: the kit's "
                        f"tests/gpu/results/{NAME}.json)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cpu: test this script (needs --out; never the kit's record)")
    parser.add_argument("--quick", action="store_true", help="fewer epochs and rounds")
    args = parser.parse_args(argv)
    if args.device == "cpu" and args.out is None:
        parser.error("--device cpu needs --out: a CPU run is never recorded as GPU results")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        ok, why = helpers.core.nvml.nvml_status()
        print(f"No CUDA GPU here (torch {torch.__version__}, CUDA build: "
              f"{torch.version.cuda is not None}; NVML: {why}). Nothing recorded.")
        return 0
    device = torch.device(args.device)
    result = {"kind": KIND, "script": "tests/gpu/throughput_gpu.py", "lesson": NAME,
              "date": datetime.date.today().isoformat(),
              "hardware": hardware(device), "versions": versions(),
              "notes": "measured by tests/gpu/throughput_gpu.py" + (" --quick" if args.quick
                                                                    else "")}
    result.update(ladders(device, quick=args.quick))
    out = args.out or results_dir() / f"{NAME}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for rung in result["rungs"]:
        print(f"{rung['part']:14s} {rung['name']:34s} {rung['samples_per_second']:12,.0f} "
              f"samples/s  {rung['speedup']:.2f}x")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
