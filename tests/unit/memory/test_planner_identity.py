"""The planner keeps the script's objects as CUDA does (issue 32, defect 2 and its "Also"):
a module's move keeps its Parameter objects, so tied weights are counted once and an
optimizer built before ``.cuda()`` keeps its state; chained and repeated moves plan; tensors
on the card answer ``device``/``is_cuda`` as on a GPU; the default device; buffers; and
``nn.DataParallel``. Each plan is compared with hand-computed bytes or with a real CPU run
(``fake=False``) to the byte."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from planner_common import round512, write

from helpers.memory import planner
from helpers.memory.planner import PlanError, will_it_fit


def same_as_real(script, args=()):
    """The fake plan, after checking it against a real CPU run, byte for byte."""
    fake, real = will_it_fit(script, list(args)), will_it_fit(script, list(args), fake=False)
    assert fake.peak_allocated_bytes == real.peak_allocated_bytes
    assert fake.categories == real.categories
    assert fake.peak_line == real.peak_line
    return fake


# ------------------------------------------------------------------ Parameter identity
TIED = """\
import torch
from torch import nn

V, D = 1000, 64
class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.emb.weight          # tied: one Parameter
    def forward(self, idx):
        return self.head(self.emb(idx))

model = LM().cuda()
opt = torch.optim.Adam(model.parameters())
for _ in range(3):
    idx = torch.randint(0, V, (2, 8), device="cuda")
    loss = model(idx).float().logsumexp(-1).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_tied_weights_are_counted_once(tmp_path):
    """One 1000 x 64 float32 weight in two modules: 256,000 bytes of parameters, of
    gradients, and twice that of Adam's moments (main counted the parameters twice)."""
    plan = same_as_real(write(tmp_path, TIED))
    weight = 1000 * 64 * 4
    assert plan.categories["parameters"] == weight
    assert plan.categories["optimizer state"] == 2 * weight
    assert plan.parameter_bytes == weight


OPT_BEFORE = """\
import torch
from torch import nn

model = nn.Linear(256, 256)
{first}
{second}
w = model.weight
for _ in range(3):
    x = torch.randn(4, 256).cuda()
    loss = model(x).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
assert model.weight is w and opt.param_groups[0]["params"][0] is w
"""


def test_an_optimizer_built_before_cuda_keeps_its_state(tmp_path):
    """Adam built before ``model.cuda()``: its two moments are on the card (main lost them:
    the optimizer held the replaced host Parameters). At the peak (Adam's foreach square
    root in the 2nd step): parameters P, gradients P, moments 2P, the square roots P,
    the batch and the loss; exactly as with the optimizer built after the move."""
    opt = "opt = torch.optim.Adam(model.parameters())"
    before = will_it_fit(write(tmp_path, OPT_BEFORE.format(first=opt, second="model.cuda()"),
                               "before.py"))
    after = will_it_fit(write(tmp_path, OPT_BEFORE.format(first="model.cuda()", second=opt),
                              "after.py"))
    p = (256 * 256 + 256) * 4
    assert before.categories["parameters"] == before.categories["gradients"] == p
    assert before.categories["optimizer state"] == 2 * p
    blocks = round512(256 * 256 * 4) + round512(256 * 4)
    assert before.peak_allocated_bytes == 5 * blocks + round512(4 * 256 * 4) + 512
    assert before.peak_allocated_bytes == after.peak_allocated_bytes
    assert before.categories == after.categories


# ------------------------------------------------------------------ moves that crashed
MODEL = """\
import torch
from torch import nn

def make():
    return nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Flatten(), nn.Linear(8 * 6 * 6, 10))

{build}
dtype = next(model.parameters()).dtype
opt = torch.optim.Adam(model.parameters())
for _ in range(3):
    x = torch.randn(4, 3, 8, 8, device="cuda", dtype=dtype)
    y = torch.randint(0, 10, (4,), device="cuda")
    loss = nn.functional.cross_entropy(model(x).float(), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
N_PARAMS = 8 * 3 * 3 * 3 + 2 * 8 + 8 * 6 * 6 * 10 + 10
IDIOMS = {
    "cuda_then_half": ("model = make().cuda().half()", 2),
    "channels_last": ("model = make().to('cuda').to(memory_format=torch.channels_last)", 4),
    "half_channels_last_float": ("model = make().cuda().half()\n"
                                 "model = model.to('cuda').to(memory_format=torch.channels_last)"
                                 "\nmodel.float()", 4),
    "second_to": ("model = make().to('cuda')\nmodel.to(torch.device('cuda', 0))\n"
                  "model.cuda()", 4),
    "set_default_device": ("torch.set_default_device('cuda')\nmodel = make()", 4),
    "with_device": ("with torch.device('cuda'):\n    model = make()", 4),
    "data_parallel": ("model = nn.DataParallel(make()).cuda()", 4),
}


@pytest.mark.parametrize("idiom", sorted(IDIOMS))
def test_module_moves_that_crashed_now_plan(idiom, tmp_path):
    """Each idiom plans, agrees with a real CPU run, and holds the hand-counted parameters
    (in the dtype they end in) and BatchNorm's buffers (running mean and variance in that
    dtype, num_batches_tracked in int64)."""
    build, size = IDIOMS[idiom]
    plan = same_as_real(write(tmp_path, MODEL.format(build=build)))
    assert plan.categories["parameters"] == N_PARAMS * size
    assert plan.categories["buffers"] == 2 * 8 * size + 8
    assert plan.stopped == "steps"


def test_the_default_device_is_put_back(tmp_path, monkeypatch):
    """One run of the script (a plan's runs share the planner's process: the main run, the
    fixes, the batch search) puts the default device back, also after
    torch.utils.checkpoint, whose recomputation re-enters the script's DeviceContext
    (tests/planner_scripts/default_device.py checkpoints a block). Run here in this
    process, as the planner's own process runs it."""
    monkeypatch.chdir(tmp_path)
    script = Path(__file__).resolve().parents[2] / "planner_scripts" / "default_device.py"
    for fake in (True, False):
        run = planner._Run(str(script), [], card="A100-40GB", steps=2, fake=fake,
                           strict=False, amp=None, checkpoint_every=None, max_forwards=50,
                           time_limit=60.0, context=planner.DEFAULT_CONTEXT)
        run.run()
        assert run.stopped == "steps" and run.categories["buffers"] > 0
        assert torch.zeros(1).device.type == "cpu"
        assert torch.get_default_device() == torch.device("cpu")
        assert torch.utils._device.CURRENT_DEVICE is None
        assert torch._C._len_torch_function_stack() == 0


def test_data_parallel_over_several_gpus_is_refused(tmp_path):
    build = "model = nn.DataParallel(make(), device_ids=[0, 1]).cuda()"
    with pytest.raises(PlanError, match=r"DataParallel.*plans one card.*--ddp N"):
        will_it_fit(write(tmp_path, MODEL.format(build=build)))


def test_one_card_data_parallel_is_noted(tmp_path):
    plan = will_it_fit(write(tmp_path, MODEL.format(build=IDIOMS["data_parallel"][0])))
    assert any("DataParallel ran on the one virtual card" in n for n in plan.notes)


# ------------------------------------------------------------------ as on a GPU
DEVICE = """\
import torch
from torch import nn

model = nn.Linear(64, 64).cuda()
p = next(model.parameters())
assert p.is_cuda and not p.is_cpu and p.get_device() == 0
assert p.device == torch.device("cuda", 0) and p.device.type == "cuda"
assert torch.ones(2).device.type == "cpu" and not torch.ones(2).is_cuda
p.tag = "kept"
model.half().float()  # the same Parameter object, its attribute with it
assert next(model.parameters()) is p and p.tag == "kept" and p.dtype == torch.float32
keep = torch.zeros(1 << 20, device=p.device)
opt = torch.optim.Adam(model.parameters())
for _ in range(3):
    x = torch.randn(8, 64, device="cuda")
    assert x.is_cuda and x.device.type == "cuda" and str(x.device) == "cuda:0"
    bias = torch.ones(64).to(x.device)
    scale = torch.ones(8, 64).to(x)
    loss = (model(x * scale) + bias).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_tensors_on_the_card_answer_as_on_a_gpu(tmp_path):
    """``x.is_cuda``, ``x.device`` (``cuda:0``), ``get_device()``; ``.to(x.device)`` and
    ``.to(x)`` move to the card; and a tensor made with ``device=p.device`` is on the card:
    4 MiB more than without it (main counted it as a host tensor, and its asserts failed)."""
    with_keep = same_as_real(write(tmp_path, DEVICE, "keep.py"))
    without = will_it_fit(write(tmp_path, DEVICE.replace(
        "torch.zeros(1 << 20, device=p.device)", "None"), "nokeep.py"))
    assert with_keep.peak_allocated_bytes - without.peak_allocated_bytes == 4 * 1024 * 1024


def test_a_failing_device_assert_says_why(tmp_path):
    script = write(tmp_path, DEVICE.replace("bias = torch.ones(64).to(x.device)",
                                            "bias = torch.ones(64)\n    assert bias.is_cuda"))
    with pytest.raises(PlanError, match=r"answers is_cuda, \.device and get_device\(\) as on "
                                        r"a GPU.*made on the host"):
        will_it_fit(script)


LIBRARIES = """\
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(),
                      nn.Linear(64, 4)).to("cuda")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
scaler = torch.amp.GradScaler("cuda")
for _ in range(3):
    x = torch.randn(16, 32, device="cuda")
    h = checkpoint(model[:4], x, use_reentrant=False)
    loss = model[4](h).square().mean()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    sched.step()
    opt.zero_grad(set_to_none=True)
"""


def test_library_code_runs_under_the_gpu_answers(tmp_path):
    """Optimizers' foreach grouping, clip_grad_norm_, torch.utils.checkpoint, GradScaler
    and an LR scheduler see ``cuda:0`` devices and still plan, as a real CPU run counts."""
    plan = same_as_real(write(tmp_path, LIBRARIES))
    assert plan.stopped == "steps"
    p = (32 * 64 + 64 + 64 * 64 + 64 + 64 * 4 + 4) * 4
    assert plan.categories["parameters"] == p


def test_buffers_are_not_inputs(tmp_path):
    """BatchNorm's running statistics are "buffers"; "inputs" are the batch alone."""
    plan = will_it_fit(write(tmp_path, MODEL.format(build="model = make().cuda()")))
    assert plan.categories["buffers"] == 2 * 8 * 4 + 8
    assert plan.categories["inputs"] == 4 * 3 * 8 * 8 * 4 + 4 * 8
    assert "buffers" in plan.text()


def test_rnn_weights_answering_is_cuda_do_not_warn_about_cudnn(tmp_path, monkeypatch):
    """nn.LSTM's flatten_parameters asks cudnn.is_acceptable once its weights answer
    is_cuda; on this CPU build that would warn "compiled without cuDNN" (a guard: main's
    weights answered cpu and never asked)."""
    import warnings

    monkeypatch.chdir(tmp_path)
    script = Path(__file__).resolve().parents[2] / "planner_scripts" / "lstm_classifier.py"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for fake in (True, False):
            will_it_fit(str(script), fake=fake)
    assert not [w for w in caught if "cuDNN" in str(w.message)]
