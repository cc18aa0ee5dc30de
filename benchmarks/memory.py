"""Benchmarks of the memory engine (``make bench``): ratios measured side by side in one run.

1. Overhead: a training step run plainly and inside ``measure_step``, alternated, best of N;
   printed as the ratio measured / plain for a small, a medium and a convolutional model.
2. Full scale: a ResNet-152-sized network at batch 256 on 224x224 images, measured on fake
   tensors in a fresh process: wall time and the process's peak RSS (targets: under 15 s,
   under 2 GB).

No thresholds are asserted: the numbers are printed for people to read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FULL_SCALE = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import torch
from torch import nn
import helpers
t_import = time.perf_counter() - t0
with helpers.full_scale(device="cpu"):
    model = helpers.ResNet(152)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(256, 3, 224, 224)
    y = torch.randint(0, 1000, (256,))

    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    report = helpers.measure_step(step, model=model, optimizer=opt, inputs=(x, y), steps=2)
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "import_s": t_import, "peak_bytes": report.peak_bytes,
                  "where": report.where(), "params": helpers.count_parameters(model),
                  "first_peak": report.first_step.peak_bytes,
                  "steady_peak": report.steady_state.peak_bytes,
                  "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def overhead(rounds: int = 15) -> list[list[str]]:
    import torch
    from torch import nn

    import helpers

    torch.set_num_threads(1)
    cases = {
        "MLP 32-128x3, batch 64": (lambda: helpers.MLP(32, 128, 3, 4),
                                   lambda: (torch.randn(64, 32), torch.randint(0, 4, (64,)))),
        "MLP 512-1024x4, batch 512": (lambda: helpers.MLP(512, 1024, 4, 10),
                                      lambda: (torch.randn(512, 512),
                                               torch.randint(0, 10, (512,)))),
        "SmallCNN, batch 64": (lambda: helpers.SmallCNN(3, 10, 16),
                               lambda: (torch.randn(64, 3, 32, 32),
                                        torch.randint(0, 10, (64,)))),
    }
    rows = []
    for name, (make_model, make_batch) in cases.items():
        torch.manual_seed(0)
        model = make_model()
        opt = torch.optim.Adam(model.parameters())
        x, y = make_batch()

        def step(model=model, opt=opt, x=x, y=y):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        def measured(step=step, model=model, opt=opt, x=x, y=y):
            helpers.measure_step(step, model=model, optimizer=opt, inputs=(x, y))

        step()  # warm up (Adam state exists in both)
        best = {"plain": float("inf"), "measured": float("inf")}
        for _ in range(rounds):
            for key, fn in (("plain", step), ("measured", measured)):
                t = time.perf_counter()
                fn()
                best[key] = min(best[key], time.perf_counter() - t)
        rows.append([name, helpers.fmt_seconds(best["plain"]),
                     helpers.fmt_seconds(best["measured"]),
                     helpers.fmt_ratio(best["measured"] / best["plain"])])
    return rows


def full_scale() -> dict:
    done = subprocess.run([sys.executable, "-c", FULL_SCALE], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    import helpers

    print("measurement overhead (best of 15, alternated; one thread)")
    print(helpers.Table(["model", "plain step", "measure_step", "ratio"], overhead()).text())
    r = full_scale()
    print()
    print(f"full scale: ResNet-152 ({r['params']:,} parameters), batch 256, 224x224, Adam, "
          "2 steps on fake tensors")
    print(f"  peak {helpers.fmt_bytes(r['peak_bytes'])} ({r['where']}); first step "
          f"{helpers.fmt_bytes(r['first_peak'])}, steady state "
          f"{helpers.fmt_bytes(r['steady_peak'])}")
    print(f"  wall time {helpers.fmt_seconds(r['wall_s'])} (of which importing torch "
          f"{helpers.fmt_seconds(r['import_s'])}), target under 15 s")
    print(f"  peak RSS ~{r['rss_bytes'] / 2**20:,.0f} MiB, target under 2 GB")


if __name__ == "__main__":
    main()
