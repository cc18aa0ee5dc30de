"""scripts/ddp_train.py waits for the device only every --log-every steps (lesson 03).

The loop runs in a child process as a group of one over gloo. On a CPU nothing really waits, so
the tests count the calls that would: every `.item()`/`float(t)` (aten._local_scalar_dense,
seen by a TorchDispatchMode) and every all-reduce the script starts itself. The script
before this test read the loss and the stop flag with an all-reduce and an `.item()` each on
every step (and synchronized the GPU every step).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from script_loader import load_script
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.checkpoint import read_checkpoint
from helpers.launch import SCRIPTS, free_port


class _HostReads(TorchDispatchMode):
    """Counts aten._local_scalar_dense: what `.item()`, `float(t)` and `bool(t)` run."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _run_here(args, summary):
    """In a child process: main(args) as a group of one; returns (.item() calls, all-reduces).

    The child leaves with os._exit, as the script does: destroying a gloo group whose DDP
    reducer is still alive can hang in ~ProcessGroupGloo (the teardown race lesson 03
    explains), which hung a CI worker when this ran in the test process itself."""
    module = load_script("ddp_train", "ddp_train_syncs")
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    module.shutdown = lambda code=0: None  # the child exits with os._exit below
    reduces, real_all_reduce = [], dist.all_reduce

    def all_reduce(tensor, *a, **kw):
        reduces.append(tensor.numel())
        return real_all_reduce(tensor, *a, **kw)

    dist.all_reduce = all_reduce
    with _HostReads() as reads:
        module.main([*args, "--samples", "1024", "--batch-size", "32", "--summary", summary])
    return reads.count, len(reduces)


def _run(tmp_path, *args):
    """main(args) in a fresh process; returns (summary, .item() calls, all-reduces, stdout)."""
    summary = tmp_path / "summary.json"
    code = ("import json, os, sys; sys.path[:0] = sys.argv[1:3]; import test_ddp_train as t; "
            "r = t._run_here(json.loads(sys.argv[3]), sys.argv[4]); "
            "print('RESULT', json.dumps(r), flush=True); sys.stderr.flush(); os._exit(0)")
    proc = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent), str(SCRIPTS.parent / "tests"),
         json.dumps(list(args)), str(summary)], capture_output=True, text=True, timeout=600,
        cwd=SCRIPTS.parent, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert result, proc.stdout + proc.stderr
    reads, reduces = json.loads(result[-1].split(" ", 1)[1])
    return json.loads(summary.read_text()), reads, reduces, proc.stdout


def test_the_loop_reads_results_every_log_every_steps_not_every_step(tmp_path):
    summary, reads, reduces, out = _run(tmp_path, "--epochs", "2", "--log-every", "8")
    steps = 2 * 1024 // 32  # world size 1: 32 steps per epoch
    waits = 1 + steps // 8  # after step 1 (the clock starts), then every 8th step
    assert summary["finished"] and len(summary["epoch_losses"]) == 2
    assert (summary["steps"], summary["host_reads"]) == (steps, waits)
    assert reduces == waits, f"{reduces} all-reduces by the loop in {steps} steps"
    # 2 per read (loss sum, stop flag, from one copy to the host); a few more are set-up and
    # teardown, once per run or epoch (torch 2.13: DDP's init 1, the DataLoader's seed 1 per
    # epoch, all_gather_object 2). Before: 2 per step, 128 here.
    assert 2 * waits <= reads <= 2 * waits + 8, f"{reads} .item() calls in {steps} steps"
    assert "epoch 1/2: mean loss" in out and "epoch 2/2: mean loss" in out


def test_a_stop_signal_takes_effect_at_the_next_read(tmp_path):
    summary, _, _, out = _run(tmp_path, "--epochs", "2", "--log-every", "8",
                              "--stop-after-steps", "5", "--checkpoint", str(tmp_path / "c.pt"))
    assert summary["stopped_by"] == "SIGTERM" and not summary["finished"]
    assert "SIGTERM after step 8: rank 0 saved" in out and "after the signal" in out
    state = read_checkpoint(tmp_path / "c.pt")
    assert (state["epoch"], state["step"]) == (0, 8)


@pytest.mark.parametrize("every", ["0", "-1"])
def test_log_every_must_be_positive(every, capsys):
    module = load_script("ddp_train", "ddp_train_args")
    with pytest.raises(SystemExit):
        module.parse_args(["--log-every", every])
    assert "--log-every must be positive" in capsys.readouterr().err


# --------------------------------------------- issue 33: refusals, loopback, resuming
@pytest.mark.parametrize(("args", "words"), [
    (["--batch-size", "1e10"], "expected a whole number from 1 to 1,000,000, got '1e10'"),
    (["--batch-size", "10000000000"], "--batch-size 10,000,000,000 is more than 1,000,000"),
    (["--samples", "2048", "--batch-size", "4096"], "is more than --samples 2048"),
    (["--samples", "10000000", "--features", "100000"], "at most 268,435,456"),
    (["--hidden", "100000", "--depth", "1000"], "at most 268,435,456"),
    (["--depth", "99999999"], "--depth 99,999,999 is more than 1,000"),
    (["--noise", "inf"], "argument --noise: expected a finite number, got 'inf'"),
    (["--lr", "nan"], "argument --lr: expected a finite number, got 'nan'"),
    (["--checkpoint", "c" * 256], "--checkpoint's file name is 256 bytes long"),
])
def test_issue33_huge_counts_are_refused_with_the_bound(args, words, capsys):
    """--batch-size 1e10 (or 10**10) raised MemoryError; every count now has a bound and the
    message says it."""
    module = load_script("ddp_train", "ddp_train_args")
    with pytest.raises(SystemExit):
        module.parse_args(args)
    assert words in capsys.readouterr().err


def test_issue33_checkpoint_must_be_a_regular_file_or_a_new_path(tmp_path, capsys):
    """ddp_train.py --checkpoint /dev/null (as root) replaced the device with a regular file."""
    module = load_script("ddp_train", "ddp_train_args")
    fifo = tmp_path / "fifo.pt"
    os.mkfifo(fifo)
    os.symlink(tmp_path / "elsewhere.pt", tmp_path / "link.pt")
    for path, kind in ((fifo, "a FIFO"), (tmp_path / "link.pt", "a symbolic link")):
        with pytest.raises(SystemExit):
            module.parse_args(["--checkpoint", str(path)])
        err = capsys.readouterr().err
        assert f"{kind}: a checkpoint is written only to a regular file or a new path" in err
    assert module.parse_args(["--checkpoint", str(tmp_path / "new.pt")]).checkpoint


def _listening_addresses():
    """Local addresses of the TCP sockets this process listens on (from /proc)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    found.append(cols[1].split(":")[0])
    return found


@pytest.mark.skipif(not os.path.exists("/proc/self/net/tcp"), reason="needs Linux /proc")
def test_issue33_a_standalone_run_listens_on_loopback_only(tmp_path):
    """Even a single-process run listened on all interfaces (the TCPStore of its rendezvous)."""
    code = ("import os, sys, json; sys.path[:0] = sys.argv[1:3]; import test_ddp_train as t; "
            "from script_loader import load_script; "
            "m = load_script('ddp_train', 'ddp_train_alone'); m.setup_distributed(); "
            "print('RESULT', json.dumps(t._listening_addresses()), flush=True); os._exit(0)")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent), str(SCRIPTS.parent / "tests")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**env, "CUDA_VISIBLE_DEVICES": ""})
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and result, proc.stdout + proc.stderr
    addresses = json.loads(result[-1].split(" ", 1)[1])
    loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1
    assert set(addresses) <= loopback, f"listening on {addresses} (hex, /proc/net/tcp)"


def test_issue33_resuming_a_kit_checkpoint_without_totals_works(tmp_path, capsys):
    """A valid kit checkpoint without extra['totals'] (saved by other code) gave
    KeyError: 'totals' on resume. (The resume step runs here on a plain model: rank 0's
    part of main() before the loop, without a process group.)"""
    from helpers.checkpoint import save_checkpoint
    from helpers.models import MLP

    module = load_script("ddp_train", "ddp_train_resume")
    torch.manual_seed(0)
    model = MLP(32, 128, 2, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    path = save_checkpoint(tmp_path / "c.pt", model=model, optimizer=optimizer, scaler=scaler,
                           epoch=1, step=28)
    args = module.parse_args(["--epochs", "3", "--checkpoint", str(path)])
    fresh = MLP(32, 128, 2, 4)
    epoch, skip, totals = module.resume(args, fresh, torch.optim.SGD(
        fresh.parameters(), lr=0.05, momentum=0.9), scaler, torch.device("cpu"), 0, 32)
    assert (epoch, skip, totals) == (1, 28, {"loss_sum": 0.0, "steps": 0})
    assert torch.equal(fresh.head.weight, model.head.weight)
    out = capsys.readouterr().out
    assert "holds no running loss" in out and "epoch 2, 28 of 32 steps already done" in out


def test_issue33_an_unusable_checkpoint_is_a_clear_exit_not_a_traceback(tmp_path):
    """Another model's checkpoint (or a damaged one) raised a ValueError traceback in every
    process; the script now exits with the reason and what to do."""
    from helpers.checkpoint import save_checkpoint
    from helpers.models import MLP

    module = load_script("ddp_train", "ddp_train_resume")
    path = save_checkpoint(tmp_path / "c.pt", model=MLP(32, 64, 2, 4), epoch=1)
    args = module.parse_args(["--checkpoint", str(path)])
    model = MLP(32, 128, 2, 4)
    with pytest.raises(SystemExit) as caught:
        module.resume(args, model, torch.optim.SGD(model.parameters(), lr=0.1),
                      torch.amp.GradScaler("cpu", enabled=False), torch.device("cpu"), 0, 32)
    assert "cannot resume from --checkpoint" in str(caught.value)
    assert "different model" in str(caught.value) and "start afresh" in str(caught.value)
