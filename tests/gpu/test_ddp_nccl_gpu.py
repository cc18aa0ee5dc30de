"""DDP over NCCL on the GPUs of this node: scripts/ddp_train.py under torchrun.

On a machine with CUDA GPUs::

    python -m pytest tests/gpu/test_ddp_nccl_gpu.py -m gpu -q
    python tests/gpu/test_ddp_nccl_gpu.py              # the same, as a script

It starts ``torchrun --standalone --nproc_per_node=min(2, GPUs)`` (one rank on a 1-GPU node
is fine) and checks that the run reports ``nccl`` on ``cuda`` and finishes. The CPU unit
tests (tests/unit/scripts/test_scripts.py) pin their children to the CPU, so this is the only
test of the NCCL path. ``--selftest-cpu`` runs the same launcher and checks over gloo on the CPU
(``CUDA_VISIBLE_DEVICES=""``): `make gpu-check DRY_RUN=1` uses it as the CPU stand-in.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from helpers.launch import run_captured  # noqa: E402

pytestmark = pytest.mark.gpu
NO_GPU = "needs a CUDA GPU (torch.cuda.is_available() is False): run it on a GPU machine"
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)


def run_ddp(nproc: int, folder: Path, env: dict | None = None) -> tuple[dict, str]:
    """torchrun ddp_train.py for one short epoch; its JSON summary and its output."""
    summary = folder / "summary.json"
    done = run_captured(["torchrun", "--standalone", f"--nproc_per_node={nproc}",
                         str(ROOT / "scripts" / "ddp_train.py"), "--epochs", "1",
                         "--samples", "512", "--summary", str(summary)],
                        env={"OMP_NUM_THREADS": "1", **(env or {})}, timeout=300)
    assert done.returncode == 0, done.output
    return json.loads(summary.read_text()), done.output


def check(summary: dict, output: str, *, device: str, backend: str, world: int) -> None:
    assert (summary["device"], summary["backend"]) == (device, backend), summary
    assert summary["world_size"] == world and summary["finished"] is True, summary
    assert f"world size {world} on {device} ({backend})" in output, output
    assert "terminate called" not in output


@requires_cuda
def test_ddp_trains_over_nccl(tmp_path):
    world = min(2, torch.cuda.device_count())
    summary, output = run_ddp(world, tmp_path)
    check(summary, output, device="cuda", backend="nccl", world=world)
    print(f"DDP over NCCL: {world} rank(s), samples/s per rank {summary['samples_per_s']}")


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        if "--selftest-cpu" in argv:  # the same launcher and checks, gloo on the CPU
            summary, output = run_ddp(1, Path(tmp), env={"CUDA_VISIBLE_DEVICES": ""})
            check(summary, output, device="cpu", backend="gloo", world=1)
        elif not torch.cuda.is_available():
            print(f"skipped: {NO_GPU}")
            return 0
        else:
            world = min(2, torch.cuda.device_count())
            summary, output = run_ddp(world, Path(tmp))
            check(summary, output, device="cuda", backend="nccl", world=world)
        print(output)
        print(f"ok: world size {summary['world_size']} on {summary['device']} "
              f"({summary['backend']}), finished")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
