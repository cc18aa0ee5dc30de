"""Launch scripts/ddp_train.py with torchrun many times in a row and count failures.

`make stress` runs it 30 times. A run fails if torchrun exits non-zero, if a process
aborted at exit ("terminate called ..."), or if training did not finish. Before the
training script shut down with barrier + destroy_process_group + os._exit, about 9% of
gloo runs aborted at exit; this is the check that it stays at 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from helpers.core.fmt import fmt_seconds
from helpers.launch import SCRIPTS, ddp_plan, run_captured, torchrun_command


def one_run(nproc: int, timeout: float) -> tuple[bool, str, float]:
    with tempfile.TemporaryDirectory(prefix="stress-ddp-") as tmp:
        summary = Path(tmp) / "summary.json"
        cmd = torchrun_command(
            SCRIPTS / "ddp_train.py",
            ["--epochs", "1", "--checkpoint", str(Path(tmp) / "ddp.pt"),
             "--summary", str(summary)],
            nproc_per_node=nproc,
        )
        try:
            result = run_captured(cmd, env={"OMP_NUM_THREADS": "1"}, timeout=timeout)
        except TimeoutError as exc:
            return False, str(exc), timeout
        problems = []
        if result.returncode != 0:
            problems.append(f"exit code {result.returncode}")
        if "terminate called" in result.output:
            problems.append("a process aborted at exit")
        if not summary.is_file() or not json.loads(summary.read_text())["finished"]:
            problems.append("training did not finish")
        detail = "; ".join(problems) + "\n" + result.output[-2000:] if problems else ""
        return not problems, detail, result.seconds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=30, help="launches in a row")
    p.add_argument("--nproc", type=int, default=None,
                   help="processes per launch (default: one per GPU, else 2 on the CPU)")
    p.add_argument("--timeout", type=float, default=180, help="seconds allowed per launch")
    args = p.parse_args(argv)
    if args.runs <= 0 or (args.nproc is not None and args.nproc <= 0):
        p.error("--runs and --nproc must be positive")
    plan = ddp_plan()
    nproc = args.nproc or plan.nproc_per_node
    print(f"stress: {args.runs} launches of ddp_train.py, {nproc} processes each on "
          f"{plan.device} over {plan.backend}", flush=True)
    failures = 0
    for i in range(1, args.runs + 1):
        ok, detail, seconds = one_run(nproc, args.timeout)
        failures += not ok
        print(f"run {i:2d}/{args.runs}: {'ok' if ok else 'FAILED'} ({fmt_seconds(seconds)})",
              flush=True)
        if not ok:
            print(detail, flush=True)
    print(f"failures: {failures} of {args.runs}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
