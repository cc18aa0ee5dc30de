"""Rehearsals of lesson 09's CUDA branches (solutions/09_throughput.ipynb), run on a CPU.

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
from helpers.memory.cuda_standin import SimulatedCuda

NOTEBOOK = Path(__file__).resolve().parents[2] / "solutions" / "09_throughput.ipynb"
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
            exec(compile(cell(cell_id), f"09_throughput.ipynb:{cell_id}", "exec"), namespace)
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


def test_core_is_the_input_pipeline_and_the_step_cost_goes_further():
    """Issue 17: the core (everything before ``## Going further``) teaches the input pipeline
    and holds the exercise 09-fix-the-loader; torch.compile, CUDA graphs, mixed precision,
    TensorFlow and 09-name-the-bottleneck lie in Going further, before Key points."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    first = ["".join(c["source"]).split("\n", 1)[0] for c in cells]
    further, key_points = first.index("## Going further"), first.index("## Key points")
    assert further < key_points == len(cells) - 1
    where = {c["id"]: i for i, c in enumerate(cells)}
    for cell_id in (AMP, RUNGS, COMPILE, GRAPHS, "e2b47c95", "9c79bf3d"):
        assert further < where[cell_id] < key_points, cell_id
    source = {c["id"]: "".join(c["source"]) for c in cells}
    core = [c for c in cells[:further] if c["cell_type"] == "code"]
    assert not [c["id"] for c in core if "torch.compile" in source[c["id"]]]
    assert not [c["id"] for c in core if "tensorflow" in c["metadata"].get("tags", [])]
    exercises = {c["metadata"]["exercise"]["id"]: i for i, c in enumerate(cells)
                 if "exercise" in c["metadata"]}
    assert exercises["09-fix-the-loader"] < further < exercises["09-name-the-bottleneck"]
