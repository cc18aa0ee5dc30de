"""CPU reproductions of bugs that only show on a CUDA machine.

Each test imitates the one fact of a GPU machine that triggers its bug: ``pick_device()``
answering a non-CPU device (``meta`` stands in for ``cuda``), ``torch.cuda`` functions
answering like a real GPU, a fake ``pynvml``.
"""

import contextlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential

import helpers

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def gpu_machine(monkeypatch):
    """pick_device() answers a non-CPU device, as on a CUDA machine."""
    monkeypatch.setattr("helpers.core.environment.pick_device",
                        lambda *a, **k: torch.device("meta"))


def _cell_defining(path: Path, first_line: str, containing: str = "") -> str:
    """The source of the code cell of notebook ``path`` that starts with ``first_line``
    (and contains ``containing``)."""
    cells = json.loads(path.read_text())["cells"]
    found = [
        "".join(c["source"]) for c in cells
        if c["cell_type"] == "code" and "".join(c["source"]).startswith(first_line)
        and containing in "".join(c["source"])
    ]
    assert len(found) == 1, f"{path.name}: {len(found)} cells start with {first_line!r}"
    return found[0]


# --------------------------------------------------------------------------------- bug 1
def test_lesson07_memory_of_full_scale_on_a_gpu_machine(gpu_machine):
    """Lesson 07's memory_of(..., full_scale=True) must not mix fake cuda weights with a
    cpu batch (FakeTensorDeviceMismatchError on every CUDA machine)."""
    source = _cell_defining(ROOT / "solutions" / "07_mixed_precision.ipynb",
                            "def amp_step(")
    # the cell ends by measuring the lesson model on the real device: keep the definitions
    source = source[: source.index("\nprecisions = ")]
    namespace = {"torch": torch, "helpers": helpers, "contextlib": contextlib,
                 "checkpoint_sequential": checkpoint_sequential,
                 "criterion": nn.CrossEntropyLoss(), "device": torch.device("cuda")}
    exec(compile(source, "07_mixed_precision.ipynb:memory_of", "exec"), namespace)
    report = namespace["memory_of"](lambda: helpers.MLP(16, 32, 2, 10), (16,), 8,
                                    torch.bfloat16, full_scale=True)
    assert report.peak_bytes > 0


def _load_amp_gpu():
    spec = importlib.util.spec_from_file_location("amp_gpu", ROOT / "tests/gpu/test_amp_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_amp_gpu_cpu_full_scale_prediction_on_a_gpu_machine(gpu_machine):
    """tests/gpu/test_amp_gpu.py's _measure(..., device=None) (the CPU prediction stored
    with every GPU row) must not mix fake cuda weights with a cpu batch."""
    amp_gpu = _load_amp_gpu()
    peak, allocator, cats = amp_gpu._measure("mlp-tiny", 8, "bf16", None)
    assert peak > 0 and allocator is None and cats["parameters"] > 0


# --------------------------------------------------------------------------- lesson 04 snapshot
def test_lesson04_memory_snapshot_goes_to_the_ignored_traces_folder(tmp_path, monkeypatch):
    """On a GPU, lesson 04's snapshot cell writes under traces/ (git-ignored, not bundled)
    and records Python stacks only (C++ frames are slow to symbolise)."""
    import subprocess
    import types

    source = _cell_defining(ROOT / "solutions" / "04_monitoring.ipynb",
                            'if device.type == "cuda":\n', "_record_memory_history(")
    calls = {}

    class Memory:  # torch.cuda.memory's recorder, as on a GPU
        def _record_memory_history(self, enabled="all", **kwargs):
            calls.setdefault("record", []).append(dict(kwargs, enabled=enabled))

        def _dump_snapshot(self, filename="dump_snapshot.pickle"):
            calls["dump"] = filename
            Path(filename).write_bytes(b"snapshot")

        def _snapshot(self):
            return {"segments": [1, 2]}

    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(memory=Memory()),
                                       randn=lambda *shape, device=None: torch.randn(2, 4))
    fake_nn = types.SimpleNamespace(Linear=lambda *a: nn.Linear(4, 4))
    monkeypatch.setattr(nn.Linear, "to", lambda self, *a, **k: self)  # .to("cuda")
    monkeypatch.chdir(tmp_path)  # the notebook's folder
    namespace = {"torch": fake_torch, "nn": fake_nn, "device": torch.device("cuda"),
                 "os": __import__("os")}
    exec(compile(source, "04_monitoring.ipynb:snapshot", "exec"), namespace)
    written = Path(calls["dump"])
    assert written.parts[0] == "traces" and (tmp_path / written).is_file()
    assert calls["record"][0]["stacks"] == "python"
    for folder in ("solutions", "lessons", "my-lessons"):
        ignored = subprocess.run(["git", "check-ignore", "-q", f"{folder}/{written}"],
                                 cwd=ROOT, check=False)
        assert ignored.returncode == 0, f"{folder}/{written} is not git-ignored"


# ------------------------------------------------------------------ cards the pins cannot drive
def test_known_cards_say_whether_the_pinned_torch_can_drive_them():
    """torch 2.13's PyPI wheels are CUDA 13: compute capability >= 7.5, driver >= 580."""
    from helpers.memory import capacity

    assert capacity.PINNED_TORCH_NEEDS == {"compute_capability": (7, 5), "driver": 580}
    assert set(capacity.COMPUTE_CAPABILITY) == set(helpers.KNOWN_GPUS)
    cannot = {card for card in helpers.KNOWN_GPUS if not capacity.pinned_torch_runs_on(card)}
    assert cannot == {"V100-16GB", "V100-32GB"}  # Volta, sm_70
    for card in helpers.KNOWN_GPUS:
        note = capacity.GPU_NOTES[card]
        assert ("cannot run torch 2.13's CUDA 13 wheels" in note) is (card in cannot), note
    assert capacity.pinned_torch_runs_on("Tesla T4")  # Turing, sm_75: the oldest that runs
    with pytest.raises(ValueError, match="unknown GPU"):
        capacity.pinned_torch_runs_on("P100")
