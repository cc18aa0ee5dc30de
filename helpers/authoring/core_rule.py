"""The core rule: a lesson's core exercises are plain code (``tests/test_core_rule.py``).

What a learner writes in a core exercise is what they would paste into their own cluster job
tomorrow: ``torch``, ``torch.cuda``, ``torch.distributed``, ``torchrun``, ``tf``/``keras``,
``nvidia-smi``, ``sbatch``. A core exercise's solution may use the kit only for what is listed
in :data:`ALLOWED`, each name with the reason it may stay:

* **instrument**: something around the learner's code that shows what it does (the virtual
  card their ``torch.cuda`` lines run on, a gauge, a live plot);
* **factory**: data and models the lesson is not about;
* **check**: the exercise's own check;
* **setup**: what the Setup cell does (seeds, the device the lesson runs on, a script's path);
* **display**: formatting a figure the learner computed.

Helpers that do the learner's job (``find_batch_size``, ``measure_step``, ``torchrun_command``,
``save_checkpoint``...) are not listed: a lesson shows them in Going further, beside the plain
code, as the kit's shortcut. Only the solution cells of the core exercises (before
``## Going further``) are read; Going further and the cells around an exercise may use any
helper.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from .build import exercises_in, read
from .pacing import sections

#: helpers names a core exercise's solution may use, and why (see the module's docstring)
ALLOWED: dict[str, str] = {
    # instruments: around the learner's code, never instead of it
    "virtual_cuda": "instrument: plain torch.cuda code runs on a virtual card (CPU laptops)",
    "VirtualGPU": "instrument: a virtual card that counts memory and raises real OOM errors",
    "SimulatedCuda": "instrument: torch.cuda's functions answer as a named card",
    "MemoryGauge": "instrument: shows memory while the learner's loop runs",
    "LivePlot": "instrument: plots what the learner's loop reports",
    # factories: data and models the lesson is not about
    "MLP": "factory: a small model",
    "SmallCNN": "factory: a small model",
    "ResNet": "factory: a model",
    "LargeResNet": "factory: a model",
    "TransformerBlock": "factory: a model",
    "keras_resnet": "factory: a Keras model",
    "classification_data": "factory: synthetic data (no downloads)",
    "image_data": "factory: synthetic images (no downloads)",
    "SyntheticImages": "factory: a synthetic image dataset",
    "torch_dataset": "factory: a TensorDataset of synthetic data",
    "SlowDataset": "factory: a dataset with a set loading time",
    # checks
    "check": "check: the exercise's check",
    "NotSolved": "check: what a check raises",
    # setup
    "setup": "setup: seeds and framework settings, as in the Setup cell",
    "pick_device": "setup: the device this machine has (cuda, mps or cpu)",
    "script_path": "setup: where the kit's scripts are",
    # display of figures the learner computed
    "Table": "display: a small table",
    "fmt_bytes": "display", "fmt_mib": "display", "fmt_gib": "display",
    "fmt_seconds": "display", "fmt_ratio": "display", "fmt_rate": "display",
    "MiB": "display: a unit", "GiB": "display: a unit",
    "KNOWN_GPUS": "data: card names and memory sizes",
}


_SHELL_ASSIGN = re.compile(r"^\s*[\w, ]+=\s*[!%]")  # IPython's ``out = !command``


@dataclass(frozen=True)
class Use:
    """One use of a kit name in a core exercise's solution."""

    notebook: str
    exercise: str
    name: str  # e.g. "find_batch_size", or "memory.planner" for a submodule
    line: int  # in the solution code

    def __str__(self) -> str:
        return (f"{self.notebook} exercise {self.exercise} line {self.line}: helpers."
                f"{self.name} is not allowed in a core exercise (allowed: "
                "helpers/authoring/core_rule.ALLOWED)")


def as_python(code: str) -> str:
    """Notebook code as Python: each IPython line (``!command``, ``out = !command``,
    ``%magic``) becomes ``pass`` at its indentation, so line numbers and blocks stay."""
    lines = []
    for line in code.splitlines():
        if line.lstrip().startswith(("!", "%")) or _SHELL_ASSIGN.match(line):
            line = line[:len(line) - len(line.lstrip())] + "pass  # " + line.lstrip()
        lines.append(line)
    return "\n".join(lines)


def kit_names(code: str) -> list[tuple[str, int]]:
    """Every ``helpers`` name the code uses, with its line: ``helpers.X`` attributes (``X.Y``
    for a submodule's), ``from helpers import X`` and ``import helpers.X``. Code that is not
    Python (a shell script written with ``%%writefile``) uses none."""
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    try:
        tree = ast.parse(as_python(code))
    except SyntaxError:
        return []
    inner_links = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner_links:
            chain, inner = [node.attr], node.value  # the whole chain: helpers.a.b
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id == "helpers":
                found.append((list(reversed(chain)), node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module == "helpers" or node.module.startswith("helpers.")):
            sub = node.module.split(".")[1:]
            found += [([*sub, a.name], node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name.split(".")[1:], node.lineno) for a in node.names
                      if a.name.startswith("helpers.")]
    # helpers.VirtualGPU.something is a use of VirtualGPU; helpers.memory.planner a submodule
    out = set()
    for parts, line in found:
        if parts:
            out.add((parts[0] if parts[0] in ALLOWED else ".".join(parts), line))
    return sorted(out, key=lambda x: (x[1], x[0]))


def violations(path: Path) -> list[Use]:
    """The kit names outside :data:`ALLOWED` in one solutions notebook's core exercises."""
    path = Path(path)
    nb = read(path)
    core, _ = sections(nb, path.stem)
    core = set(core)
    found = []
    for ex in exercises_in(path, nb):
        if ex.cell_index not in core:
            continue
        found += [Use(path.name, ex.id, name, line) for name, line in kit_names(ex.solution)
                  if name not in ALLOWED]
    return found


__all__ = ["ALLOWED", "Use", "as_python", "kit_names", "violations"]
