"""Train a small MLP with DistributedDataParallel; resume automatically from a checkpoint.

Launch with torchrun, one process per GPU (or 2 CPU processes over gloo without a GPU):

    torchrun --standalone --nproc_per_node=2 scripts/ddp_train.py --checkpoint run/ddp.pt

Run it again with the same --checkpoint and it resumes where it stopped. SIGTERM or SIGUSR1
(what SLURM sends before a time limit or a requeue) makes every process stop at the next
step that reads results (every --log-every steps); rank 0 saves a checkpoint and the run
exits. From SLURM's SIGTERM to its SIGKILL there are KillWait seconds (site config, default
30 s): --log-every steps plus a save must fit in them. --stop-after-steps K simulates the
signal: each process sends itself SIGTERM after K steps of this run.

The loop waits for the device only at those reads: the loss is summed on the device, and
one all-reduce plus one copy to the host every --log-every steps give the mean loss and the
stop flag (lessons 01 and 09: a host sync every step stalls the GPU's queue).
Without torchrun it runs as one process, which listens on the loopback interface only.
Used by lesson 03, make stress and scripts/slurm_ddp.sbatch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

import helpers
from helpers.checkpoint import _file, _writable, load_checkpoint, save_checkpoint
from helpers.core.fmt import fmt_seconds

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_stop_signal: list[tuple[int, float]] = []  # (signal number, time.perf_counter() on arrival)


# the largest value of each count: more would only exhaust memory (a batch of 1e10 samples
# raised MemoryError); the bound is in the message
BOUNDS = {"epochs": 100_000, "batch_size": 1_000_000, "samples": 10_000_000,
          "features": 100_000, "hidden": 100_000, "depth": 1_000, "classes": 100_000,
          "log_every": 10_000_000, "stop_after_steps": 10**9}
MOST_VALUES = 2**28  # samples x features, and hidden x hidden x depth: 1 GiB of float32


def count(name: str):
    """An argparse type: a whole number; '1e10' or '2.5' is named with what is accepted."""
    def parse(value: str) -> int:
        try:
            return int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a whole number from 1 to {BOUNDS[name]:,}, got {value!r}") from None
    return parse


def finite(name: str):
    """An argparse type: a finite real number (inf and nan are refused with the option's
    name, as an argparse error: exit status 2 and the usage, no traceback)."""
    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {value!r}")
        return number
    parse.__name__ = name
    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--epochs", type=count("epochs"), default=2, help="epochs to train in total")
    p.add_argument("--batch-size", type=count("batch_size"), default=32,
                   help="batch size PER PROCESS")
    p.add_argument("--lr", type=finite("lr"), default=0.05, help="SGD learning rate")
    p.add_argument("--samples", type=count("samples"), default=1024,
                   help="synthetic training samples")
    p.add_argument("--features", type=count("features"), default=32)
    p.add_argument("--hidden", type=count("hidden"), default=128)
    p.add_argument("--depth", type=count("depth"), default=2)
    p.add_argument("--classes", type=count("classes"), default=4)
    p.add_argument("--noise", type=finite("noise"), default=6.0,
                   help="spread of the synthetic classes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="save every epoch and on SIGTERM/SIGUSR1; resume from it if it exists "
                        "(a regular file or a new path)")
    p.add_argument("--stop-after-steps", type=count("stop_after_steps"), default=None,
                   metavar="K",
                   help="simulate a time limit: every process gets SIGTERM after K steps")
    p.add_argument("--save-grads", type=Path, default=None,
                   help="rank 0 saves the averaged gradients of the first step here")
    p.add_argument("--summary", type=Path, default=None, help="rank 0 writes a JSON summary here")
    p.add_argument("--log-every", type=count("log_every"), default=10, metavar="N",
                   help="read the loss and check for a stop signal every N steps (and at the "
                        "end of each epoch); only these reads wait for the device")
    p.add_argument("--amp", choices=["auto", "on", "off"], default="auto",
                   help="float16 autocast + GradScaler; auto = on for CUDA, off on CPU")
    args = p.parse_args(argv)
    for name, bound in BOUNDS.items():
        value, flag = getattr(args, name), f"--{name.replace('_', '-')}"
        if value is not None and value <= 0:
            p.error(f"{flag} must be positive")
        if value is not None and value > bound:
            p.error(f"{flag} {value:,} is more than {bound:,}, the most this script accepts "
                    "(more does not fit in memory)")
    if args.batch_size > args.samples:
        p.error(f"--batch-size {args.batch_size} is more than --samples {args.samples}: "
                "not one full batch")
    if args.samples * args.features > MOST_VALUES:
        p.error(f"--samples x --features is {args.samples * args.features:,} values; at most "
                f"{MOST_VALUES:,} (1 GiB of float32)")
    if args.hidden * args.hidden * args.depth > MOST_VALUES:
        p.error(f"--hidden x --hidden x --depth is {args.hidden**2 * args.depth:,} weights; at "
                f"most {MOST_VALUES:,} (1 GiB of float32)")
    if args.stop_after_steps is not None and not args.checkpoint:
        p.error("--stop-after-steps needs a positive K and --checkpoint (where to save)")
    if args.checkpoint is not None:
        try:
            _file(args.checkpoint)  # a name longer than the file system allows
        except (TypeError, ValueError) as exc:
            p.error(str(exc).replace("path's", "--checkpoint's", 1))
        try:
            _writable(args.checkpoint, "--checkpoint")
        except ValueError as exc:
            p.error(str(exc))
    return args


def setup_distributed():
    """Join the process group torchrun describes (or a group of one without torchrun)."""
    alone = "RANK" not in os.environ  # plain `python ddp_train.py`: a group of one
    if alone:
        # nothing to reach from outside: keep the rendezvous in the process (no TCPStore
        # listening on every interface) and gloo's socket on the loopback interface
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        loopback = [n for _, n in socket.if_nameindex() if n in ("lo", "lo0")]
        if loopback and "GLOO_SOCKET_IFNAME" not in os.environ:
            os.environ["GLOO_SOCKET_IFNAME"] = loopback[0]
    group = {"store": dist.HashStore(), "rank": 0, "world_size": 1} if alone else {}
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        n_gpus = torch.cuda.device_count()
        if local_rank >= n_gpus:  # else cuda:N is an invalid ordinal, or NCCL sees a duplicate
            sys.exit(f"ddp_train.py: error: local rank {local_rank} needs GPU {local_rank}, but "
                     f"this process sees {n_gpus} GPU(s): start at most {n_gpus} process(es) "
                     f"per node (torchrun --nproc_per_node={n_gpus}), or run on the CPU over "
                     f'gloo with CUDA_VISIBLE_DEVICES=""')
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, **group)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", **group)
    return dist.get_rank(), dist.get_world_size(), device


def shutdown(code: int = 0):
    """Leave together, then exit without the interpreter's teardown: a gloo workaround.

    `destroy_process_group()` is the normal end of a DDP script. On the CPU over gloo about
    9% of runs still aborted at exit ("terminate called without an active exception"): a
    teardown race in gloo's threads, after training had succeeded. `os._exit` skips that
    teardown, and with it atexit handlers, `finally` blocks and unflushed files, so flush
    everything first (loggers, TensorBoard/W&B writers) and use it only if you hit the abort.
    """
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def read_results(loss_sum, device) -> tuple[float, bool]:
    """The loop's one wait for the device: (sum of all processes' losses, stop requested).

    One all-reduce carries this process's summed losses and whether it got SIGTERM/SIGUSR1,
    so every process learns at the same step that any one of them was told to stop.
    """
    stats = torch.stack([loss_sum, torch.tensor(float(bool(_stop_signal)), device=device)])
    dist.all_reduce(stats)
    total, stops = (v.item() for v in stats.cpu())  # .cpu() waits; the rest is host-side
    return total, stops > 0


def log(rank: int, *parts):
    if rank == 0:
        print(*parts, flush=True)


def resume(args, ddp, optimizer, scaler, device, rank, steps_per_epoch):
    """(epoch, steps done in it, running loss sums) from --checkpoint, or a fresh start."""
    fresh = {"loss_sum": 0.0, "steps": 0}
    if args.checkpoint is None or not args.checkpoint.is_file():
        return 0, 0, fresh
    try:
        info = load_checkpoint(args.checkpoint, model=ddp, optimizer=optimizer, scaler=scaler,
                               map_location=device)
    except ValueError as exc:  # another model's, damaged, not a kit checkpoint: nothing loaded
        sys.exit(f"ddp_train.py: error: cannot resume from --checkpoint: {exc}. Give another "
                 "--checkpoint path to start afresh")
    saved = info.extra.get("totals")  # absent in a kit checkpoint another script saved
    if isinstance(saved, dict) and {"loss_sum", "steps"} <= set(saved):
        totals = {"loss_sum": float(saved["loss_sum"]), "steps": int(saved["steps"])}
    else:
        totals = fresh
        if info.step:
            log(rank, f"{args.checkpoint} holds no running loss (extra['totals']): epoch "
                      f"{info.epoch + 1}'s mean loss counts only the steps from here")
    if info.epoch >= args.epochs:
        log(rank, f"{args.checkpoint} has finished all {args.epochs} epochs: nothing to do")
    else:
        log(rank, f"resumed from {args.checkpoint}: epoch {info.epoch + 1}, "
                  f"{info.step} of {steps_per_epoch} steps already done")
    return info.epoch, info.step, totals


def main(argv=None):
    args = parse_args(argv)
    rank, world, device = setup_distributed()
    for sig in STOP_SIGNALS:  # SLURM: time limit near, preemption, requeue
        signal.signal(sig, lambda signum, frame: _stop_signal.append(
            (signum, time.perf_counter())))

    torch.manual_seed(args.seed)  # same initial weights everywhere (DDP also broadcasts)
    model = helpers.MLP(args.features, args.hidden, args.depth, args.classes).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    use_amp = args.amp == "on" or (args.amp == "auto" and device.type == "cuda")
    # fused: one kernel for the update, and GradScaler then skips its per-step host read
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9,
                                fused=device.type == "cuda")
    scaler = torch.amp.GradScaler(device.type, enabled=use_amp)

    x, y = helpers.classification_data(args.samples, args.features, args.classes,
                                       seed=args.seed, noise=args.noise)
    dataset = helpers.torch_dataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    pinned = device.type == "cuda"  # page-locked batches copy to the GPU asynchronously
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        pin_memory=pinned)
    steps_per_epoch = len(loader)
    if steps_per_epoch == 0:  # every process needs one full batch (drop_last)
        if rank == 0:
            print(f"ddp_train.py: error: --batch-size {args.batch_size} x {world} processes is "
                  f"more than the {len(dataset)} samples: not one full batch per process",
                  file=sys.stderr, flush=True)
        shutdown(2)
    log(rank, f"world size {world} on {device.type} ({dist.get_backend()}): "
              f"{args.batch_size} samples per process per step, global batch "
              f"{args.batch_size * world}; {steps_per_epoch} steps per epoch, "
              f"{len(sampler)} of {len(dataset)} samples per process per epoch")

    start_epoch, skip, totals = resume(args, ddp, optimizer, scaler, device, rank,
                                       steps_per_epoch)

    def checkpoint(epoch, step):
        if rank == 0 and args.checkpoint is not None:
            save_checkpoint(args.checkpoint, model=ddp, optimizer=optimizer, scaler=scaler,
                            epoch=epoch, step=step, extra={"totals": totals})
        dist.barrier()  # nobody runs ahead (or exits) before the file is complete

    loss_fn = torch.nn.CrossEntropyLoss()
    loss_sum = torch.zeros((), device=device)  # this process's losses since the last read
    run_steps, pending, reads, samples, busy, losses = 0, 0, 0, 0, 0.0, []
    clock, stopped_by = None, None  # clock: when the last read ended (None before the first)
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every process
        for i, (xb, yb) in enumerate(loader):
            if i < skip:  # done before the interruption
                continue
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.float16, enabled=use_amp):
                loss = loss_fn(ddp(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()  # DDP all-reduces (averages) gradients here
            if args.save_grads is not None and epoch == 0 and i == 0:
                scaler.unscale_(optimizer)
                save_first_grads(args.save_grads, ddp, sampler, args, rank, world)
            scaler.step(optimizer)
            scaler.update()
            loss_sum += loss.detach().float()  # on the device: nothing waits here
            run_steps, pending = run_steps + 1, pending + 1
            if args.stop_after_steps is not None and run_steps == args.stop_after_steps:
                signal.raise_signal(signal.SIGTERM)  # what SLURM would send
            step = epoch * steps_per_epoch + i + 1
            if run_steps > 1 and i + 1 < steps_per_epoch and step % args.log_every:
                continue  # no read this step: the host queues the next one at once
            total, stop = read_results(loss_sum, device)  # waits for the device
            reads += 1
            if clock is not None:  # the first step includes one-off set-up costs
                busy += time.perf_counter() - clock
                samples += pending * args.batch_size
            totals["loss_sum"] += total / world
            totals["steps"] += pending
            loss_sum.zero_()
            pending = 0
            if stop:
                stopped_by = signal.Signals(_stop_signal[0][0]).name if _stop_signal else "a peer"
                checkpoint(epoch, i + 1)
                waited = (f", {fmt_seconds(time.perf_counter() - _stop_signal[0][1])} after "
                          "the signal" if _stop_signal and args.checkpoint else "")
                log(rank, f"{stopped_by} after step {step}: rank 0 saved {args.checkpoint} "
                          f"(epoch {epoch + 1}, step {i + 1} of {steps_per_epoch}){waited}; "
                          "run the same command again to resume")
                break
            clock = time.perf_counter()
        if stopped_by:
            break
        skip = 0
        if totals["steps"]:  # none when a checkpoint without totals was saved at the end
            losses.append(totals["loss_sum"] / totals["steps"])
            log(rank, f"epoch {epoch + 1}/{args.epochs}: mean loss {losses[-1]:.4f}")
        totals = {"loss_sum": 0.0, "steps": 0}
        checkpoint(epoch + 1, 0)
        if args.checkpoint is not None:
            log(rank, f"rank 0 saved {args.checkpoint} (epoch {epoch + 1})")
        clock = time.perf_counter() if clock is not None else None

    rates = [None] * world
    dist.all_gather_object(rates, {"samples": samples, "seconds": busy})
    if rank == 0:
        report(args, world, device, rates, losses, stopped_by,
               {"steps": run_steps, "host_reads": reads, "log_every": args.log_every})
    shutdown(0)


def save_first_grads(path, ddp, sampler, args, rank, world):
    """Rank 0 saves the gradients DDP averaged in the first step, and every rank's batch."""
    first = list(sampler)[: args.batch_size]  # this process's first batch, as the loader saw it
    batches = [None] * world
    dist.all_gather_object(batches, first)
    if rank == 0:
        grads = {n: p.grad.detach().cpu().clone() for n, p in ddp.module.named_parameters()}
        path.parent.mkdir(parents=True, exist_ok=True)
        config = {k: getattr(args, k) for k in ("samples", "features", "hidden", "depth",
                                                "classes", "noise", "seed", "batch_size")}
        torch.save({"grads": grads, "batches": batches, "config": config}, path)


def report(args, world, device, rates, losses, stopped_by, loop):
    per_rank = [s["samples"] / s["seconds"] if s["seconds"] > 0 else 0.0 for s in rates]
    if any(per_rank):
        print("throughput per process (steps after the first):", flush=True)
        for r, rate in enumerate(per_rank):
            print(f"  rank {r}: {helpers.fmt_rate(rate)}", flush=True)
        print(f"  all {world}: {helpers.fmt_rate(sum(per_rank))}", flush=True)
    if args.summary is not None:
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(json.dumps({
            "world_size": world, "device": device.type, "backend": dist.get_backend(),
            "batch_per_process": args.batch_size, "global_batch": args.batch_size * world,
            "epoch_losses": losses, "finished": stopped_by is None, "stopped_by": stopped_by,
            "samples_per_s": per_rank, **loop,
        }, indent=1))


if __name__ == "__main__":
    main()
