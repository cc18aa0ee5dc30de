"""Rehearsal of the CUDA path of helpers.first_matmul_memory (lesson 04's real-GPU check).

On a CPU machine: ``torch.cuda`` is a SimulatedCuda whose memory figures come from a
VirtualGPU with ``workspaces=True`` counting the CPU tensors (its dispatch mode entered on
its own, so the helper does not take its virtual-GPU path), the CUDA device maps to the
CPU for the tensors, and PyTorch's workspace calls are stood in for: the helper must free
the cached workspaces, read the workspace size, and find the workspace in the peak and
after the product, through the CUDA memory counters.
"""

from __future__ import annotations

import pytest
import torch

import helpers
from helpers.memory import sources
from helpers.memory.cuda_standin import SimulatedCuda

HOPPER = 32 * 2**20


@pytest.fixture
def cuda_backed_by_virtual_gpu(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    gpu = helpers.VirtualGPU("H200", device="cpu", workspaces=True)
    original_init = sources.CudaSource.__init__

    def init_on_cpu(self, device=None):
        original_init(self, device)
        self.device = torch.device("cpu")  # where the rehearsal's tensors live

    monkeypatch.setattr(sources.CudaSource, "__init__", init_on_cpu)
    cleared = []
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces",
                        lambda: cleared.append(gpu.clear_workspaces()), raising=False)
    monkeypatch.setattr(torch.backends.cuda, "cublas_workspace_size", lambda: HOPPER)
    with SimulatedCuda(gpu) as cuda:
        gpu.engine.__enter__()  # count tensors without making the virtual GPU current
        try:
            yield gpu, cuda, cleared
        finally:
            gpu.engine.__exit__(None, None, None)


def test_cuda_path_finds_the_workspace_through_the_cuda_counters(cuda_backed_by_virtual_gpu):
    gpu, cuda, cleared = cuda_backed_by_virtual_gpu
    torch.randn(4, 4) @ torch.randn(4, 4)  # an earlier product left a workspace
    assert gpu.workspace_bytes == HOPPER
    probe = helpers.first_matmul_memory("cuda", n=128)
    assert cleared == [HOPPER]  # freed first, so the probe's product allocates one
    assert probe.source == "cuda:0" and probe.workspace_bytes == HOPPER
    assert probe.output_bytes == 128 * 128 * 4
    assert probe.peak_extra_bytes == probe.held_extra_bytes == HOPPER
    names = [entry[0] for entry in cuda.log]
    assert "reset_peak_memory_stats" in names and "max_memory_allocated" in names
    assert names.index("synchronize") < names.index("reset_peak_memory_stats")


def test_cuda_path_without_the_size_binding_reports_unknown(cuda_backed_by_virtual_gpu,
                                                            monkeypatch):
    def missing():
        raise AttributeError("module 'torch._C' has no attribute '_cuda_getCublasWorkspaceSize'")

    monkeypatch.setattr(torch.backends.cuda, "cublas_workspace_size", missing)
    probe = helpers.first_matmul_memory("cuda", n=64)
    assert probe.workspace_bytes is None and probe.peak_extra_bytes == HOPPER
    assert "cuBLAS workspace: unknown" in str(probe)


# ------------------------------------------------- the real card's size, for a virtual GPU
@pytest.mark.parametrize(("capability", "expected"), [((9, 0), HOPPER), ((8, 0), 8_519_680)])
def test_cublas_workspace_bytes_without_the_binding_follows_the_card(monkeypatch, capability,
                                                                     expected):
    """torch 2.11 (the first GPU node's) has no cublas_workspace_size: the size then comes from
    the card's compute capability, as PyTorch picks it (review R4: test_batch_size_gpu's
    virtual side needs the real card's workspaces)."""
    from helpers.memory.workspaces import cublas_workspace_bytes

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delattr(torch.backends.cuda, "cublas_workspace_size", raising=False)
    with SimulatedCuda("H200", capability=capability):
        assert cublas_workspace_bytes() == expected
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:2")
        assert cublas_workspace_bytes("cuda:0") == 8 * 2**20


def test_cublas_workspace_bytes_takes_torchs_own_answer(monkeypatch):
    from helpers.memory.workspaces import cublas_workspace_bytes

    monkeypatch.setattr(torch.backends.cuda, "cublas_workspace_size", lambda: 12345,
                        raising=False)
    with SimulatedCuda("H200", capability=(8, 6)):
        assert cublas_workspace_bytes() == 12345
