"""VirtualGPU(workspaces=True): cuBLAS and cuDNN workspaces, charged as PyTorch charges them.

The default (``workspaces=False``) must not change a byte: the other lessons store exact
figures. With workspaces on, the first matrix product on a thread allocates one cuBLAS
workspace of the documented size, held afterwards; the backward pass has its own; a
convolution takes its cuDNN allowance for the call only.
"""

import pytest
import torch
from torch import nn

import helpers
from helpers.memory.workspaces import (
    DEFAULT_CUDNN_WORKSPACE,
    default_cublas_workspace,
    parse_cublas_workspace_config,
)

KiB, MiB = 2**10, 2**20
PRE_HOPPER = 4096 * KiB * 2 + 16 * KiB * 8  # PyTorch's ":4096:2:16:8"
HOPPER = 32 * MiB


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("CUDNN_CONV_WSCAP_DBG", raising=False)


def nbytes(*tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def mlp_step(gpu):
    """A forward and backward pass of a two-layer MLP inside ``gpu``; returns the model."""
    torch.manual_seed(0)
    with gpu:
        model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
        model(torch.randn(32, 64)).sum().backward()
    return model


# ---------------------------------------------------------------- default: nothing changes
def test_default_charges_no_workspace_and_keeps_exact_bytes(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "not read when workspaces are off")
    gpu = helpers.VirtualGPU("L40S", device="cpu")
    assert gpu.workspaces is None and gpu.workspace_bytes == 0 and gpu.cudnn_fallbacks == 0
    with gpu:
        a, b = torch.randn(64, 64), torch.randn(64, 64)
        c = a @ b
        assert gpu.allocated_bytes == nbytes(a, b, c)
        assert gpu.allocated_bytes == gpu.live_tensor_bytes
    assert "workspace" not in gpu.summary()
    assert gpu.clear_workspaces() == 0


def test_default_step_is_unchanged_by_the_feature():
    plain = helpers.VirtualGPU("L40S", rounding=True, device="cpu")
    mlp_step(plain)
    on = helpers.VirtualGPU("L40S", rounding=True, device="cpu", workspaces=True)
    mlp_step(on)
    # tensors are the same; only the two workspaces (forward, backward) differ
    assert on.live_tensor_bytes == plain.live_tensor_bytes
    assert on.allocated_bytes - plain.allocated_bytes == 2 * PRE_HOPPER
    assert on.peak_allocated_bytes - plain.peak_allocated_bytes == 2 * PRE_HOPPER


# ---------------------------------------------------------------- cuBLAS
def test_first_matmul_adds_the_workspace_once_not_per_matmul():
    gpu = helpers.VirtualGPU("L40S", device="cpu", workspaces=True)
    with gpu:
        a, b = torch.randn(64, 64), torch.randn(64, 64)
        before = gpu.allocated_bytes
        c = a @ b
        assert gpu.allocated_bytes - before == nbytes(c) + PRE_HOPPER
        assert gpu.workspace_bytes == PRE_HOPPER
        d = c @ b
        e = torch.addmm(d, a, b)
        assert gpu.allocated_bytes == nbytes(a, b, c, d, e) + PRE_HOPPER
        del c, d, e
        assert gpu.allocated_bytes == nbytes(a, b) + PRE_HOPPER  # held after the tensors go
        assert gpu.reserved_bytes == gpu.allocated_bytes  # exact allocator: no cache
        assert gpu.live_tensor_bytes == nbytes(a, b)  # a workspace is not a tensor
    assert "cuBLAS workspaces 8.12 MiB" in gpu.summary()


def test_non_matmul_ops_allocate_no_workspace():
    gpu = helpers.VirtualGPU("L40S", device="cpu", workspaces=True)
    with gpu:
        x = torch.randn(1000)
        y = (x * 2).relu().sum()
    assert gpu.workspace_bytes == 0 and y.ndim == 0


def test_backward_pass_holds_a_second_workspace_and_later_steps_none():
    gpu = helpers.VirtualGPU("L40S", device="cpu", workspaces=True)
    model = mlp_step(gpu)
    assert sorted(gpu.workspaces.held)[0] == "backward" and len(gpu.workspaces.held) == 2
    assert gpu.workspace_bytes == 2 * PRE_HOPPER
    held = gpu.allocated_bytes
    with gpu:
        model.zero_grad(set_to_none=False)
        model(torch.randn(32, 64)).sum().backward()
    assert gpu.workspace_bytes == 2 * PRE_HOPPER
    assert gpu.allocated_bytes == held


def test_caching_allocator_puts_the_workspace_in_a_20_mib_segment():
    # what pytorch/pytorch issue 95668 showed on an A10G: 8,519,680 bytes allocated in a
    # 20 MiB segment after one nn.Linear forward
    gpu = helpers.VirtualGPU("L40S", rounding=True, device="cpu", workspaces=True)
    with gpu:
        torch.randn(1, 1) @ torch.randn(1, 1)
        assert gpu.workspace_bytes == 8_519_680
        assert gpu.reserved_bytes == 20 * MiB + 2 * MiB  # workspace segment + small pool


@pytest.mark.parametrize("card, size", [
    ("H200", HOPPER), ("H100-80GB", HOPPER), ("L40S", PRE_HOPPER), ("A100-80GB", PRE_HOPPER),
    ("T4", PRE_HOPPER), ("24 GiB", PRE_HOPPER),
])
def test_default_size_follows_the_cards_compute_capability(card, size):
    gpu = helpers.VirtualGPU(card, device="cpu", workspaces=True)
    assert gpu.workspaces.cublas_bytes == size
    with gpu:
        torch.randn(2, 2) @ torch.randn(2, 2)
    assert gpu.workspace_bytes == size


def test_default_sizes_match_pytorch_source():
    assert default_cublas_workspace((9, 0)) == 4096 * 8 * 1024
    assert default_cublas_workspace((8, 9)) == 4096 * 1024 * 2 + 16 * 1024 * 8 == 8_519_680
    assert default_cublas_workspace(None) == 8_519_680
    assert default_cublas_workspace((10, 0)) == HOPPER


@pytest.mark.parametrize("text, size", [
    (":4096:8", 32 * MiB), (":4096:2:16:8", PRE_HOPPER), (":16:8", 128 * KiB),
    (":0:0", 0), (" :4096:1 ", 4 * MiB), (":1:1:1:1:1:1", 3 * KiB),
])
def test_cublas_workspace_config_pairs_are_summed(text, size):
    assert parse_cublas_workspace_config(text) == size


@pytest.mark.parametrize("text", ["", "4096:8", ":4096", ":4096:8:", "32MiB", ":a:b",
                                  ":4096:-8", ":4096:8,:16:8"])
def test_bad_cublas_workspace_config_names_the_variable(text):
    with pytest.raises(ValueError, match="CUBLAS_WORKSPACE_CONFIG"):
        parse_cublas_workspace_config(text)


def test_cublas_workspace_config_must_be_text():
    with pytest.raises(TypeError, match="CUBLAS_WORKSPACE_CONFIG"):
        parse_cublas_workspace_config(4096)


def test_environment_sets_the_size(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:1")
    gpu = helpers.VirtualGPU("H200", device="cpu", workspaces=True)
    assert gpu.workspaces.cublas_bytes == 4 * MiB
    assert gpu.workspaces.sources["cublas"] == "CUBLAS_WORKSPACE_CONFIG=:4096:1"
    with gpu:
        torch.randn(2, 2) @ torch.randn(2, 2)
    assert gpu.workspace_bytes == 4 * MiB


def test_bad_environment_value_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "4096:8")
    with pytest.raises(ValueError, match=r"CUBLAS_WORKSPACE_CONFIG='4096:8'.*:SIZE:COUNT"):
        helpers.VirtualGPU("L40S", device="cpu", workspaces=True)


def test_argument_wins_over_environment(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    gpu = helpers.VirtualGPU("L40S", device="cpu", workspaces=True, cublas_workspace="1 MiB")
    assert gpu.workspaces.cublas_bytes == MiB


def test_zero_workspace_config_holds_nothing(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    gpu = helpers.VirtualGPU("L40S", device="cpu", workspaces=True)
    with gpu:
        a = torch.randn(8, 8)
        b = a @ a
        assert gpu.allocated_bytes == nbytes(a, b)


def test_clear_workspaces_frees_them_and_the_next_matmul_allocates_again():
    gpu = helpers.VirtualGPU("L40S", device="cpu", workspaces=True)
    with gpu:
        a = torch.randn(8, 8)
        b = a @ a
        assert gpu.clear_workspaces() == PRE_HOPPER
        assert gpu.allocated_bytes == nbytes(a, b) and gpu.workspace_bytes == 0
        c = b @ a
        assert gpu.allocated_bytes == nbytes(a, b, c) + PRE_HOPPER


def test_out_of_memory_includes_the_workspace():
    # the tensors fit; the workspace of the first matmul does not
    gpu = helpers.VirtualGPU("8 MiB", device="cpu", workspaces=True)
    with gpu:
        a = torch.randn(256, 256)  # 256 KiB
        with pytest.raises(torch.OutOfMemoryError,
                           match=r"Tried to allocate 8\.12 MiB.*raised by aten\.mm"):
            a @ a
    assert gpu.n_oom == 1 and gpu.workspace_bytes == 0
    assert gpu.allocated_bytes == nbytes(a)  # the failed product's output was dropped
    with helpers.VirtualGPU("8 MiB", device="cpu") as plain:  # without: it fits
        b = torch.randn(256, 256)
        b @ b
    assert plain.n_oom == 0


def test_fake_tensors_are_charged_too():
    with helpers.VirtualGPU("H200", fake=True, device="cpu", workspaces=True) as gpu:
        w = torch.randn(16384, 16384)
        w @ w
    assert gpu.workspace_bytes == HOPPER


# ---------------------------------------------------------------- cuDNN
def conv_run(gpu):
    torch.manual_seed(0)
    with gpu:
        conv = nn.Conv2d(3, 8, 3)
        x = torch.randn(4, 3, 32, 32, requires_grad=True)
        after_forward = gpu.allocated_bytes
        y = conv(x)
        forward = gpu.peak_allocated_bytes, gpu.allocated_bytes - after_forward
        gpu.reset_peak()
        y.sum().backward()
        backward = gpu.peak_allocated_bytes
    return forward, backward, gpu


def test_cudnn_allowance_is_transient_during_forward_and_backward():
    (peak0, out0), back0, plain = conv_run(helpers.VirtualGPU("L40S", device="cpu"))
    (peak1, out1), back1, on = conv_run(
        helpers.VirtualGPU("L40S", device="cpu", workspaces=True))
    assert on.workspaces.cudnn_bytes == DEFAULT_CUDNN_WORKSPACE == 64 * MiB
    assert peak1 - peak0 == DEFAULT_CUDNN_WORKSPACE  # there during the forward convolution
    assert back1 - back0 == DEFAULT_CUDNN_WORKSPACE  # and during its backward
    assert out1 == out0  # gone after: the output is all that stays
    assert on.allocated_bytes == plain.allocated_bytes and on.workspace_bytes == 0
    assert on.cudnn_fallbacks == 0


def test_cudnn_allowance_from_argument_and_environment(monkeypatch):
    gpu = helpers.VirtualGPU("L40S", device="cpu", workspaces=True, cudnn_workspace="16 MiB")
    assert gpu.workspaces.cudnn_bytes == 16 * MiB
    monkeypatch.setenv("CUDNN_CONV_WSCAP_DBG", "256")
    gpu = helpers.VirtualGPU("L40S", device="cpu", workspaces=True)
    assert gpu.workspaces.cudnn_bytes == 256 * MiB
    assert gpu.workspaces.sources["cudnn"] == "CUDNN_CONV_WSCAP_DBG=256"
    (peak, _), _, _ = conv_run(gpu)
    (peak0, _), _, _ = conv_run(helpers.VirtualGPU("L40S", device="cpu"))
    assert peak - peak0 == 256 * MiB


@pytest.mark.parametrize("value", ["64MiB", "-1", "1.5", ""])
def test_bad_cudnn_cap_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("CUDNN_CONV_WSCAP_DBG", value)
    with pytest.raises(ValueError, match="CUDNN_CONV_WSCAP_DBG"):
        helpers.VirtualGPU("L40S", device="cpu", workspaces=True)


def test_cudnn_allowance_that_does_not_fit_falls_back_without_an_error():
    # PyTorch tries a cuDNN engine with less workspace when the workspace does not fit
    gpu = helpers.VirtualGPU("32 MiB", device="cpu", workspaces=True)
    conv_run(gpu)
    assert gpu.cudnn_fallbacks == 2 and gpu.n_oom == 0  # forward and backward


def test_matmul_inside_conv_model_charges_both():
    (_, _), _, gpu = conv_run(helpers.VirtualGPU("L40S", device="cpu", workspaces=True))
    assert gpu.workspace_bytes == 0  # a convolution is not a cuBLAS product
    with gpu:
        torch.randn(2, 2) @ torch.randn(2, 2)
    assert gpu.workspace_bytes == PRE_HOPPER


# ---------------------------------------------------------------- arguments
def test_workspaces_must_be_a_bool():
    with pytest.raises(TypeError, match="workspaces"):
        helpers.VirtualGPU("L40S", workspaces="yes")


@pytest.mark.parametrize("name", ["cublas_workspace", "cudnn_workspace"])
def test_sizes_are_validated_and_named(name):
    with pytest.raises(ValueError, match=name):
        helpers.VirtualGPU("L40S", workspaces=True, **{name: -1})
    with pytest.raises(TypeError, match=name):
        helpers.VirtualGPU("L40S", workspaces=True, **{name: True})
    with pytest.raises(ValueError, match=f"{name} needs workspaces=True"):
        helpers.VirtualGPU("L40S", **{name: "1 MiB"})


# ---------------------------------------------------------------- first_matmul_memory
def test_first_matmul_memory_measures_the_workspace_on_a_virtual_gpu():
    with helpers.VirtualGPU("L40S", rounding=True, device="cpu", workspaces=True) as gpu:
        torch.randn(2, 2) @ torch.randn(2, 2)  # a workspace already held: it is cleared first
        probe = helpers.first_matmul_memory(n=256)
        assert gpu.workspace_bytes == PRE_HOPPER
    assert probe.workspace_bytes == probe.peak_extra_bytes == probe.held_extra_bytes == PRE_HOPPER
    assert probe.output_bytes == 256 * 256 * 4 and probe.source == "virtual GPU L40S"
    assert "8,519,680 bytes" in str(probe)


def test_first_matmul_memory_without_workspaces_finds_none():
    with helpers.VirtualGPU("L40S", device="cpu"):
        probe = helpers.first_matmul_memory(n=64)
    assert probe.workspace_bytes == probe.peak_extra_bytes == probe.held_extra_bytes == 0


def test_first_matmul_memory_needs_a_gpu_and_a_sane_size():
    with pytest.raises(ValueError, match="needs a CUDA device or an active"):
        helpers.first_matmul_memory("cpu")
    with helpers.VirtualGPU("L40S", device="cpu"):
        with pytest.raises(TypeError, match="n must be a whole number"):
            helpers.first_matmul_memory(n=1.5)
        with pytest.raises(ValueError, match="n must be at least 1"):
            helpers.first_matmul_memory(n=0)


# ---------------------------------------------------------------- measure_step agrees
def measured(gpu, make_model, x, *, steps=2):
    """measure_step of an Adam training step of ``make_model()`` on ``x`` inside ``gpu``."""
    torch.manual_seed(0)
    with gpu:
        model = make_model()
        opt = torch.optim.Adam(model.parameters())
        x = x.clone()

        def step():
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()

        gpu.reset_peak()
        return helpers.measure_step(step, model=model, optimizer=opt, inputs=x, steps=steps)


def mlp():
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))


def cnn():  # convolutions only: no matrix product, so no cuBLAS workspace
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3))


def columns_add_up(report, categories):
    cols = report.timeline.columns
    for i in range(len(report.timeline)):
        assert cols["total"][i] == sum(cols[c][i] for c in categories)


@pytest.mark.parametrize("rounding", [False, True])
def test_measure_step_peak_is_the_virtual_gpus_peak_with_cublas_workspaces(rounding):
    x = torch.randn(32, 64)
    plain = measured(helpers.VirtualGPU("L40S", device="cpu", rounding=rounding), mlp, x)
    gpu = helpers.VirtualGPU("L40S", device="cpu", rounding=rounding, workspaces=True)
    report = measured(gpu, mlp, x)
    # the report's peak is tensors + workspaces: with exact accounting, the device's peak
    if not rounding:
        assert report.peak_bytes == gpu.peak_allocated_bytes
    assert report.peak_allocated_bytes == gpu.peak_allocated_bytes
    assert report.peak_reserved_bytes == gpu.peak_reserved_bytes
    # forward and backward each hold one; the steady state is the plain one plus both
    assert report.category_max["workspace"] == report.at_peak["workspace"] == 2 * PRE_HOPPER
    assert report.workspace_bytes == 2 * PRE_HOPPER
    assert report.steps[1].peak_bytes - plain.steps[1].peak_bytes == 2 * PRE_HOPPER
    assert report.timeline.columns["workspace"][0] == 0  # none before the first product
    columns_add_up(report, (*helpers.memory.report.CATEGORIES, "workspace"))
    assert "library workspaces (cuBLAS, cuDNN)" in report.text()
    assert "workspace" in report.timeline.to_csv().splitlines()[0]


@pytest.mark.parametrize("rounding", [False, True])
def test_measure_step_peak_includes_the_transient_cudnn_allowance(rounding):
    x = torch.randn(4, 3, 32, 32)
    gpu = helpers.VirtualGPU("L40S", device="cpu", rounding=rounding, workspaces=True)
    report = measured(gpu, cnn, x)
    if not rounding:
        assert report.peak_bytes == gpu.peak_allocated_bytes
    assert report.peak_allocated_bytes == gpu.peak_allocated_bytes
    assert report.at_peak["workspace"] == report.category_max["workspace"] \
        == DEFAULT_CUDNN_WORKSPACE  # the allowance only, while a convolution runs
    assert report.peak_op.startswith("convolution")
    ws = report.timeline.columns["workspace"]
    assert set(ws) == {0, DEFAULT_CUDNN_WORKSPACE}  # transient: back to 0 between them
    assert ws[-1] == 0 and gpu.workspace_bytes == 0
    columns_add_up(report, (*helpers.memory.report.CATEGORIES, "workspace"))
    fig = report.plot_timeline()  # the workspace is drawn as one more layer
    assert "library workspaces (cuBLAS, cuDNN)" in [t.get_text() for t in
                                                     fig.axes[0].get_legend().get_texts()]


def test_measure_step_leaves_out_an_allowance_that_fell_back():
    gpu = helpers.VirtualGPU("32 MiB", device="cpu", workspaces=True)
    report = measured(gpu, cnn, torch.randn(4, 3, 32, 32), steps=1)
    assert gpu.cudnn_fallbacks > 0 and report.category_max["workspace"] == 0
    assert report.peak_bytes == gpu.peak_allocated_bytes
    assert "library workspaces" in report.text()  # modelled, and none was charged


def test_measure_step_counts_a_workspace_held_before_it():
    gpu = helpers.VirtualGPU("L40S", device="cpu", workspaces=True)
    with gpu:
        torch.randn(2, 2) @ torch.randn(2, 2)  # the forward thread's workspace, held
    report = measured(gpu, mlp, torch.randn(32, 64), steps=1)
    assert report.timeline.columns["workspace"][0] == PRE_HOPPER
    assert report.peak_bytes == gpu.peak_allocated_bytes


@pytest.mark.parametrize("make_model, shape", [(mlp, (32, 64)), (cnn, (4, 3, 32, 32))])
def test_measure_step_without_workspaces_has_no_workspace_anywhere(make_model, shape):
    gpu = helpers.VirtualGPU("L40S", device="cpu")
    report = measured(gpu, make_model, torch.randn(*shape))
    assert report.peak_bytes == gpu.peak_allocated_bytes
    assert tuple(report.category_max) == tuple(report.at_peak) \
        == helpers.memory.report.CATEGORIES
    assert "workspace" not in report.timeline.names and "workspace" not in report.text()
    assert "workspace" not in str(report.to_dict()) and report.workspace_bytes == 0
    columns_add_up(report, helpers.memory.report.CATEGORIES)


class ConvNet(nn.Module):
    """Convolutions (optionally checkpointed, recomputed in backward) and a linear head."""

    def __init__(self, checkpoint=False):
        super().__init__()
        self.checkpoint = checkpoint
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        if self.checkpoint:
            from torch.utils.checkpoint import checkpoint_sequential

            h = checkpoint_sequential(self.body, 2, x, use_reentrant=False)
        else:
            h = self.body(x)
        return self.head(h.mean((2, 3)))


@pytest.mark.parametrize("checkpoint", [False, True])
def test_workspaces_add_to_every_point_of_a_steady_step_exactly(checkpoint):
    # Pins what a workspace does to a report: at every point of a steady step the total is
    # the plain one + both held cuBLAS workspaces, + the cuDNN allowance only at a
    # convolution (forward, backward, recomputed). A peak at another operation (a ReLU's
    # backward, say) rises by the held workspaces alone.
    x = torch.randn(4, 3, 16, 16)
    plain = measured(helpers.VirtualGPU("L40S", device="cpu"), lambda: ConvNet(checkpoint), x)
    gpu = helpers.VirtualGPU("L40S", device="cpu", workspaces=True,
                             cublas_workspace="1 MiB", cudnn_workspace="3 MiB")
    report = measured(gpu, lambda: ConvNet(checkpoint), x)
    assert report.peak_bytes == gpu.peak_allocated_bytes
    a, b = plain.timeline.columns, report.timeline.columns
    assert a["op"] == b["op"]  # the same points
    steady = [i for i, s in enumerate(b["step"]) if s == 2]
    for i in steady:
        assert b["total"][i] - a["total"][i] == b["workspace"][i] in (2 * MiB, 5 * MiB)
    # the allowance: at the point after each convolution's outputs, and nowhere else
    convs = [b["op"][i] for i in steady if b["workspace"][i] == 5 * MiB]
    assert all(op.startswith("convolution") for op in convs)
    # 2 forward, 2 backward, + the first segment's one recomputed (the last segment of
    # checkpoint_sequential is not checkpointed)
    assert len(convs) == (5 if checkpoint else 4)


def test_cublas_workspace_bytes_needs_a_cuda_device():
    from helpers.memory.workspaces import cublas_workspace_bytes

    with pytest.raises(ValueError, match="device"):
        cublas_workspace_bytes("cpu")
    with pytest.raises(TypeError, match="device"):
        cublas_workspace_bytes(3.5)
