"""GPU checks of ``helpers.find_batch_size`` on a real CUDA device.

On a machine with a CUDA GPU::

    python -m pytest tests/gpu/test_batch_size_gpu.py -m gpu -q

The card is capped with ``torch.cuda.set_per_process_memory_fraction`` so that the search
ends at a few GiB, in seconds, whatever the card. Checked:

1. The answer runs (two steps at it raise no out-of-memory error), fits the budget, and the
   search closed (a size within 1 % above it did not fit); memory is back to where it was
   (``memory_allocated`` equal, ``memory_reserved`` no larger) and the model is unchanged;
   each trial's reserved peak is at least its allocated one (both read through
   ``helpers.memory.sources.CudaSource``).
2. The virtual GPU (CUDA-like allocator, the same capacity, the card's two cuBLAS
   workspaces) predicts the same answer within 5 %: the lesson's virtual searches stand for
   real ones.

Without a GPU the tests skip with the reason.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import helpers  # noqa: E402
from helpers.memory.errors import warm_up_cuda  # noqa: E402
from helpers.memory.workspaces import cublas_workspace_bytes  # noqa: E402

pytestmark = pytest.mark.gpu
NO_GPU = "needs a CUDA GPU (torch.cuda.is_available() is False): run it on a GPU machine"
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
CAP = 2 * 2**30  # what the allocator may reserve


def task(device):
    torch.manual_seed(0)
    model = helpers.MLP(512, 1024, 6, 10).to(device)
    optimizer = torch.optim.Adam(model.parameters())

    def step(b):
        x = torch.randn(b, 512, device=device)
        y = torch.randint(0, 10, (b,), device=device)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    return model, optimizer, step


@pytest.fixture
def capped_gpu():
    total = torch.cuda.mem_get_info()[1]
    torch.cuda.set_per_process_memory_fraction(CAP / total)
    gc.collect()
    torch.cuda.empty_cache()
    yield
    torch.cuda.set_per_process_memory_fraction(1.0)
    gc.collect()
    torch.cuda.empty_cache()


@requires_cuda
def test_finder_on_a_capped_gpu(capped_gpu):
    model, opt, step = task("cuda")
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    # cuBLAS's workspaces (made by the first matmul, forward and backward) are never freed:
    # read the baseline after them, as the finder does
    warm_up_cuda()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    r = helpers.find_batch_size(step, model=model, optimizer=opt, margin=0)
    print(r)
    assert r.device.startswith("cuda:0")
    assert r.capacity_bytes < torch.cuda.mem_get_info()[1]  # the cap, not the card
    assert r.trial(r.batch_size).fits and any(t.oom for t in r.trials)
    # read through helpers.memory.sources: what nvidia-smi shows includes the cache
    assert all(t.reserved_bytes >= t.peak_bytes for t in r.trials if t.fits)
    assert r.smallest_too_big - r.batch_size <= max(8, 0.01 * r.batch_size)
    assert torch.cuda.memory_allocated() == allocated
    assert torch.cuda.memory_reserved() <= reserved + 2 * 2**20
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved[k]), k
    for _ in range(2):  # the answer really runs
        step(r.batch_size)
    torch.cuda.synchronize()


@requires_cuda
def test_virtual_gpu_predicts_the_real_answer(capped_gpu):
    model, opt, step = task("cuda")
    other = torch.cuda.mem_get_info()[1] - torch.cuda.mem_get_info()[0] \
        - torch.cuda.memory_reserved()
    real = helpers.find_batch_size(step, model=model, optimizer=opt, margin=0)
    del model, opt, step
    gc.collect()
    torch.cuda.empty_cache()
    # the real search's cuBLAS workspaces (forward, and autograd's device thread) are made
    # inside the cap: the virtual card holds the same two, at this card's size (review R4)
    workspace = cublas_workspace_bytes("cuda:0")
    with helpers.VirtualGPU(CAP + other, rounding=True, context_bytes=other, fake=True,
                            device="cpu", workspaces=True, cublas_workspace=workspace):
        model, opt, step = task("cpu")
        virtual = helpers.find_batch_size(step, model=model, optimizer=opt, margin=0)
    print(f"real GPU: {real.batch_size}, virtual GPU: {virtual.batch_size}")
    assert abs(real.batch_size - virtual.batch_size) <= 0.05 * real.batch_size
