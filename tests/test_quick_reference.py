"""reference/quick-reference.md (issue 18): the workshop's snippets in their modern form.

Its Python blocks run as written, in order, in one fresh CPU-only process, with no
FutureWarning or DeprecationWarning; a block whose first line starts with ``# script:`` is
compiled only (it is part of a torchrun script); its shell blocks pass ``bash -n``. Lesson 00
links to it and the learner bundle ships it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import lean_env
import pytest

from helpers.authoring import build

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "reference" / "quick-reference.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.M | re.S)


def blocks(language: str) -> list[str]:
    return [code for lang, code in FENCE.findall(PAGE.read_text(encoding="utf-8"))
            if lang == language]


def test_the_page_has_python_and_shell_blocks():
    assert len(blocks("python")) >= 8 and len(blocks("bash")) >= 2


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_every_python_block_compiles(index):
    compile(blocks("python")[index], f"{PAGE.name} python block {index}", "exec")


@pytest.mark.parametrize("index", range(len(blocks("bash"))))
def test_every_shell_block_parses(index):
    out = subprocess.run(["bash", "-n"], input=blocks("bash")[index], text=True,
                         capture_output=True, check=False)
    assert out.returncode == 0, out.stderr


def test_the_python_blocks_run_in_order_on_a_cpu(tmp_path):
    lean_env.require("tensorflow", "the page's Keras blocks import it")
    runnable = [code for code in blocks("python") if not code.startswith("# script:")]
    assert len(runnable) >= 7
    program = tmp_path / "quick_reference.py"
    program.write_text("\n\n".join(runnable), encoding="utf-8")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = subprocess.run([sys.executable, str(program)], cwd=tmp_path, env=env, text=True,
                         capture_output=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for expected in (r"epoch 1, step 8: mean loss \d", r"Keras loss after 2 epochs: \d",
                     r"NVML is not available here|cuda:0: ", r"checkpointed segments: "
                     r"torch.Size\(\[10, 64\]\)", r"mixed precision in torch.bfloat16, loss \d",
                     r"out of memory at 256: False"):
        assert re.search(expected, out.stdout), (expected, out.stdout)
    warned = [line for line in out.stderr.splitlines()
              if re.search(r"(Future|Deprecation)Warning", line)]
    assert not warned, warned


def test_lesson_00_links_to_it_and_the_learner_bundle_ships_it():
    for folder in ("solutions", "lessons"):
        text = (ROOT / folder / "00_setup.ipynb").read_text(encoding="utf-8")
        assert "reference/quick-reference.md" in text, folder
    assert "reference" in build.LEARNER_BUNDLE
