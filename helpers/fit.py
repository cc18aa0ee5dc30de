"""``python -m helpers.fit train.py [the script's arguments] --gpu A100-40GB``: will it fit?

Runs an unmodified PyTorch training script on a virtual card with full-scale fake tensors
until its 2nd optimizer step, and prints the peak (by category, with the script's line at
the peak), every known card with its headroom, and, on request, the largest batch per card,
the peak after planner-applied fixes, per-rank DDP memory and a SLURM request. See
:func:`helpers.will_it_fit` (the same, for notebooks) and lesson 10.

Planner options may come before or after the script's own arguments. A script argument that
has the same name as a planner option goes after ``--``:
``python -m helpers.fit train.py --gpu L40S -- --steps 100``.

Exit status: 0 when the script fits the chosen card, 1 when it does not, 2 for bad input
(a missing script, an unknown card, a TensorFlow script), 3 when the script could not be
planned (its own error, no optimizer step, an operation fake tensors cannot run, a value
read under --strict, a process it tried to start, its process ending or killed without a
result, the time limit): never 0 without a verdict.
"""

from __future__ import annotations

import argparse
import json
import sys

from .memory.capacity import KNOWN_GPUS

__all__ = ["main", "parser", "split_argv"]

EPILOG = """\
examples:
  python -m helpers.fit train.py --epochs 1 --gpu L40S
  python -m helpers.fit train.py --batch-size 256 --batch-arg --batch-size
  python -m helpers.fit train.py --amp bf16 --checkpoint-every 2 --ddp 4 --slurm
  python -m helpers.fit train.py --gpu T4 -- --steps 100   (script options after --)

what it cannot see (leave a margin of 10-15 %): cuDNN/cuBLAS workspaces, the real CUDA
context (a fixed --context is added), other processes on the card, fragmentation over a long
run, CUDA-only kernels (flash attention), NCCL's buffers.

the script runs in a process of its own; its file writes go to a throw-away folder (your
files are never changed) and are listed; it may not start processes (mp.spawn: use --ddp N).

exit status: 0 fits the --gpu card, 1 does not fit, 2 bad input, 3 could not be planned.
"""


def parser() -> argparse.ArgumentParser:
    """The planner's own options (the script's arguments are split off first)."""
    p = argparse.ArgumentParser(
        prog="python -m helpers.fit",
        description="Will it fit? Plan a GPU job from your own, unmodified PyTorch training "
                    "script: it runs on a virtual card with fake tensors (no GPU, no real "
                    "memory, no compute) until its 2nd optimizer step.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("script", help="your training script (a .py file); its own arguments "
                   "follow it")
    p.add_argument("--gpu", default="A100-40GB", metavar="CARD",
                   help="the card the script sees (torch.cuda.get_device_name(), "
                   f"mem_get_info()...): one of {', '.join(KNOWN_GPUS)}. Every card is "
                   "compared either way. Default: A100-40GB")
    p.add_argument("--steps", type=int, default=2, metavar="N",
                   help="stop after the script's Nth optimizer step (default 2: Adam's "
                   "state exists from the first step; the second is the steady state)")
    p.add_argument("--strict", action="store_true",
                   help="stop at the first value the script reads from a GPU tensor "
                   "(loss.item(), print(loss), if torch.isnan(loss)) instead of answering "
                   "it with a stand-in value")
    p.add_argument("--batch-arg", metavar="NAME",
                   help="the script's batch-size option (e.g. --batch-size): also find the "
                   "largest batch that fits each card, by re-running the script")
    p.add_argument("--multiple-of", type=int, default=8, metavar="M",
                   help="batch sizes searched are multiples of M (default 8)")
    p.add_argument("--max-batch", type=int, default=65536, metavar="B",
                   help="the largest batch size searched (default 65536)")
    p.add_argument("--amp", choices=["bf16", "fp16"],
                   help="also predict the peak with autocast around the model's forward "
                   "(bf16: A100/H100/L40S; fp16 with a GradScaler: T4, V100)")
    p.add_argument("--checkpoint-every", type=int, metavar="K",
                   help="also predict the peak with activation checkpointing of every "
                   "nn.Sequential, one checkpoint per K children (use_reentrant=False)")
    p.add_argument("--ddp", type=int, metavar="N",
                   help="plan each rank of N DDP processes (the script's batch per rank): "
                   "adds DDP's gradient buckets, a copy of the gradients")
    p.add_argument("--bucket-view", action="store_true",
                   help="with --ddp: the script sets gradient_as_bucket_view=True (the "
                   "buckets then cost about nothing)")
    p.add_argument("--context", default="500 MiB", metavar="SIZE",
                   help="memory the CUDA context takes on the card (default 500 MiB; "
                   "measure yours with nvidia-smi after torch.zeros(1).cuda())")
    p.add_argument("--max-forwards", type=int, default=50, metavar="N",
                   help="give up when the script made N forward passes without an "
                   "optimizer step (default 50)")
    p.add_argument("--time-limit", type=float, default=600.0, metavar="SECONDS",
                   help="give up on a run of the script after this long (default 600, "
                   "at most a week); a run that swallows the stop is killed a grace later")
    p.add_argument("--slurm", action="store_true",
                   help="print a SLURM request for the smallest card that fits")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(planner_argv, script_args)``: planner options (wherever they are) apart from the
    script's own arguments; everything after ``--`` belongs to the script."""
    p = parser()
    takes_value, flags = {}, set()
    for action in p._actions:
        for opt in action.option_strings:
            if action.nargs == 0:
                flags.add(opt)
            else:
                takes_value[opt] = action
    mine, script_args = [], []
    script = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            script_args.extend(argv[i + 1:])
            break
        name = a.split("=", 1)[0]
        if a in flags:
            mine.append(a)
        elif name in takes_value:
            if "=" not in a and i + 1 < len(argv):
                mine.append(f"{a}={argv[i + 1]}")  # a value may start with "-" (--batch-size)
                i += 1
            else:
                mine.append(a)
        elif script is None and not a.startswith("-"):
            script = a
        else:
            script_args.append(a)
        i += 1
    if script is not None:
        mine.insert(0, script)
    return mine, script_args


def main(argv: list[str] | None = None) -> int:
    from .memory.planner import PlanError, will_it_fit

    argv = list(sys.argv[1:] if argv is None else argv)
    mine, script_args = split_argv(argv)
    opts = parser().parse_args(mine)
    try:
        plan = will_it_fit(
            opts.script, script_args, gpu=opts.gpu, steps=opts.steps, strict=opts.strict,
            batch_arg=opts.batch_arg, multiple_of=opts.multiple_of, max_batch=opts.max_batch,
            amp=opts.amp, checkpoint_every=opts.checkpoint_every, ddp=opts.ddp,
            gradient_as_bucket_view=opts.bucket_view, context=opts.context,
            max_forwards=opts.max_forwards, time_limit=opts.time_limit)
    except PlanError as exc:
        if exc.details:
            print(exc.details, file=sys.stderr, end="" if exc.details.endswith("\n") else "\n")
        print(f"helpers.fit: {exc}", file=sys.stderr)
        return 2 if exc.kind in ("missing", "tensorflow") else 3
    except (TypeError, ValueError) as exc:
        print(f"helpers.fit: {exc}", file=sys.stderr)
        return 2
    if opts.json:
        print(json.dumps(plan.to_dict(), default=str, indent=1))
    else:
        print(plan.text())
    if opts.slurm:
        print()
        try:
            print(plan.slurm(), end="")
        except ValueError as exc:
            print(f"no SLURM request: {exc}")
    return 0 if plan.card_fit(opts.gpu).fits else 1


if __name__ == "__main__":
    sys.exit(main())
