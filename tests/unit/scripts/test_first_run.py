"""tests/gpu/first_run.sh, the first run on an offline GPU node: one command line, offline,
no make, everything under RESULTS_DIR, a deadline; and its probes' CPU stand-ins.

The whole dry run (`DRY_RUN=1 RESULTS_DIR=... bash tests/gpu/first_run.sh` over a site
environment) takes minutes, so it is not part of `make test`; issue 29's closing note gives
its tarball's file list and step times.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tests" / "gpu" / "first_run.sh"


def test_it_fits_one_command_line_and_parses():
    text = SCRIPT.read_text()
    assert len(text) <= 2000, f"{len(text)} characters: the device tool takes 2,000"
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr


def test_steps_in_order_offline_without_make_under_results_dir():
    text = SCRIPT.read_text()
    steps = re.findall(r"^step (\S+) (\d+) ", text, flags=re.M)
    assert [n for n, _ in steps] == ["0-site-env", "1-facts", "2-probes", "3-gpu-a",
                                     "4-gpu-b"]
    assert "530 - (s - T0)" in text  # one deadline: 530 s, then the tarball
    assert "--wheelhouse wheelhouse-site" in text and "make " not in text
    assert "GPU_LESSONS_RESULTS_DIR=$R/results" in text  # the GPU tests write there
    for part in ("gpu-a", "gpu-b"):
        assert f'--part {part} --out "$R/gpu-check"' in text
    assert '--results-dir "$R/results"' in text
    assert 'tar -C "$R"' in text and "first-run.tar.gz" in text
    # every file it writes is under $R (redirections and --out arguments)
    targets = re.findall(r'(?:>>?|--out |-czf )"?([^"\s]+)', text)
    assert targets and all(t.startswith(('$R', '"$R', '&1')) for t in targets), targets


def test_the_probes_run_their_cpu_stand_ins(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    for what in ("facts", "probes"):
        done = subprocess.run([sys.executable, "tests/gpu/first_run_probes.py", what,
                               "--out", str(tmp_path)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    facts = json.loads((tmp_path / "facts.json").read_text())
    assert facts["gpu_visibility"]["verdict"] in ("no-gpu", "hidden")
    assert isinstance(facts["vmhwm_in_proc_status"], bool) and facts["torch"]["version"]
    probes = json.loads((tmp_path / "probes.json").read_text())
    assert probes["device"].startswith("cpu (dry run")
    errors = {k: v["error"] for k, v in probes.items() if isinstance(v, dict) and "error" in v}
    assert not errors, errors
    assert probes["workspace"]["stand_in"].startswith("VirtualGPU")
    assert probes["cap"]["workspace_bytes_held"] > 0
    assert probes["layouts"]["default"]["allclose_atol_1e-5"]
    assert probes["nvml"]["nvml"].startswith("unavailable")
