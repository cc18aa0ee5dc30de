"""The planner runs attention, autocast's type lists and RNNs as CUDA would (issue 32, 1).

Fake tensors report the CPU, so without this the plan keeps what the CPU's kernels keep: the
L x L attention matrix of the math path when there is dropout, low-precision outputs of ops
CUDA's autocast runs in float32, and no cuDNN reserve space for RNNs.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
from planner_common import SCRIPTS

from helpers.memory import cuda_dispatch
from helpers.memory.cuda_dispatch import sdpa_backend
from helpers.memory.planner import will_it_fit

ON = {"cudnn": True, "flash": True, "efficient": True, "math": True}


def _qkv(dtype=torch.bfloat16, head=64, heads=4, length=128, kv_heads=None):
    q = torch.empty(2, heads, length, head, dtype=dtype, device="meta")
    kv = torch.empty(2, kv_heads or heads, length, head, dtype=dtype, device="meta")
    return q, kv, kv


@pytest.mark.parametrize("cc, dtype, kw, expected", [
    ((8, 0), torch.bfloat16, {"dropout_p": 0.1}, "flash"),  # A100: flash keeps dropout
    ((8, 0), torch.float32, {}, "efficient"),  # flash is for 16-bit types only
    ((8, 0), torch.bfloat16, {"attn_mask": "mask"}, "efficient"),  # flash takes no mask
    ((7, 5), torch.float16, {"dropout_p": 0.1}, "efficient"),  # T4: no flash below sm80
    ((7, 5), torch.bfloat16, {}, "math"),  # T4: no bfloat16 in the efficient kernel
    ((9, 0), torch.bfloat16, {"is_causal": True}, "cudnn"),  # H100: cuDNN first
    ((8, 9), torch.bfloat16, {}, "flash"),  # L40S: cuDNN is not preferred there
])
def test_the_backend_is_the_one_cudas_rules_pick(cc, dtype, kw, expected):
    q, k, v = _qkv(dtype)
    if kw.get("attn_mask") == "mask":
        kw = dict(kw, attn_mask=torch.empty(128, 128, dtype=torch.bool, device="meta"))
    backend, why = sdpa_backend(q, k, v, cc=cc, switches=ON, requires_grad=True,
                                deterministic=False, **kw)
    assert backend == expected, why


def test_the_backend_respects_switches_and_head_size():
    q, k, v = _qkv(head=68)  # not a multiple of 8: neither cuDNN nor (on sm80) efficient
    assert sdpa_backend(q, k, v, cc=(9, 0), switches=ON, requires_grad=True,
                        deterministic=False)[0] == "flash"
    off = dict(ON, flash=False)
    backend, why = sdpa_backend(q, k, v, cc=(9, 0), switches=off, requires_grad=True,
                                deterministic=False)
    assert backend == "math" and "multiple of 8" in why
    assert sdpa_backend(q, k, v, cc=(8, 0), switches=dict(off, math=False),
                        requires_grad=True, deterministic=False)[0] == "error"


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_attention_with_dropout_keeps_no_lxl_matrix(in_tmp):
    """sdpa_dropout.py, bf16, dropout 0.1, on an A100: CUDA runs flash attention, which
    saves the output and the log-sum-exp. Pinning the math path (sdpa_kernel) brings back
    the B x H x L x L matrices: at least the softmax (2 bytes), dropout's mask (1) and the
    dropped probabilities (2) per element, for each of the 3 attention calls."""
    b, h, length = 2, 2, 512
    args = ["--batch-size", str(b), "--seq-len", str(length), "--d-model", "64",
            "--n-head", str(h), "--n-layer", "2"]
    path = str(SCRIPTS / "sdpa_dropout.py")
    flash = will_it_fit(path, args)
    math_ = will_it_fit(path, [*args, "--sdpa-backend", "math"])
    models = {d.model for d in flash.dispatch if d.op == "scaled_dot_product_attention"}
    assert models == {"CUDA's flash attention"}
    assert "the CPU would use its math path" in flash.dispatch[0].detail
    assert {d.model for d in math_.dispatch
            if d.op == "scaled_dot_product_attention"} == {"CUDA's math path"}
    lxl = b * h * length * length
    acts_flash = flash.categories["activations and temporaries"]
    acts_math = math_.categories["activations and temporaries"]
    assert acts_math - acts_flash >= 3 * lxl * 5
    assert acts_flash < 3 * lxl * 5  # all of flash's activations are less than those
    assert "flash attention" in flash.text()


GROUPNORM = textwrap.dedent("""\
    import torch
    from torch import nn

    norm = nn.GroupNorm(8, 64).cuda()
    opt = torch.optim.SGD(norm.parameters(), lr=0.1)
    x = torch.randn(16, 64, 32, 32).cuda().half()
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.float16):
            y = norm(x)
        y.sum().backward()
        del y
        opt.step()
        opt.zero_grad()
""")


def test_groupnorm_under_fp16_autocast_is_counted_in_float32(in_tmp):
    """CUDA's autocast runs group_norm in float32: the float16 input is copied to float32
    (saved for backward) and the output is float32. The CPU's autocast keeps both in
    float16 (2 bytes an element, no copy)."""
    (in_tmp / "gn.py").write_text(GROUPNORM)
    plan = will_it_fit(str(in_tmp / "gn.py"))
    n = 16 * 64 * 32 * 32
    (entry,) = [d for d in plan.dispatch if d.op == "group_norm"]
    assert entry.model == "float32 (CUDA autocast)" and entry.count == 2
    assert entry.extra_bytes == 2 * (4 * n + (4 - 2) * n)  # copy + wider output, per call
    # during the forward pass: x (float16), its float32 copy and the float32 output
    assert plan.phase_peaks["forward"] >= 2 * n + 4 * n + 4 * n
    assert [name for name, *_ in plan.autocast_differences] == ["group_norm"]


def test_the_diffusion_script_counts_groupnorm_in_float32(in_tmp):
    path = str(SCRIPTS / "groupnorm_amp.py")
    plan = will_it_fit(path)
    ops = {d.op for d in plan.dispatch}
    assert "group_norm" in ops
    assert "mse_loss" not in ops  # CPU autocast runs the losses in float32 too
    # 2 blocks x 2 norms + the output norm, in each of 2 forward passes
    assert sum(d.count for d in plan.dispatch if d.op == "group_norm") == 10


def test_lstm_keeps_cudnns_reserve_until_backward(in_tmp):
    """lstm_classifier.py (2 layers, hidden 128, 32 steps, batch 8, float32): the plan
    keeps cuDNN's reserve-space lower bound, 5 x hidden per layer, step and batch row, from
    the forward pass until backward has gone through the LSTM; with cudnn.enabled False
    (the script's --no-cudnn) there is none."""
    path = str(SCRIPTS / "lstm_classifier.py")
    plan = will_it_fit(path)
    native = will_it_fit(path, ["--no-cudnn"])
    reserve = 5 * 128 * 2 * 32 * 8 * 4
    (entry,) = [d for d in plan.dispatch if d.op == "lstm"]
    assert "lower bound" in entry.model and entry.extra_bytes == 2 * reserve
    assert plan.phase_peaks["forward"] - native.phase_peaks["forward"] == reserve
    # freed by backward: the optimizer step sees none of it
    assert plan.phase_peaks["optimizer"] == native.phase_peaks["optimizer"]
    assert torch.backends.cudnn.enabled  # the script's switch was put back


def test_reference_runs_keep_the_cpus_kernels(in_tmp):
    """fake=False runs real CPU kernels: nothing is modelled."""
    path = str(SCRIPTS / "lstm_classifier.py")
    assert will_it_fit(path, fake=False).dispatch == []


def test_the_plan_reports_each_model():
    assert cuda_dispatch.autocast_policy("group_norm") == "fp32"
    assert cuda_dispatch.autocast_policy("softmax") == "fp32_out"
    assert cuda_dispatch.autocast_policy("addcmul") == "promote"
    assert cuda_dispatch.autocast_policy("einsum") == "lower"
    assert cuda_dispatch.autocast_policy("max_pool3d") == "as_is"
    assert cuda_dispatch.autocast_policy("relu") is None
    assert cuda_dispatch.autocast_policy("cross_entropy") is None  # float32 on both


@pytest.mark.parametrize("name", sorted(cuda_dispatch.CPU_FP32_TOO - {"cdist", "prod"}))
def test_cpu_autocast_runs_the_shared_float32_losses_in_float32(name):
    """The ops left alone because CPU autocast already runs them in float32."""
    import torch.nn.functional as F

    h = torch.randn(4, 8)
    y, t = torch.randint(0, 8, (4,)), torch.rand(4, 8)
    extra = {"cross_entropy": (y,), "nll_loss": (y,), "multi_margin_loss": (y,),
             "multilabel_margin_loss": (torch.zeros(4, 8, dtype=torch.long),),
             "cosine_embedding_loss": (t, torch.ones(4)), "triplet_margin_loss": (t, t),
             "margin_ranking_loss": (t, torch.ones(4, 8))}.get(name, (t,))
    kwargs = {"reduction": "batchmean"} if name == "kl_div" else {}  # 'mean' warns
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = getattr(F, name)(torch.nn.functional.linear(h, torch.eye(8)), *extra, **kwargs)
    assert out.dtype == torch.float32
