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
