"""The planner's cost (``python -m helpers.fit``, issue 20's two performance targets).

Run with ``make bench`` (or ``.venv/bin/python benchmarks/fit.py``). It prints

1. **One card, ResNet-50:** ``python -m helpers.fit`` on ``tests/planner_scripts/resnet_amp.py``
   (ResNet-50 written out, batch 256, 224 x 224 images, Adam, float32) in a fresh process:
   wall time (interpreter start and imports included), the run's own time, and the
   process's peak resident memory. Targets: at most 15 s and under 1 GB on 2 cores.
2. **Every card vs one card:** the same script at a smaller size (so the naive way runs in
   reasonable time) measured side by side in this process: one run on one card (what any
   plan needs), the planner's table across all 8 known cards (one run, then 8 comparisons),
   and the naive way, one run per card. Target: the table costs at most 1.2x one card.
   Both run in this process; "table, own process" is the same ``will_it_fit`` call as users
   make it, in a process of its own (forked from the planner's server, which is started
   before the timings; the containment's cost, no target).

3. **Before and after** (``--baseline REV``, e.g. ``--baseline HEAD~5`` or a tag): item 1
   again with the kit as it was at git revision REV (checked out into a temporary worktree,
   removed afterwards), the two run alternately in the same invocation; it prints both wall
   times and peak RSS and their ratios (after / before).

Timings are medians of ``--repeat`` runs (default 3), all in one invocation, so the ratios
compare like with like; the absolute seconds depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCRIPT = ROOT / "tests" / "planner_scripts" / "resnet_amp.py"
FULL = ["--batch-size", "256", "--image-size", "224", "--no-amp", "--samples", "512"]
SMALL = ["--batch-size", "32", "--image-size", "64", "--no-amp", "--samples", "64"]


def fresh_process(args: list[str], kit: Path = ROOT) -> tuple[float, int, str]:
    """(wall seconds, peak RSS bytes, stdout) of ``python -m helpers.fit`` in a new process,
    with the helpers package of ``kit`` (a checkout of the kit). The peak RSS is the largest
    of the process and the children it waited for (a planner that plans in a child process
    is measured whole)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "helpers.fit", str(SCRIPT), *args],
                            cwd=kit, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="2", PYTHONPATH=str(kit)))
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"helpers.fit failed ({proc.returncode}):\n{out}")
    return wall, usage.ru_maxrss * 1024, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", metavar="REV",
                        help="also measure item 1 with the kit at this git revision (before/"
                        "after, side by side)")
    opts = parser.parse_args()
    if opts.repeat < 1 or opts.repeat > 50:
        parser.error("--repeat must be between 1 and 50")
    if opts.baseline is not None and (not opts.baseline or opts.baseline.startswith("-")):
        parser.error("--baseline must be a git revision (a commit, tag or branch)")

    from helpers.memory import planner
    from helpers.memory.capacity import KNOWN_GPUS

    print("1. ResNet-50, batch 256, 224 x 224, Adam, float32: python -m helpers.fit "
          "(fresh process)")
    walls, rsss, runs = [], [], []
    for _ in range(opts.repeat):
        wall, rss, out = fresh_process(FULL)
        walls.append(wall)
        rsss.append(rss)
        line = next(x for x in out.splitlines() if x.strip().startswith("ran until"))
        runs.append(float(line.split(" in ")[1].split(" s ")[0].lstrip("~")))
        peak = next(x for x in out.splitlines() if x.strip().startswith("peak:"))
    wall, rss = statistics.median(walls), max(rsss)
    print(f"   {peak.strip()}")
    run = statistics.median(runs)
    print(f"   wall {wall:.1f} s (median of {opts.repeat}; the run itself {run:.1f} s), "
          f"peak RSS {rss / 2**30:.2f} GiB")

    print(f"2. Every card vs one card ({SCRIPT.name} {' '.join(SMALL)}), side by side:")

    def one_run(card: str) -> None:
        r = planner._Run(str(SCRIPT), SMALL, card=card, steps=2, fake=True, strict=False,
                         amp=None, checkpoint_every=None, max_forwards=50, time_limit=600,
                         context=planner.DEFAULT_CONTEXT)
        r.run()

    def table() -> None:  # in this process, as the planner's own process runs it
        from helpers.memory import sandbox

        serving, sandbox._serving = sandbox._serving, True
        try:
            plan = planner.will_it_fit(str(SCRIPT), SMALL)
        finally:
            sandbox._serving = serving
        assert len(plan.cards) == len(KNOWN_GPUS)

    def contained() -> None:  # what a user gets: the plan in a process of its own
        plan = planner.will_it_fit(str(SCRIPT), SMALL)
        assert len(plan.cards) == len(KNOWN_GPUS)

    def naive() -> None:
        for card in KNOWN_GPUS:
            one_run(card)

    import contextlib
    import io

    times = {"one card": [], "table of 8 cards": [], "table, own process": [],
             "one run per card": []}
    with contextlib.redirect_stdout(io.StringIO()):
        one_run("A100-40GB")  # warm-up: imports and first-call costs
        contained()  # ... and the planner's server, started once per process (sandbox.py)
        for _ in range(opts.repeat):
            for name, fn in (("one card", lambda: one_run("A100-40GB")),
                             ("table of 8 cards", table), ("table, own process", contained),
                             ("one run per card", naive)):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["one card"])
    for name, ts in times.items():
        median = statistics.median(ts)
        print(f"   {name:<19} {median:6.2f} s  {median / base:5.2f}x")
    ratio = statistics.median(times["table of 8 cards"]) / base

    if opts.baseline:
        compare(opts.baseline, opts.repeat)

    ok = wall <= 15 and rss < 1e9 and ratio <= 1.2
    print(f"targets: ResNet-50 plan <= 15 s: {wall:.1f} s; under 1 GB RSS: "
          f"{rss / 1e9:.2f} GB; table <= 1.2x one card: {ratio:.2f}x -> "
          f"{'met' if ok else 'MISSED'}")
    return 0 if ok else 1


def compare(rev: str, repeat: int) -> None:
    """Item 1 with the kit at ``rev`` and as it is now, alternately, in one invocation."""
    import tempfile

    print(f"3. Before ({rev}) and after (this tree): item 1 alternately, {repeat} times each")
    with tempfile.TemporaryDirectory(prefix="fit-baseline-") as tmp:
        old = Path(tmp) / "kit"
        made = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q",
                               str(old), rev], capture_output=True, text=True)
        if made.returncode != 0:
            raise SystemExit(f"--baseline {rev}: git worktree add failed: {made.stderr.strip()}")
        try:
            runs = {"before": [], "after": []}
            for _ in range(repeat):
                runs["before"].append(fresh_process(FULL, old)[:2])
                runs["after"].append(fresh_process(FULL, ROOT)[:2])
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(old)], capture_output=True)
    wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    rss = {k: max(r for _, r in v) for k, v in runs.items()}
    for k in runs:
        print(f"   {k:<7} wall {wall[k]:5.1f} s, peak RSS {rss[k] / 2**30:.2f} GiB")
    print(f"   after / before: wall {wall['after'] / wall['before']:.2f}x, "
          f"peak RSS {rss['after'] / rss['before']:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
