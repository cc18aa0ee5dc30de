"""GPU checks of lesson 08's checker: the real allocator, capped to an L40S, agrees with the
virtual L40S.

    python -m pytest tests/gpu/test_oom_gpu.py -m gpu -q

On a CUDA GPU with at least an L40S's memory (46068 MiB), ``helpers.check_training`` trains
the real ResNet-200 on the real GPU with ``torch.cuda.set_per_process_memory_fraction``
capping PyTorch's allocator at what an L40S leaves after the CUDA context. Checked: the
workshop's script (batch 256) runs out of memory and batch 32 fits, as on the virtual L40S;
the memory the real allocator reserved at batch 32's peak is within 15 % of the virtual
prediction (each without its context: the real one measured, the virtual 500 MiB); the cap
is lifted and the memory given back afterwards (from a baseline read after cuBLAS's
workspaces exist). Without such a GPU the tests skip with the reason.
"""

import gc

import pytest
import torch

import helpers
from helpers.memory.errors import warm_up_cuda
from helpers.oom import CONTEXT
from helpers.oom import original_step as original

pytestmark = pytest.mark.gpu

L40S = helpers.KNOWN_GPUS["L40S"]


def large_enough() -> bool:
    return (torch.cuda.is_available()
            and torch.cuda.get_device_properties(0).total_memory >= L40S)


requires_big_gpu = pytest.mark.skipif(
    not large_enough(), reason="needs a CUDA GPU with at least an L40S's 46068 MiB")


@requires_big_gpu
def test_the_real_gpu_agrees_with_the_virtual_l40s():
    device = torch.device("cuda", 0)
    # cuBLAS's workspaces (made by the first matmul, forward and backward) are never freed:
    # read the baseline after them
    warm_up_cuda(device)
    before = torch.cuda.memory_allocated(device)
    crash = helpers.check_training(original, batch_size=256, device=device, small_steps=1)
    # torch.OutOfMemoryError, or cuBLAS's/cuDNN's own allocation failure near the cap
    assert not crash.fits and helpers.is_oom_error(RuntimeError(crash.oom)), crash.oom
    assert "real allocator capped" in crash.source
    gc.collect()
    torch.cuda.empty_cache()
    # what the allocator does not manage: the real CUDA context, other processes, a
    # TensorFlow pool left by an earlier test; the checker counts it in the peak
    free, total = torch.cuda.mem_get_info(device)
    outside = total - free - torch.cuda.memory_reserved(device)
    fits = helpers.check_training(original, batch_size=32, device=device, small_steps=1)
    assert fits.passed, fits.text()
    virtual = helpers.check_training(original, batch_size=32, device="cpu", small_steps=1)
    real_reserved = fits.peak_bytes - outside
    virtual_reserved = virtual.peak_bytes - helpers.parse_capacity(CONTEXT)
    print(f"batch 32, reserved by the allocator at the peak: real "
          f"{helpers.fmt_bytes(real_reserved)}, virtual {helpers.fmt_bytes(virtual_reserved)} "
          f"(real context and other memory {helpers.fmt_bytes(outside)})")
    assert abs(real_reserved - virtual_reserved) < 0.15 * virtual_reserved
    gc.collect()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_allocated(device) == before
    # the cap is lifted: a tensor larger than an L40S's share can be made again
    if torch.cuda.mem_get_info(device)[0] > L40S + 2**30:
        big = torch.empty(L40S // 4 + 2**28, dtype=torch.float32, device=device)
        del big
