import subprocess
import sys

from helpers.core import runtime


def test_plain_python_is_script_mode():
    assert runtime.MODE == "script" and runtime.headless()
    code = "import helpers.core.runtime as r; print(r.mode())"
    out = subprocess.run([sys.executable, "-c", code],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "script"


