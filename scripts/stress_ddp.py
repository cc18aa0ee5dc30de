"""Launch a DDP training script with torchrun many times in a row and count failures.

`make stress` runs scripts/ddp_train.py 30 times. A run fails if torchrun exits non-zero, if
a process aborted at exit ("terminate called ..."), or if training did not finish. Before the
training script shut down with barrier + destroy_process_group + os._exit, about 9% of
gloo runs aborted at exit; this is the check that it stays at 0.

`--script exercise` launches the solved script of lesson 03's challenge `03-ddp-script`
instead (it ends with destroy_process_group, without the os._exit workaround, so aborts at
exit are expected over gloo: this counts them). Its text is read from the exercise's
`%%writefile` solution cell in solutions/03_multi_gpu.ipynb (not in the learner bundle,
which holds only the stub); a run fails unless rank 0's checkpoint says epoch 1 is done.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import tempfile
from pathlib import Path

import torch

from helpers.core.fmt import fmt_seconds
from helpers.launch import SCRIPTS, ddp_plan, run_captured, torchrun_command

EXERCISE_ID = "03-ddp-script"
EXERCISE_NOTEBOOK = SCRIPTS.parent / "solutions" / "03_multi_gpu.ipynb"


def exercise_script(version: str = "solution", notebook: Path = EXERCISE_NOTEBOOK) -> str:
    """The training script of challenge 03-ddp-script: ``"solution"`` or ``"stub"``.

    The exercise cell is ``%%writefile _runs/ddp_train.py``, its task and the script.
    """
    if version not in ("solution", "stub"):
        raise ValueError(f"version must be 'solution' or 'stub', got {version!r}")
    if not notebook.is_file():
        raise FileNotFoundError(f"{notebook.name} is not here: --script exercise needs "
                                "solutions/ (the solutions bundle or the repository)")
    from helpers.authoring.build import exercises_in

    (ex,) = [e for e in exercises_in(notebook) if e.id == EXERCISE_ID]
    code = ex.solution if version == "solution" else ex.stub
    ast.parse(code)  # a SyntaxError here, not in every launched process
    return code


def one_run(nproc: int, timeout: float, script: str = "train",
            exercise_text: str | None = None) -> tuple[bool, str, float]:
    with tempfile.TemporaryDirectory(prefix="stress-ddp-") as tmp:
        summary = Path(tmp) / "summary.json"
        if script == "train":
            cmd = torchrun_command(
                SCRIPTS / "ddp_train.py",
                ["--epochs", "1", "--checkpoint", str(Path(tmp) / "ddp.pt"),
                 "--summary", str(summary)],
                nproc_per_node=nproc,
            )
        else:
            path = Path(tmp) / "ddp_exercise.py"
            path.write_text(exercise_text if exercise_text is not None else exercise_script())
            cmd = torchrun_command(path, [str(Path(tmp) / "ckpt.pt"), "1"],
                                   nproc_per_node=nproc)
        try:
            result = run_captured(cmd, env={"OMP_NUM_THREADS": "1"}, timeout=timeout)
        except TimeoutError as exc:
            return False, str(exc), timeout
        problems = []
        if result.returncode != 0:
            problems.append(f"exit code {result.returncode}")
        if "terminate called" in result.output:
            problems.append("a process aborted at exit")
        if script == "train":
            if not summary.is_file() or not json.loads(summary.read_text())["finished"]:
                problems.append("training did not finish")
        else:
            ckpt = Path(tmp) / "ckpt.pt"
            if not ckpt.is_file() or torch.load(ckpt, weights_only=True)["epoch"] != 1:
                problems.append("rank 0 saved no checkpoint of epoch 1")
        detail = "; ".join(problems) + "\n" + result.output[-2000:] if problems else ""
        return not problems, detail, result.seconds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=30, help="launches in a row")
    p.add_argument("--nproc", type=int, default=None,
                   help="processes per launch (default: one per GPU, else 2 on the CPU)")
    p.add_argument("--timeout", type=float, default=180, help="seconds allowed per launch")
    p.add_argument("--script", choices=["train", "exercise"], default="train",
                   help="train: scripts/ddp_train.py; exercise: the solved script of lesson "
                        "03's challenge 03-ddp-script (read from solutions/)")
    args = p.parse_args(argv)
    if args.runs <= 0 or (args.nproc is not None and args.nproc <= 0):
        p.error("--runs and --nproc must be positive")
    text = None
    if args.script == "exercise":
        try:
            text = exercise_script()
        except (FileNotFoundError, ValueError) as exc:
            p.error(str(exc))
    plan = ddp_plan()
    nproc = args.nproc or plan.nproc_per_node
    name = "ddp_train.py" if args.script == "train" else f"the solved {EXERCISE_ID} script"
    print(f"stress: {args.runs} launches of {name}, {nproc} processes each on "
          f"{plan.device} over {plan.backend}", flush=True)
    failures = 0
    for i in range(1, args.runs + 1):
        ok, detail, seconds = one_run(nproc, args.timeout, args.script, text)
        failures += not ok
        print(f"run {i:2d}/{args.runs}: {'ok' if ok else 'FAILED'} ({fmt_seconds(seconds)})",
              flush=True)
        if not ok:
            print(detail, flush=True)
    print(f"failures: {failures} of {args.runs}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
