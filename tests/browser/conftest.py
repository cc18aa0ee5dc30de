"""A real JupyterLab server and headless Chromium for the widget tests (``make test-browser``).

* The browser: ``$CHROMIUM_PATH`` if set, else ``chromium`` / ``chromium-browser`` /
  ``google-chrome`` on PATH, else a browser installed with ``playwright install chromium``.
  None found: the tests skip with a loud reason, or fail when ``CI=true``.
* The server: JupyterLab on 127.0.0.1, a free port, a random token, and every Jupyter,
  IPython and matplotlib directory in a temporary folder, so nothing from the user's setup
  leaks in and the repository's notebooks are never modified (the tests run copies).
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from lean_env import missing

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_skipped: list[str] = []


class _WithoutPlaywright(pytest.Module):
    """A browser test file where playwright is not installed (a site environment, which never
    installs it): skipped with the reason instead of failing to import (fails under CI=true)."""

    def collect(self):
        missing(f"{self.path.name}: playwright is not installed here: the browser tests "
                "drive Chromium through it (requirements.txt; a site environment never "
                "installs it)")


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path, parent):
    if importlib.util.find_spec("playwright") is None:
        return _WithoutPlaywright.from_parent(parent, path=module_path)
    return None


def find_browser() -> tuple[str | None, str]:
    """(path to a Chromium-family browser, how it was found) or (None, what was tried)."""
    env = os.environ.get("CHROMIUM_PATH")
    if env:
        if Path(env).is_file() and os.access(env, os.X_OK):
            return env, "CHROMIUM_PATH"
        return None, f"CHROMIUM_PATH={env!r} is not an executable file"
    for name in BROWSER_NAMES:
        path = shutil.which(name)
        if path:
            return path, f"{name} on PATH"
    try:  # a browser installed with `python -m playwright install chromium`
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            path = p.chromium.executable_path
        if path and Path(path).is_file():
            return path, "playwright's own chromium"
    except Exception:  # noqa: BLE001 - any failure means: not installed
        pass
    return None, (f"no browser: CHROMIUM_PATH is unset, none of {', '.join(BROWSER_NAMES)} "
                  "is on PATH and playwright's chromium is not installed. Run `make browser` "
                  "(root: installs Debian's chromium) or set CHROMIUM_PATH")


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    path, how = find_browser()
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but the browser tests cannot run: {how}", pytrace=False)
        _skipped.append(how)
        pytest.skip(f"BROWSER TESTS SKIPPED: {how}")
    return {**browser_type_launch_args, "executable_path": path,
            "args": ["--no-sandbox", "--disable-dev-shm-usage"]}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args):
    return {**browser_context_args, "viewport": {"width": 1400, "height": 1000}}


def pytest_terminal_summary(terminalreporter):
    if _skipped:
        terminalreporter.section("BROWSER TESTS DID NOT RUN", sep="!", yellow=True, bold=True)
        terminalreporter.write_line(_skipped[0], yellow=True, bold=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NOTEBOOK7 = "notebook7_widgets.ipynb"


def _write_notebook7_check(path: Path) -> None:
    """A short notebook for Notebook 7: a polling gauge, a live plot, the final reading."""
    import nbformat

    cells = [
        "import time\n\nimport helpers\n\ngauge = helpers.MemoryGauge(poll=0.25)\ngauge",
        "plot = helpers.LivePlot('Notebook 7 check', gauge=gauge, min_interval=0.2)\n"
        "for i in range(300):\n    time.sleep(0.01)\n"
        "    plot.step(loss=1.0 / (i + 1), samples=16)\nsummary = plot.close()",
        "gauge.stop()\nprint(gauge.update(force=True))",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}
    nbformat.write(nb, str(path))


class LabServer:
    artifacts = ARTIFACTS  # screenshots and the server log
    notebook7 = NOTEBOOK7

    def __init__(self, url: str, token: str, root: Path, process, log: Path):
        self.url, self.token, self.root, self.process, self.log = url, token, root, process, log

    def open_url(self, path: str, app: str = "lab/tree") -> str:
        return f"{self.url}/{app}/{path}?token={self.token}&reset"

    def log_tail(self, n: int = 40) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])


def _wait_for_status(url: str, token: str, process, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError as exc:
            last = exc
        time.sleep(0.2)  # polling a socket: there is nothing to wait on instead
    raise RuntimeError(f"JupyterLab did not answer /api/status in {timeout} s ({last})")


@pytest.fixture(scope="session")
def lab(tmp_path_factory, browser_type_launch_args):
    """A JupyterLab server (also serving Notebook 7) on copies of the lesson notebooks."""
    base = tmp_path_factory.mktemp("lab")
    root = base / "root"
    root.mkdir()
    for name in ("01_pytorch_gpu.ipynb", "04_monitoring.ipynb", "08_oom_challenge.ipynb"):
        shutil.copy(ROOT / "lessons" / name, root / name)
    dirs = {k: base / k.lower() for k in (
        "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR",
        "MPLCONFIGDIR")}
    settings, workspaces = base / "settings", base / "workspaces"
    for d in [*dirs.values(), settings, workspaces]:
        d.mkdir()
    # no news or update checks: their toast covers the notebook
    notification = settings / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True)
    (notification / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    # render every cell, also off screen, so outputs can be inspected anywhere
    tracker = settings / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    _write_notebook7_check(root / NOTEBOOK7)
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPU_LESSONS_HEADLESS", "PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER")}
    env.update({k: str(v) for k, v in dirs.items()})
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    # the browser, the server and the kernel share the machine: one thread per kernel keeps
    # torch from oversubscribing the cores (it slowed training 10x on a 2-core runner)
    env["OMP_NUM_THREADS"] = "1"
    port, token = _free_port(), secrets.token_hex(16)
    ARTIFACTS.mkdir(exist_ok=True)
    log = ARTIFACTS / "jupyterlab-server.log"
    cmd = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
        "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={workspaces}",
        "--LabApp.expose_app_in_browser=True",
        "--JupyterNotebookApp.expose_app_in_browser=True",
    ]
    with open(log, "w") as log_file:
        process = subprocess.Popen(cmd, cwd=root, env=env, stdout=log_file,
                                   stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_status(url, token, process)
        yield LabServer(url, token, root, process, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
