"""How long a learner waits for lesson 08's checks (issue 17): ``helpers.check_training`` and
the lesson top to bottom, against the figures recorded before the speed-up.

Measured, each in a fresh process (so nothing is cached from an earlier measurement):

1. ``check_training(original_step, batch_size=256)``: the lesson's original step, which does
   not fit the L40S;
2. ``check_training(original_step, batch_size=32)``: a fix that fits;
3. the fixes table: the lesson's four fixes (batch 32, autocast, checkpointing, all three),
   after the original's check, as lesson 08 runs them;
4. with ``--notebook``: ``solutions/08_oom_challenge.ipynb`` top to bottom with nbclient, as
   ``make outputs`` runs it (one thread per kernel), and its slowest cells.

The first run writes ``benchmarks/results/check_times_before.json`` (committed: the figures of
the code before the speed-up); later runs print their times beside those and the ratio
now / before. ``--code DIR`` measures another checkout of the kit (for example the old code,
``git archive <commit> | tar -x -C DIR``); ``--record`` rewrites the JSON file.
``--against DIR`` also measures the checkout in DIR (the old code) in the same run, each
measurement right before this checkout's, and prints that ratio too: on a shared machine
whose load changes, the ratio side by side is the one to trust.

No thresholds are asserted: the numbers are printed for people to read.

    .venv/bin/python benchmarks/check_times.py [--notebook] [--code DIR] [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEFORE = ROOT / "benchmarks" / "results" / "check_times_before.json"
NOTEBOOK = Path("solutions") / "08_oom_challenge.ipynb"

CHECKS = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential
import helpers
from helpers.oom import original_step

torch.set_num_threads(int(sys.argv[2]))
device = torch.device("cpu")
amp = helpers.amp_settings(device)


def training_step(autocast=False):  # lesson 08's make_step, one micro-batch
    def make_step(model, optimizer):
        criterion = nn.CrossEntropyLoss()
        scaler = torch.GradScaler(device.type, enabled=autocast and amp.use_scaler)

        def step(data, labels):
            optimizer.zero_grad()
            with torch.autocast(device.type, dtype=amp.dtype, enabled=autocast):
                logits = model(data)
                loss = criterion(logits, labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            return loss.detach()
        return step
    return make_step


class Checkpointed(helpers.LargeResNet):
    def forward(self, x):
        h = checkpoint_sequential(self.layers, 4, self.stem(x), use_reentrant=False)
        return self.head(h)


def timed(what):
    start = time.perf_counter()
    result = what()
    return time.perf_counter() - start, result


times, verdicts = {}, {}
which = sys.argv[3]
if which == "original":
    times[which], r = timed(lambda: helpers.check_training(original_step, batch_size=256))
    verdicts[which] = r.text()
elif which == "fits":
    times[which], r = timed(lambda: helpers.check_training(original_step, batch_size=32))
    verdicts[which] = r.text()
else:
    fixes = {"batch 32": dict(make_step=training_step(), batch_size=32),
             "autocast": dict(make_step=training_step(autocast=True)),
             "checkpoint": dict(make_step=training_step(), model=Checkpointed),
             "all three": dict(make_step=training_step(autocast=True), batch_size=32,
                               model=Checkpointed)}

    def table():
        checks = {"original": helpers.check_training(original_step, name="original")}
        start = time.perf_counter()
        for name, fix in fixes.items():
            checks[name] = helpers.check_training(**fix, name=name)
        return time.perf_counter() - start, helpers.fix_table(checks)

    times["original, then"], (times["fix table"], t) = timed(table)
    times["original, then"] -= times["fix table"]
    verdicts["fix table"] = str(t)
print(json.dumps({"times": times, "verdicts": verdicts}))
"""

NOTEBOOK_RUN = r"""
import json, os, sys, time
from nbclient import NotebookClient
import nbformat

code, path = sys.argv[1], sys.argv[2]
nb = nbformat.read(os.path.join(code, path), as_version=4)
os.environ.update({"GPU_LESSONS_HEADLESS": "1", "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": code + os.pathsep + os.environ.get("PYTHONPATH", "")})
client = NotebookClient(nb, timeout=900, kernel_name="python3", record_timing=True,
                        resources={"metadata": {"path": os.path.dirname(os.path.join(code,
                                                                                    path))}})
start = time.perf_counter()
client.execute()
total = time.perf_counter() - start
from datetime import datetime
cells = []
for cell in nb.cells:
    timing = cell.metadata.get("execution", {})
    if cell.cell_type == "code" and "iopub.execute_input" in timing:
        seconds = (datetime.fromisoformat(timing["shell.execute_reply"].rstrip("Z"))
                   - datetime.fromisoformat(timing["iopub.execute_input"].rstrip("Z")))
        cells.append([seconds.total_seconds(), cell.source.splitlines()[0][:60]])
cells.sort(reverse=True)
print(json.dumps({"times": {"lesson 08 top to bottom": total},
                  "cells": cells[:6]}))
"""


def measure(code: Path, which: str, threads: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHECKS, str(code), str(threads), which],
                         capture_output=True, text=True, check=False,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if out.returncode:
        raise SystemExit(f"{which} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_notebook(code: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", NOTEBOOK_RUN, str(code), str(NOTEBOOK)],
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"the notebook failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout to measure")
    parser.add_argument("--notebook", action="store_true", help="also run lesson 08")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--against", type=Path, default=None,
                        help="also measure this checkout (the old code), side by side")
    parser.add_argument("--record", action="store_true",
                        help=f"write the figures to {BEFORE.relative_to(ROOT)}")
    args = parser.parse_args(argv)

    times, notes, side = {}, [], {}
    for which in ("original", "fits", "table"):
        if args.against:
            side.update(measure(args.against.resolve(), which, args.threads)["times"])
        result = measure(args.code.resolve(), which, args.threads)
        times.update(result["times"])
        for name, verdict in result["verdicts"].items():
            notes.append(f"{name}: {verdict}")
    if args.notebook:
        if args.against:
            side.update(measure_notebook(args.against.resolve())["times"])
        result = measure_notebook(args.code.resolve())
        times.update(result["times"])
        notes += [f"lesson 08 cell ~{s:.1f} s: {line}" for s, line in result["cells"]]

    record = {"times_s": {k: round(v, 1) for k, v in times.items()}, "threads": args.threads,
              "cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
              "python": platform.python_version(), "measured": time.strftime("%Y-%m-%d %H:%M"),
              "code": "" if args.code.resolve() == ROOT else str(args.code)}
    before = json.loads(BEFORE.read_text()) if BEFORE.exists() else None
    if args.record or (before is None and args.against is None):
        BEFORE.parent.mkdir(parents=True, exist_ok=True)
        BEFORE.write_text(json.dumps(record, indent=1) + "\n")
        print(f"recorded in {BEFORE.relative_to(ROOT)}")
    print("\n".join(notes))
    print(f"\n{'measurement':32} {'before':>9} {'now':>9} {'now / before':>13}")
    old = (before or record)["times_s"]
    for name, seconds in times.items():
        was = old.get(name)
        ratio = f"~{seconds / was:.2f}" if was else "-"
        shown = f"~{was:.1f} s" if was else "-"
        print(f"{name:32} {shown:>9} {f'~{seconds:.1f} s':>9} {ratio:>13}")
    if side:
        print(f"\nside by side, {args.against} first:")
        print(f"{'measurement':32} {'old':>9} {'now':>9} {'now / old':>13}")
        for name, seconds in times.items():
            was = side.get(name)
            print(f"{name:32} {f'~{was:.1f} s' if was else '-':>9} {f'~{seconds:.1f} s':>9} "
                  f"{f'~{seconds / was:.2f}' if was else '-':>13}")
    print(f"(torch threads {args.threads}; load average now "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; before: "
          f"{(before or record)['load_average']})")


if __name__ == "__main__":
    main()
