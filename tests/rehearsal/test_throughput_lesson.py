"""Rehearsals of lessons 09 and 09b's CUDA branches (solutions/09b_faster_steps.ipynb holds the
step ladder since lesson 09 was split), run on a CPU.

The cells are taken from the notebook by id and executed against a simulated GPU
(``helpers.SimulatedCuda``) with ``device = torch.device("cuda")``: the mixed-precision pick
(bf16 only where the GPU computes it natively, fp16 with a GradScaler before compute
capability 8.0), and the compile rungs (``torch.compile`` on every device with a compiler,
CUDA graphs through ``mode="reduce-overhead"`` on CUDA only). No tensor goes to a GPU:
``torch.compile`` and the training loop are recorded, not run.
"""

from __future__ import annotations

import contextlib
import io
import json
from functools import partial
from pathlib import Path

import pytest
import torch

import helpers
from helpers.core.fake_nvml import FakeGpu, FakeNvml, simulated_uuid
from helpers.memory.cuda_standin import SimulatedCuda

SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"
NOTEBOOK = SOLUTIONS / "09b_faster_steps.ipynb"  # the step ladder: AMP, rungs, compile, graphs
INPUT_NOTEBOOK = SOLUTIONS / "09_throughput.ipynb"  # the input pipeline
AMP, RUNGS, COMPILE, GRAPHS = "9a3d52e6", "2ed3440c", "58c9f7c4", "b3c8d571"


def cell(cell_id: str) -> str:
    """The source of the notebook's code cell with this id."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    found = [c for c in cells if c.get("id") == cell_id]
    assert len(found) == 1 and found[0]["cell_type"] == "code", f"no code cell {cell_id}"
    return "".join(found[0]["source"])


def run_cells(namespace: dict, *cell_ids: str) -> str:
    """Execute the cells in ``namespace`` in order; returns what they printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for cell_id in cell_ids:
            exec(compile(cell(cell_id), f"{NOTEBOOK.name}:{cell_id}", "exec"), namespace)
    return out.getvalue()


class Trainer:
    """Stands in for the lesson's ``train`` and ``memory_batches``: records each call."""

    def __init__(self):
        self.calls: list[tuple] = []

    def train(self, batches, epochs=2, *, net=None, log_every_step=True, step=None):
        self.calls.append((batches, epochs, net, log_every_step, step))
        return 0

    @staticmethod
    def memory_batches(batch_size, seed=0):
        return f"batches of {batch_size}"


def lesson_namespace(trainer: Trainer) -> dict:
    model = torch.nn.Linear(4, 2)
    return {"torch": torch, "helpers": helpers, "device": torch.device("cuda"),
            "model": model, "loss_fn": torch.nn.CrossEntropyLoss(),
            "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
            "train": trainer.train, "memory_batches": trainer.memory_batches,
            "partial": partial, "time": __import__("time"), "shutil": __import__("shutil"),
            "Path": Path}


@pytest.mark.parametrize(("gpu", "capability", "dtype", "scaler"), [
    ("V100", (7, 0), torch.float16, "on"),
    ("T4", (7, 5), torch.float16, "on"),
    ("A100", (8, 0), torch.bfloat16, "off"),
    ("H100", (9, 0), torch.bfloat16, "off"),
])
def test_amp_rung_is_bf16_only_where_the_gpu_computes_it(gpu, capability, dtype, scaler):
    """torch.cuda.is_bf16_supported() answers True on a V100 or T4 (emulated bf16); the
    lesson must ask without emulation and use fp16 with a GradScaler there."""
    trainer = Trainer()
    namespace = lesson_namespace(trainer)
    with SimulatedCuda(name=gpu, capability=capability) as sim:
        assert torch.cuda.is_bf16_supported()  # the trap: emulation counts by default
        sim.clear_log()
        printed = run_cells(namespace, AMP, RUNGS)
        asked = sim.calls("is_bf16_supported")
    amp, steps = namespace["amp"], namespace["steps"]
    assert asked and all(call[1:] == (False,) for call in asked), asked
    assert amp.dtype == dtype and amp.use_scaler == (scaler == "on")
    assert namespace["scaler"].is_enabled() == (scaler == "on")
    rung = "+ fp16 autocast, GradScaler" if scaler == "on" else "+ bf16 autocast"
    assert list(steps)[-1] == rung
    assert f"mixed precision on cuda: {amp.name}, GradScaler {scaler}" in printed
    steps[rung]()  # the rung trains in mixed precision: with amp_step, no per-step log
    assert trainer.calls == [("batches of 256", 12, None, False, namespace["amp_step"])]


def test_compile_and_cuda_graph_rungs_on_a_gpu(monkeypatch):
    """On CUDA the lesson compiles once in the default mode (timed, its first epoch) and once
    with mode='reduce-overhead' (three epochs, so the CUDA graphs record before timing);
    both rungs train in mixed precision on batches of 256."""
    compiled: list[tuple] = []

    def fake_compile(model, mode=None, **kwargs):
        compiled.append((model, mode or "default"))
        return f"compiled {mode or 'default'}"

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    trainer = Trainer()
    namespace = lesson_namespace(trainer)
    with SimulatedCuda(capability=(9, 0)):
        printed = run_cells(namespace, AMP, RUNGS, COMPILE, GRAPHS)
    model, amp_step = namespace["model"], namespace["amp_step"]
    assert compiled == [(model, "default"), (model, "reduce-overhead")]
    warm_up = [c for c in trainer.calls if c[1] == 1]
    assert warm_up == [("batches of 256", 1, "compiled default", False, amp_step)] + \
        [("batches of 256", 1, "compiled reduce-overhead", False, amp_step)] * 3
    assert namespace["skipped"] == {}
    steps = namespace["steps"]
    assert list(steps)[-2:] == ["+ torch.compile", "+ CUDA graphs (reduce-overhead)"]
    for name, net in [("+ torch.compile", "compiled default"),
                      ("+ CUDA graphs (reduce-overhead)", "compiled reduce-overhead")]:
        trainer.calls.clear()
        steps[name]()
        assert trainer.calls == [("batches of 256", 12, net, False, amp_step)]
    assert "compiles with cc" in printed and "skipped here: nothing" in printed


def test_compile_rungs_without_a_compiler_on_a_gpu(monkeypatch):
    """No C compiler (a slim CUDA image): both compile rungs are skipped with the reason,
    before anything is compiled."""
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("compiled anyway"))
    monkeypatch.setattr("shutil.which", lambda name: None)
    trainer = Trainer()
    namespace = lesson_namespace(trainer)
    with SimulatedCuda(capability=(8, 0)):
        run_cells(namespace, AMP, RUNGS, COMPILE, GRAPHS)
    skipped = namespace["skipped"]
    assert set(skipped) == {"+ torch.compile", "+ CUDA graphs (reduce-overhead)"}
    assert "cc, gcc, clang" in skipped["+ CUDA graphs (reduce-overhead)"]
    assert trainer.calls == []


def test_profile_cells_without_a_compiler_profile_the_eager_step():
    """Where nothing was compiled, the cells that show what torch.compile compiled profile
    the eager step instead: no compiled graph, the optimizer step outside any."""
    from torch.profiler import ProfilerActivity, profile

    model = helpers.MLP(in_features=8, hidden=16, depth=2, n_classes=3)
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 0])
    namespace = {"torch": torch, "helpers": helpers, "device": torch.device("cpu"),
                 "model": model, "loss_fn": torch.nn.CrossEntropyLoss(),
                 "optimizer": torch.optim.Adam(model.parameters()), "compiled": None,
                 "memory_batches": lambda batch_size: [(x, y)], "profile": profile,
                 "activities": [ProfilerActivity.CPU]}
    printed = run_cells(namespace, AMP, "e2b47c95", "f5a0c3d7")
    assert namespace["graphs"] == [] and namespace["adam"].cpu_children
    assert "compiled graphs run in one step: 0" in printed


def _parts(path):
    """(cells, index of '## Going further', index of '## Key points', {id: index})."""
    cells = json.loads(path.read_text())["cells"]
    first = ["".join(c["source"]).split("\n", 1)[0] for c in cells]
    further, key_points = first.index("## Going further"), first.index("## Key points")
    assert further < key_points == len(cells) - 1
    return cells, further, key_points, {c["id"]: i for i, c in enumerate(cells)}


def test_core_is_the_input_pipeline_and_the_step_cost_goes_further():
    """Issue 17, then issue 31's split: lesson 09's core teaches the input pipeline and holds
    09-fix-the-loader (TensorFlow and 09-name-the-bottleneck in its Going further); the step
    cost is lesson 09b, whose core holds the mixed-precision rung and 09-cuda-event-timer and
    whose Going further holds torch.compile and CUDA graphs (slow first steps)."""
    cells, further, key_points, where = _parts(INPUT_NOTEBOOK)
    source = {c["id"]: "".join(c["source"]) for c in cells}
    core = [c for c in cells[:further] if c["cell_type"] == "code"]
    assert not [c["id"] for c in core if "torch.compile" in source[c["id"]]]
    assert not [c["id"] for c in core if "tensorflow" in c["metadata"].get("tags", [])]
    exercises = {c["metadata"]["exercise"]["id"]: i for i, c in enumerate(cells)
                 if "exercise" in c["metadata"]}
    assert exercises["09-fix-the-loader"] < further < exercises["09-name-the-bottleneck"]
    assert not set(where) & {AMP, RUNGS, COMPILE, GRAPHS}, "the step ladder is lesson 09b's"

    cells, further, key_points, where = _parts(NOTEBOOK)
    for cell_id in (AMP, RUNGS):
        assert where[cell_id] < further, cell_id
    for cell_id in (COMPILE, GRAPHS, "e2b47c95", "9c79bf3d"):
        assert further < where[cell_id] < key_points, cell_id
    core = [c for c in cells[:further] if c["cell_type"] == "code"]
    assert not [c["id"] for c in core if "torch.compile(" in "".join(c["source"])]
    exercises = {c["metadata"]["exercise"]["id"]: i for i, c in enumerate(cells)
                 if "exercise" in c["metadata"]}
    assert exercises["09-cuda-event-timer"] < further


# ------------------------------------------------------------------ StepTimer's GPU-Util
OTHER_JOB = "GPU-00000000-0000-4000-8000-0000000000{:02x}"  # GPUs torch does not see
THIS_GPU = "GPU-" + simulated_uuid(0)  # torch's cuda:0 (SimulatedCuda's UUID)


def timed_steps(timer: helpers.StepTimer, n: int = 2) -> helpers.StepTimer:
    for _ in timer.wrap(range(n)):
        timer.step(samples=8)
    return timer


def test_step_timer_samples_the_gpu_torch_uses_not_nvml_gpu_0():
    """CUDA_VISIBLE_DEVICES=2: torch's cuda:0 is NVML's GPU 2 (same UUID); NVML's GPU 0 is
    another job's, busy at 99 %."""
    gpus = [FakeGpu(uuid=OTHER_JOB.format(0), gpu_util_pct=99),
            FakeGpu(uuid=OTHER_JOB.format(1), gpu_util_pct=98),
            FakeGpu(uuid=THIS_GPU, gpu_util_pct=40)]
    with SimulatedCuda(), FakeNvml(gpus) as nv:
        timer = timed_steps(helpers.StepTimer(sync="cuda", show=False))
    assert timer.util == [(0, 40)]
    assert {c[1] for c in nv.calls("nvmlDeviceGetUtilizationRates")} == {2}
    s = timer.summary()
    assert s.gpu_util_pct == 40 and s.gpu_util_note == (
        "GPU-Util of GPU 2 from NVML (this process's cuda:0, matched by UUID)")


def test_step_timer_on_a_node_whose_cgroup_hides_nvml_gpu_0():
    """SLURM: NVML refuses GPU 0's handle (NO_PERMISSION); the timer reads this job's GPU."""
    gpus = [FakeGpu(uuid=OTHER_JOB.format(0), cgroup_hidden=True),
            FakeGpu(uuid=THIS_GPU, gpu_util_pct=40)]
    with SimulatedCuda(), FakeNvml(gpus):
        timer = timed_steps(helpers.StepTimer(sync="cuda", show=False))
    assert timer.util == [(0, 40)] and "GPU 1" in timer.gpu_util_note


@pytest.mark.parametrize("gpu_util", [None, 0])
def test_step_timer_on_a_mig_gpu_keeps_timing_and_says_why(gpu_util):
    """MIG mode: NVML's utilisation raises NOT_SUPPORTED; the steps are still timed."""
    with SimulatedCuda(), FakeNvml(FakeGpu(uuid=THIS_GPU, mig=True)):
        timer = timed_steps(helpers.StepTimer(sync="cuda", gpu_util=gpu_util, show=False), 3)
    s = timer.summary()
    assert s.steps == 3 and s.samples == 24 and s.gpu_util_pct is None
    assert s.gpu_util_note == (
        "no GPU-Util: NVML cannot read the utilisation of GPU 0 (NVMLError_NotSupported: Not "
        "Supported): it is in MIG mode, where NVML has no GPU-Util")


def test_step_timer_never_starts_cuda_to_find_its_gpu(monkeypatch):
    """A loop that does not use CUDA, on a machine with two GPUs: which one would be this
    process's is unknown, so nothing is sampled and no CUDA context is started."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = [FakeGpu(uuid=THIS_GPU), FakeGpu(uuid=OTHER_JOB.format(1))]
    with SimulatedCuda(device_count=2) as sim, FakeNvml(gpus):
        timer = timed_steps(helpers.StepTimer(show=False))
    assert timer.util == [] and not sim.initialized
    assert not sim.calls("get_device_properties") and not sim.calls("current_device")
    assert timer.gpu_util_note == (
        "no GPU-Util: this process has not started CUDA, so which of the 2 GPUs NVML sees is "
        "its own is unknown")


def test_step_timer_on_a_machine_with_one_gpu_reads_it_before_cuda_starts(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with SimulatedCuda() as sim, FakeNvml(FakeGpu(gpu_util_pct=30)):
        timer = timed_steps(helpers.StepTimer(show=False))
    assert timer.util == [(0, 30)] and not sim.initialized
    assert timer.gpu_util_note == "GPU-Util of GPU 0 from NVML (the only GPU)"


def test_step_timer_when_nvml_lists_no_gpu_with_torchs_uuid():
    """A MIG instance has a UUID of its own, which NVML's list of GPUs does not hold."""
    with SimulatedCuda(), FakeNvml(FakeGpu(uuid=OTHER_JOB.format(0))):
        timer = timed_steps(helpers.StepTimer(sync="cuda:0", show=False))
    assert timer.util == [] and timer.gpu_util_note.startswith(
        "no GPU-Util: NVML lists no GPU with the UUID of this process's cuda:0 "
        f"({simulated_uuid(0)}): a MIG instance")
