import subprocess
import sys

from helpers.core import runtime
from helpers.core.data import classification_data, torch_loader
from helpers.core.progress import progress


def test_plain_python_is_script_mode():
    assert runtime.MODE == "script" and runtime.headless()
    code = "import helpers.core.runtime as r; print(r.mode())"
    out = subprocess.run([sys.executable, "-c", code],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "script"


def test_progress_is_off_headless_and_keeps_the_batch_order():
    x, y = classification_data(256, 4, 2)
    plain = [b[1].tolist() for b in torch_loader(x, y, batch_size=32, seed=7)]
    bar = progress(torch_loader(x, y, batch_size=32, seed=7), desc="epoch")
    assert bar.disable
    assert [b[1].tolist() for b in bar] == plain  # tqdm.auto's asyncio wrapper breaks this


def test_progress_can_be_forced_on(capsys):
    assert list(progress(range(3), disable=False, desc="demo")) == [0, 1, 2]
    assert "demo" in capsys.readouterr().err
