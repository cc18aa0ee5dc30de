"""`make lab` (the README's first command) really serves the lessons, with a token."""

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import lean_env
import pytest

from helpers.authoring import build

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_make_lab_serves_the_lessons_with_token_auth(tmp_path):
    venv = ROOT / ".venv"
    if not (list(venv.glob(".installed-gpu*")) and (venv / "bin" / "jupyter-lab").is_file()):
        # e.g. the GPU test mode in .venv-site, which has no JupyterLab
        lean_env.missing(f"make lab serves from {venv}, which is not set up with JupyterLab "
                         "here: it would create it and install requirements.txt into the "
                         "checkout")
    port = free_port()
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "config"), BROWSER="true")
    log = tmp_path / "lab.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["make", "--no-print-directory", "lab", f"PORT={port}"],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    try:
        token = None
        deadline = time.time() + 90
        while time.time() < deadline and token is None:
            assert proc.poll() is None, f"make lab exited early:\n{log.read_text()}"
            match = re.search(rf"http://127\.0\.0\.1:{port}/\S*\?token=(\w+)", log.read_text())
            token = match.group(1) if match else None
            time.sleep(0.5)
        assert token, f"no URL with a token printed:\n{log.read_text()}"
        base = f"http://127.0.0.1:{port}/api/contents"
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(base, timeout=10)
        assert denied.value.code == 403, "the server must refuse requests without the token"
        with urllib.request.urlopen(f"{base}?token={token}", timeout=10) as response:
            names = {item["name"] for item in json.load(response)["content"]}
        lessons = {p.name for p in (ROOT / "lessons").glob(build.LESSON_GLOB)}
        assert lessons and lessons <= names
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
