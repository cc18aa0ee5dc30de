"""``python -m helpers.fit train.py [the script's arguments] --gpu A100-40GB``: will it fit?

Runs an unmodified PyTorch training script on a virtual card with full-scale fake tensors
until every optimizer's 2nd step, and prints the peak (by category, with the script's line at
the peak), every known card with its headroom, and, on request, the largest batch per card,
the peak after planner-applied fixes, per-rank DDP memory and a SLURM request. See
:func:`helpers.will_it_fit` (the same, for notebooks) and lesson 10.

Planner options before the script's path are always the planner's. After it, an option
that the script's own source defines (``add_argument("--gpu", ...)``) goes to the script, and
a note on stderr says so; any other planner option is the planner's. Everything after ``--``
is the script's: ``python -m helpers.fit --gpu L40S train.py --gpu 0 -- --steps 100``.

The verdict is judged on the caching allocator's peak *reserved* bytes + the CUDA context
(+ DDP's buckets), with a margin (``--margin``, default max(15 %, 2 GiB) of each card).

Exit status: 0 when the script fits the chosen card, 1 when it does not, 2 for bad input
(a missing script, an unknown card, a TensorFlow script), 3 when the script could not be
planned (its own error, no optimizer step, an operation fake tensors cannot run, a value
read under --strict, a process it tried to start, its process ending or killed without a
result, the time limit): never 0 without a verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from .memory.capacity import KNOWN_GPUS

__all__ = ["main", "parser", "split_argv", "split_argv_notes", "script_options"]

EPILOG = """\
examples:
  python -m helpers.fit train.py --epochs 1 --gpu L40S
  python -m helpers.fit train.py --batch-size 256 --batch-arg --batch-size
  python -m helpers.fit train.py --amp bf16 --checkpoint-every 2 --ddp 4 --slurm
  python -m helpers.fit --gpu T4 train.py --gpu 0   (before the script: the planner's;
                                                    after it: the script's own --gpu)
  python -m helpers.fit train.py --gpu T4 -- --steps 100   (script options after --)

the verdict: each card is judged on the peak RESERVED by the caching allocator (a model of
PyTorch's, not the allocated bytes alone) + --context (+ DDP's buckets with --ddp), shown
beside the allocated figure. "fits": at least the margin is left; "fits, inside the margin":
it fits with less than the margin left; "out of memory". --margin is a percentage of the card
("20%") or a size ("4GiB"); default max(15 %, 2 GiB), the lessons' rule. With --batch-arg the
table shows the largest batch that fits and the recommended one (it fits with the margin);
--slurm asks for the smallest card that fits with the margin.

run as CUDA would (each call listed under "Run as CUDA would"): attention
(F.scaled_dot_product_attention, nn.MultiheadAttention) takes the backend CUDA picks for the
--gpu card (cuDNN, flash, memory-efficient or math) and keeps what it keeps; under autocast,
the ops CUDA runs in float32 (GroupNorm, LayerNorm, softmax, exp...) are counted so;
nn.LSTM/GRU/RNN keep a lower bound of cuDNN's reserve space (its exact size needs a GPU).

the script's objects as on a GPU: a module's move (.cuda(), .to(), .half(), a second .to())
keeps its Parameter objects, so tied weights are counted once and an optimizer made before
.cuda() keeps its state; tensors on the card answer x.device (cuda:0), x.is_cuda and
x.get_device() as on a GPU, so torch.zeros(n, device=x.device) is on the card;
torch.set_default_device("cuda") works; buffers (BatchNorm's running statistics) have their
own line; nn.DataParallel on the one card runs its module (on several cards: refused).

what it cannot see (that is what the margin is for): cuDNN/cuBLAS workspaces, the real CUDA
context (a fixed --context is added), other processes on the card, fragmentation over a long
run, custom CUDA kernels (flash-attn, apex, Triton), NCCL's buffers.

the script runs in a process of its own; its file writes go to a throw-away folder (your
files are never changed) and are listed; it may not start processes (mp.spawn: use --ddp N).

what a machine can plan: fake tensors take no GPU memory, but the script builds its model
on the host first, in float32, so the planner's RAM grows with the model: about 4.2-4.5 bytes
per parameter on top of ~240 MB for torch and the kit (measured with tests/planner_scripts/
transformer_lm.py: 163 M parameters, peak RSS 0.97 GB; 406 M parameters, 1.94 GB). A 1 B-
parameter model needs ~5 GB of RAM to plan, a 7 B model ~30 GB: plan it on such a machine.

exit status: 0 fits the --gpu card (inside the margin too), 1 does not fit, 2 bad input,
3 could not be planned.
"""


def parser() -> argparse.ArgumentParser:
    """The planner's own options (the script's arguments are split off first)."""
    p = argparse.ArgumentParser(
        prog="python -m helpers.fit",
        description="Will it fit? Plan a GPU job from your own, unmodified PyTorch training "
                    "script: it runs on a virtual card with fake tensors (no GPU, no real "
                    "memory, no compute) until every optimizer's 2nd step.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("script", help="your training script (a .py file); its own arguments "
                   "follow it (planner options go before it, or after it unless the script "
                   "defines an option of the same name)")
    p.add_argument("--gpu", default="A100-40GB", metavar="CARD",
                   help="the card the script sees (torch.cuda.get_device_name(), "
                   f"mem_get_info()...): one of {', '.join(KNOWN_GPUS)}. Every card is "
                   "compared either way. Default: A100-40GB")
    p.add_argument("--steps", type=int, default=2, metavar="N",
                   help="stop when every optimizer of the script has stepped N times "
                   "(default 2: Adam's state exists from the first step; the second is the "
                   "steady state; a GAN's two optimizers both get theirs)")
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
                   "adds DDP's gradient buckets, a copy of the gradients. --slurm writes a "
                   "torchrun line only for a script that sets up DDP itself")
    p.add_argument("--bucket-view", action="store_true",
                   help="with --ddp: the script sets gradient_as_bucket_view=True (the "
                   "buckets then cost about nothing)")
    p.add_argument("--context", default="500 MiB", metavar="SIZE",
                   help="memory the CUDA context takes on the card (default 500 MiB; "
                   "measure yours with nvidia-smi after torch.zeros(1).cuda())")
    p.add_argument("--margin", metavar="PERCENT|SIZE",
                   help="what each card keeps free for what the planner cannot see: a "
                   "percentage of the card (20%%) or a size (4GiB). Default: max(15 %%, "
                   "2 GiB), the lessons' rule")
    p.add_argument("--max-forwards", type=int, default=50, metavar="N",
                   help="give up when the script made N forward passes without an "
                   "optimizer step (default 50; raise it for gradient accumulation over "
                   "more forward passes); also how long the planner waits for an optimizer "
                   "that has not stepped yet once the others have")
    p.add_argument("--time-limit", type=float, default=600.0, metavar="SECONDS",
                   help="give up on a run of the script after this long (default 600, "
                   "at most a week); a run that swallows the stop is killed a grace later")
    p.add_argument("--slurm", action="store_true",
                   help="print a SLURM request for the smallest card that fits with the "
                   "margin (lines marked SITE need your cluster's names)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(planner_argv, script_args)``: see :func:`split_argv_notes`."""
    mine, script_args, _ = split_argv_notes(argv)
    return mine, script_args


def script_options(path: str) -> set[str]:
    """The option names a script's source defines (``add_argument("--gpu", "-g", ...)``,
    ``click.option("--gpu")``); empty when it cannot be read."""
    if not os.path.isfile(path):  # a FIFO or device would block the read
        return set()
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except (OSError, UnicodeDecodeError, ValueError):
        return set()
    names = set()
    literal = r"""(?:"[^"\n]*"|'[^'\n]*')"""
    for call in re.finditer(rf"(?:add_argument|option)\(\s*((?:{literal}\s*,\s*)*{literal})",
                            source):
        for name in re.findall(literal, call.group(1)):
            if name[1:-1].startswith("-"):
                names.add(name[1:-1])
    return names


def split_argv_notes(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """``(planner_argv, script_args, notes)``. Planner options before the script's path are
    the planner's. After it, a planner option that the script's own source also defines goes
    to the script (with a note saying so); other planner options are the planner's. Everything
    after ``--`` belongs to the script."""
    p = parser()
    takes_value, flags = {}, set()
    for action in p._actions:
        for opt in action.option_strings:
            if action.nargs == 0:
                flags.add(opt)
            else:
                takes_value[opt] = action
    mine, script_args, notes = [], [], []
    script = None
    theirs: set[str] = set()
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            script_args.extend(argv[i + 1:])
            break
        name = a.split("=", 1)[0]
        if script is not None and name in theirs and (name in flags or name in takes_value):
            script_args.append(a)
            notes.append(f"{name} after {script} went to the script (it defines {name}); "
                         "put it before the script for the planner's")
        elif a in flags:
            mine.append(a)
        elif name in takes_value:
            if "=" not in a and i + 1 < len(argv):
                mine.append(f"{a}={argv[i + 1]}")  # a value may start with "-" (--batch-size)
                i += 1
            else:
                mine.append(a)
        elif script is None and not a.startswith("-"):
            script = a
            theirs = script_options(a)
        else:
            script_args.append(a)
        i += 1
    if script is not None:
        mine.insert(0, script)
    return mine, script_args, list(dict.fromkeys(notes))


def main(argv: list[str] | None = None) -> int:
    from .memory.planner import PlanError, will_it_fit

    argv = list(sys.argv[1:] if argv is None else argv)
    mine, script_args, notes = split_argv_notes(argv)
    opts = parser().parse_args(mine)
    for note in notes:
        print(f"helpers.fit: {note}", file=sys.stderr)
    try:
        plan = will_it_fit(
            opts.script, script_args, gpu=opts.gpu, steps=opts.steps, strict=opts.strict,
            batch_arg=opts.batch_arg, multiple_of=opts.multiple_of, max_batch=opts.max_batch,
            amp=opts.amp, checkpoint_every=opts.checkpoint_every, ddp=opts.ddp,
            gradient_as_bucket_view=opts.bucket_view, context=opts.context,
            max_forwards=opts.max_forwards, time_limit=opts.time_limit, margin=opts.margin)
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
