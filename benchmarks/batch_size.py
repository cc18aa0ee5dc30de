"""Batch-size finders side by side: trials taken and size found, on the same virtual GPU.

Run with ``make bench`` (or ``.venv/bin/python benchmarks/batch_size.py``). For each workload
(the same model, the same ``helpers.VirtualGPU``, the same start size and steps per trial) it
runs

* ``helpers.find_batch_size`` (this kit; margin 0, so it searches for the limit itself),
* PyTorch Lightning's ``Tuner.scale_batch_size`` in ``binsearch`` and ``power`` modes
  (margin 0, ``max_val`` raised to 65536: at its default, 8192, binsearch returns 8192 untried
  once doubling reaches it; that row is shown too where it matters),
* Hugging Face Accelerate's ``find_executable_batch_size`` (it only goes down, by 10 % per
  out-of-memory error: from its default start of 128, and from the workload's maximum),

and compares each answer with the true maximum, which the memory engine knows exactly: the
largest batch size whose two training steps peak at or below the capacity, found by bisection
on the engine's exact peak (caching-allocator workloads: on out-of-memory or not).

Both peers empty CUDA's cache between trials on a GPU; here those calls are routed to the
virtual GPU's cache (``cuda_calls_reach``), so they see the allocator a GPU would show them.

Lightning and Accelerate are not part of the kit. The first run installs pinned versions with
``pip install --no-deps --target build/bench-packages`` (pure-Python packages; the kit's torch
is never replaced: the folder is appended to ``sys.path`` after the kit's packages, and the
script checks that torch still comes from the kit's environment).

Targets (checked at the end; the exit status is 1 if one is missed): fewer trials than
Lightning's binsearch, and an answer within 3 % of the true maximum, on every workload.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import io
import logging
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PEERS_DIR = ROOT / "build" / "bench-packages"
# lightning, accelerate and the dependencies the kit lacks (pure Python, or wheels that need
# nothing but the C library); none of them is torch
PEER_PINS = [
    "lightning==2.6.6", "lightning-utilities==0.15.3", "torchmetrics==1.9.0",
    "accelerate==1.16.0", "huggingface_hub==2.4.0", "safetensors==0.8.0", "hf-xet==1.8.0",
    "httpx2==2.16.2", "httpcore2==2.16.2", "click==8.5.1", "truststore==0.10.5",
]

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import helpers  # noqa: E402
from helpers.core.fmt import fmt_seconds  # noqa: E402
from helpers.memory.state import current_virtual_gpu  # noqa: E402

MiB = 2**20
STEPS = 2  # steps per trial, for every method
START = 32  # first batch size, for every method that takes one (the original lesson's)


# ---------------------------------------------------------------------------- the peers
def install_peers() -> None:
    """Install Lightning and Accelerate into build/bench-packages (once), then import them."""
    wanted = {p.split("==")[0].lower().replace("_", "-"): p.split("==")[1] for p in PEER_PINS}
    have = {}
    if PEERS_DIR.exists():
        for dist in importlib.metadata.distributions(path=[str(PEERS_DIR)]):
            have[dist.metadata["Name"].lower().replace("_", "-")] = dist.version
    if have != wanted:
        print(f"installing {', '.join(PEER_PINS[:1] + PEER_PINS[3:4])} and their "
              f"dependencies into {PEERS_DIR.relative_to(ROOT)} (once) ...", flush=True)
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
               "--disable-pip-version-check", "--upgrade", "--target", str(PEERS_DIR),
               *PEER_PINS]
        subprocess.run(cmd, check=True)
    sys.path.append(str(PEERS_DIR))  # after the kit's packages: the kit's torch wins
    torch_file = Path(torch.__file__).resolve()
    assert PEERS_DIR not in torch_file.parents, "torch must come from the kit's environment"


def quiet_peers() -> None:
    import lightning.pytorch  # noqa: F401 - it sets its loggers' levels when imported

    warnings.filterwarnings("ignore", module="lightning")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)


@contextlib.contextmanager
def cuda_calls_reach(gpu):
    """Route the peers' CUDA cache clearing to the virtual GPU, as it would reach a real one.

    On a CUDA machine Lightning calls ``torch.cuda.empty_cache()`` before every trial and
    Accelerate after every out-of-memory error; on this CPU build those calls do nothing, so
    the virtual GPU's (simulated) cache would stay full between their trials.
    """
    import accelerate.utils.memory as acc_memory

    shim = type("VirtualCuda", (), {"empty_cache": staticmethod(gpu.empty_cache)})
    saved = torch.cuda.empty_cache, acc_memory.get_torch_accelerator_backend
    torch.cuda.empty_cache = gpu.empty_cache
    acc_memory.get_torch_accelerator_backend = lambda: ("cuda", shim)
    try:
        yield
    finally:
        torch.cuda.empty_cache, acc_memory.get_torch_accelerator_backend = saved


# ---------------------------------------------------------------------------- workloads
class Workload:
    """A model, its data and a virtual GPU; ``fresh()`` makes them anew (same seed)."""

    def __init__(self, name, make_model, sample_shape, n_classes, capacity, *, rounding=False,
                 context=0, fake=False, maximum=8192):
        self.name = name
        self.make_model = make_model
        self.sample_shape = sample_shape
        self.n_classes = n_classes
        self.capacity = capacity
        self.rounding = rounding
        self.context = context
        self.fake = fake
        self.maximum = maximum

    def gpu(self):
        return helpers.VirtualGPU(self.capacity, rounding=self.rounding,
                                  context_bytes=self.context, fake=self.fake, device="cpu")

    def fresh(self):
        """A new model and optimizer (inside the virtual GPU's block: fake ones there)."""
        torch.manual_seed(0)
        self.rng = np.random.default_rng(0)
        model = self.make_model()
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)

    def batch(self, b):
        """A batch in host memory, as a data loader makes it: made with the virtual GPU's
        counting paused, it counts from its first use in the step, as a batch moved to a
        real GPU with ``.to(device)`` would. Full scale: fake tensors, made on the GPU."""
        if self.fake:
            return (torch.randn(b, *self.sample_shape),
                    torch.randint(0, self.n_classes, (b,)))
        gpu = current_virtual_gpu()
        with gpu.paused() if gpu is not None else contextlib.nullcontext():
            x = torch.from_numpy(self.rng.standard_normal((b, *self.sample_shape),
                                                          dtype=np.float32))
            return x, torch.from_numpy(self.rng.integers(0, self.n_classes, b))

    def step_fn(self, model, optimizer):
        def step(b):
            x, y = self.batch(b)
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        return step

    def describe(self) -> str:
        with self.gpu() as gpu:
            n = helpers.count_parameters(self.fresh()[0])
        alloc = "CUDA-like caching allocator" if self.rounding else "exact allocator"
        if self.context:
            alloc += f", {self.context} CUDA context"
        return (f"{self.name}: {n:,} parameters, Adam, VirtualGPU {gpu.name} ({alloc}), "
                f"{STEPS} steps per trial, start {START}, maximum {self.maximum}")


def fits_fresh(w: Workload, b: int) -> bool:
    """Do STEPS training steps at batch size ``b`` fit, from a fresh start?"""
    if not w.rounding:  # the engine's exact peak against the capacity
        with helpers.VirtualGPU("1 TiB", fake=w.fake, device="cpu") as big:
            model, opt = w.fresh()
            step = w.step_fn(model, opt)
            for _ in range(STEPS):
                step(b)
            return big.peak_allocated_bytes + w.context <= w.gpu().capacity_bytes
    with w.gpu():  # caching allocator: does it run out of memory?
        model, opt = w.fresh()
        step = w.step_fn(model, opt)
        try:
            for _ in range(STEPS):
                step(b)
            return True
        except torch.OutOfMemoryError:
            return False


def true_maximum(w: Workload) -> int:
    """The largest batch size whose training steps fit, by bisection."""
    def fits(b):
        return fits_fresh(w, b)

    lo, hi = 1, 2
    while fits(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def run_ours(w: Workload) -> dict:
    with w.gpu():
        model, opt = w.fresh()
        r = helpers.find_batch_size(w.step_fn(model, opt), model=model, optimizer=opt,
                                    start=START, maximum=w.maximum, margin=0,
                                    steps_per_trial=STEPS)
    return {"trials": r.n_trials, "steps": r.n_steps, "found": r.batch_size,
            "ooms": sum(t.oom for t in r.trials), "sizes": [t.batch_size for t in r.trials]}


def run_lightning(w: Workload, mode: str, max_val: int = 1 << 16) -> dict:
    import lightning.pytorch as pl
    from lightning.pytorch.tuner import Tuner

    log = {"sizes": [], "done": [], "steps": 0}

    class Batches(torch.utils.data.IterableDataset):
        def __init__(self, size):
            self.size = size

        def __iter__(self):
            while True:
                yield w.batch(self.size)

    class Module(pl.LightningModule):
        def __init__(self, model, opt):
            super().__init__()
            self.net = model
            self.opt = opt
            self.batch_size = START

        def train_dataloader(self):
            return torch.utils.data.DataLoader(Batches(self.batch_size), batch_size=None)

        def on_train_start(self):
            log["sizes"].append(self.batch_size)
            log["done"].append(0)

        def training_step(self, batch, batch_idx):
            log["steps"] += 1
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            log["done"][-1] += 1

        def configure_optimizers(self):
            return self.opt

    with tempfile.TemporaryDirectory() as tmp, w.gpu() as gpu, cuda_calls_reach(gpu):
        module = Module(*w.fresh())
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=tmp,
                             limit_val_batches=0, num_sanity_val_steps=0)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            found = Tuner(trainer).scale_batch_size(
                module, mode=mode, steps_per_trial=STEPS, init_val=START, max_trials=25,
                margin=0.0, max_val=max_val)
        del trainer
    ooms = sum(d < STEPS for d in log["done"])
    return {"trials": len(log["sizes"]), "steps": log["steps"], "found": found,
            "ooms": ooms, "sizes": log["sizes"]}


def run_accelerate(w: Workload, start: int) -> dict:
    from accelerate.utils import find_executable_batch_size

    log = {"sizes": [], "steps": 0}

    @find_executable_batch_size(starting_batch_size=start)
    def train(batch_size, step):
        log["sizes"].append(batch_size)
        for _ in range(STEPS):
            log["steps"] += 1
            step(batch_size)
        return batch_size

    with w.gpu() as gpu, cuda_calls_reach(gpu):
        found = train(w.step_fn(*w.fresh()))
    return {"trials": len(log["sizes"]), "steps": log["steps"], "found": found,
            "ooms": len(log["sizes"]) - 1, "sizes": log["sizes"]}


# ---------------------------------------------------------------------------- report
def timed(fn, *args):
    gc.collect()
    t0 = time.perf_counter()
    try:
        out = fn(*args)
    except Exception as exc:  # noqa: BLE001 - a peer that cannot run this workload
        return {"failed": f"{type(exc).__name__}: {str(exc).splitlines()[0][:70]}"}
    out["seconds"] = time.perf_counter() - t0
    return out


def table(rows, truth) -> str:
    head = ["method", "trials", "out of memory", "steps", "found", "of true max",
            "fits from a fresh start", "time"]
    lines = []
    for name, r in rows:
        if "failed" in r:
            lines.append([name, "-", "-", "-", "-", "-", "-", "failed"])
            continue
        lines.append([name, str(r["trials"]), str(r["ooms"]), str(r["steps"]), str(r["found"]),
                      f"{r['found'] / truth:.1%}", "yes" if r["fresh"] else "NO",
                      fmt_seconds(r["seconds"], 2)])
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(wd) if i == 0 else h.rjust(wd)
                     for i, (h, wd) in enumerate(zip(head, widths, strict=True)))]
    out.append("  ".join("-" * wd for wd in widths))
    for line in lines:
        out.append("  ".join(c.ljust(wd) if i == 0 else c.rjust(wd)
                             for i, (c, wd) in enumerate(zip(line, widths, strict=True))))
    for name, r in rows:
        if "failed" in r:
            out.append(f"{name} failed: {r['failed']}")
    return "\n".join(out)


WORKLOADS = {
    "mlp": Workload("MLP 512-256x4 (real tensors)", lambda: helpers.MLP(512, 256, 4, 10),
                    (512,), 10, "48 MiB"),
    "cnn": Workload("SmallCNN width 8, 32x32 images (real tensors)",
                    lambda: helpers.SmallCNN(3, 10, 8), (3, 32, 32), 10, "96 MiB"),
    "cnn-caching": Workload("SmallCNN width 8, 32x32 images (real tensors)",
                            lambda: helpers.SmallCNN(3, 10, 8), (3, 32, 32), 10, "96 MiB",
                            rounding=True, context="16 MiB"),
    "resnet50-l40s": Workload("ResNet-50, 224x224 images (full scale: fake tensors)",
                              lambda: helpers.ResNet(50), (3, 224, 224), 1000, "L40S",
                              rounding=True, context="500 MiB", fake=True),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workloads", nargs="*", default=list(WORKLOADS),
                        help=f"which workloads (default: all of {', '.join(WORKLOADS)})")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # small steps: one thread is fastest and steadiest
    install_peers()
    quiet_peers()
    import accelerate
    import lightning

    print(f"torch {torch.__version__} (the kit's), lightning {lightning.__version__}, "
          f"accelerate {accelerate.__version__}; times are measured on this CPU (~)\n")
    missed = []
    for key in args.workloads:
        w = WORKLOADS[key]
        print(w.describe())
        truth = true_maximum(w)
        how = ("out of memory or not, from a fresh start" if w.rounding
               else "the engine's exact peak")
        print(f"true maximum (bisection on {how}): {truth}")
        rows = [
            ("helpers.find_batch_size", timed(run_ours, w)),
            ("Lightning scale_batch_size binsearch", timed(run_lightning, w, "binsearch")),
            ("Lightning scale_batch_size power", timed(run_lightning, w, "power")),
        ]
        if 2 * truth >= 8192 and not w.fake:
            rows.append(("Lightning binsearch, default max_val=8192",
                         timed(run_lightning, w, "binsearch", 8192)))
        rows += [
            ("Accelerate find_executable_batch_size (from 128)",
             timed(run_accelerate, w, 128)),
            (f"Accelerate find_executable_batch_size (from {w.maximum})",
             timed(run_accelerate, w, w.maximum)),
        ]
        for _, r in rows:
            if "found" in r:
                r["fresh"] = fits_fresh(w, r["found"])
        print(table(rows, truth))
        ours, lb = rows[0][1], rows[1][1]
        print(f"sizes tried by helpers.find_batch_size: {ours['sizes']}")
        share = ours["found"] / truth
        if "failed" in lb:
            print(f"=> {ours['trials']} trials, {share:.1%} of the true maximum\n")
        else:
            print(f"sizes tried by Lightning binsearch:     {lb['sizes']}")
            print(f"=> {ours['trials']} trials instead of {lb['trials']} "
                  f"({lb['trials'] / ours['trials']:.1f}x fewer than Lightning's binsearch), "
                  f"{share:.1%} of the true maximum\n")
            if ours["trials"] >= lb["trials"]:
                missed.append(f"{key}: {ours['trials']} trials, Lightning {lb['trials']}")
        if not 0.97 * truth <= ours["found"] <= truth:
            missed.append(f"{key}: found {ours['found']}, true maximum {truth}")
    if missed:
        print("TARGET MISSED: " + "; ".join(missed))
        return 1
    print("targets met: fewer trials than Lightning's binsearch and within 3% of the true "
          "maximum on every workload")
    return 0


if __name__ == "__main__":
    sys.exit(main())
