"""scripts/ddp_train.py waits for the device only every --log-every steps (lesson 03).

The loop runs in this process as a group of one over gloo. On a CPU nothing really waits, so
the tests count the calls that would: every `.item()`/`float(t)` (aten._local_scalar_dense,
seen by a TorchDispatchMode) and every all-reduce the script starts itself. The script
before this test read the loss and the stop flag with an all-reduce and an `.item()` each on
every step (and synchronized the GPU every step).
"""

from __future__ import annotations

import importlib.util
import json
import signal

import pytest
import torch
import torch.distributed as dist
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


def _run(monkeypatch, tmp_path, *args):
    """main(args) in this process; returns (summary, .item() calls, all-reduces)."""
    spec = importlib.util.spec_from_file_location("ddp_train_syncs", SCRIPTS / "ddp_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(module, "shutdown", lambda code=0: dist.destroy_process_group())
    reduces, real_all_reduce = [], dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        reduces.append(tensor.numel())
        return real_all_reduce(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    handlers = {sig: signal.getsignal(sig) for sig in module.STOP_SIGNALS}
    summary = tmp_path / "summary.json"
    try:
        with _HostReads() as reads:
            module.main([*args, "--samples", "1024", "--batch-size", "32",
                         "--summary", str(summary)])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if dist.is_initialized():
            dist.destroy_process_group()
    return json.loads(summary.read_text()), reads.count, len(reduces)


def test_the_loop_reads_results_every_log_every_steps_not_every_step(monkeypatch, tmp_path,
                                                                     capsys):
    summary, reads, reduces = _run(monkeypatch, tmp_path, "--epochs", "2",
                                          "--log-every", "8")
    steps = 2 * 1024 // 32  # world size 1: 32 steps per epoch
    waits = 1 + steps // 8  # after step 1 (the clock starts), then every 8th step
    assert summary["finished"] and len(summary["epoch_losses"]) == 2
    assert (summary["steps"], summary["host_reads"]) == (steps, waits)
    assert reduces == waits, f"{reduces} all-reduces by the loop in {steps} steps"
    # 2 per read (loss sum, stop flag, from one copy to the host); a few more are set-up and
    # teardown, once per run or epoch (torch 2.13: DDP's init 1, the DataLoader's seed 1 per
    # epoch, all_gather_object 2). Before: 2 per step, 128 here.
    assert 2 * waits <= reads <= 2 * waits + 8, f"{reads} .item() calls in {steps} steps"
    out = capsys.readouterr().out
    assert "epoch 1/2: mean loss" in out and "epoch 2/2: mean loss" in out


def test_a_stop_signal_takes_effect_at_the_next_read(monkeypatch, tmp_path, capsys):
    summary, _, _ = _run(monkeypatch, tmp_path, "--epochs", "2", "--log-every", "8",
                            "--stop-after-steps", "5", "--checkpoint", str(tmp_path / "c.pt"))
    assert summary["stopped_by"] == "SIGTERM" and not summary["finished"]
    out = capsys.readouterr().out
    assert "SIGTERM after step 8: rank 0 saved" in out and "after the signal" in out
    state = read_checkpoint(tmp_path / "c.pt")
    assert (state["epoch"], state["step"]) == (0, 8)


@pytest.mark.parametrize("every", ["0", "-1"])
def test_log_every_must_be_positive(every, capsys):
    spec = importlib.util.spec_from_file_location("ddp_train_args", SCRIPTS / "ddp_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit):
        module.parse_args(["--log-every", every])
    assert "--log-every must be positive" in capsys.readouterr().err
