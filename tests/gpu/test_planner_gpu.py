"""GPU check of the planner (``helpers.will_it_fit``): its prediction against the real card.

    python -m pytest tests/gpu/test_planner_gpu.py -m gpu -q

For six of tests/planner_scripts/ (the MLP with ``.cuda()`` everywhere, the ResNet-50 with
float16 AMP and a GradScaler, the small transformer language model, and the three scripts
whose memory depends on CUDA's own dispatch: attention with dropout under bf16 autocast, a
GroupNorm + SiLU denoiser under fp16 autocast, a stacked LSTM), each script runs for
real on CUDA GPU 0, unmodified, in a fresh process: a wrapper stops it after its 2nd
optimizer step and reads ``torch.cuda.max_memory_allocated()`` (measured from a baseline
taken after cuBLAS's workspaces exist, since the plan does not count them). The planner's
``peak_allocated_bytes`` for the same arguments is compared with it, and both are recorded in
``tests/gpu/results/planner.json`` (a recorded GPU results file: the card, driver, torch and
CUDA versions, and the figures per script under ``cases``).

The plan models CUDA's dispatch (helpers/memory/cuda_dispatch.py: the SDPA backend, CUDA
autocast's type lists, a lower bound of cuDNN's RNN reserve space); ``plan.dispatch`` (the
models used) is recorded beside the figures, so a GPU run checks those models. Expected
differences, recorded rather than asserted to the byte: cuDNN may allocate workspaces
through the caching allocator, and cuDNN's real RNN reserve space is larger than the
plan's lower bound (the LSTM case records by how much). The test asserts agreement within
15 %. Without a CUDA GPU the tests skip with the reason.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from helpers.core.recorded import KIND, results_dir
from helpers.memory.planner import will_it_fit

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "planner_scripts"
RESULTS = results_dir() / "planner.json"

CASES = {
    "mlp_cuda_everywhere.py": ["--batch-size", "512"],
    "resnet_amp.py": ["--batch-size", "32", "--image-size", "128", "--samples", "64"],
    "transformer_lm.py": ["--batch-size", "16", "--block-size", "256"],
    # CUDA's dispatch: flash/cuDNN attention with dropout, no L x L matrix (bf16 autocast)
    "sdpa_dropout.py": ["--batch-size", "8", "--seq-len", "1024", "--d-model", "256",
                        "--n-head", "4", "--n-layer", "4"],
    # CUDA autocast's float32 GroupNorm (fp16 autocast, GradScaler)
    "groupnorm_amp.py": ["--batch-size", "16", "--image-size", "64", "--width", "128",
                         "--blocks", "4"],
    # cuDNN's reserve space (the plan counts a lower bound)
    "lstm_classifier.py": ["--batch-size", "64", "--seq-len", "256", "--hidden", "512",
                           "--layers", "2", "--samples", "256"],
    # the script's objects kept through moves: tied embeddings counted once, an optimizer
    # made before .cuda() keeps its state, .cuda().half() then channels_last, the default
    # device set to "cuda"
    "tied_lm.py": ["--batch-size", "8", "--block-size", "512", "--n-layer", "4",
                   "--n-embd", "512", "--vocab-size", "32000"],
    "optimizer_before_cuda.py": ["--batch-size", "256", "--dim", "2048", "--hidden", "8192"],
    "half_after_cuda.py": ["--batch-size", "32", "--image-size", "64", "--width", "32"],
    "default_device.py": ["--n-train", "8192", "--dim", "1024", "--hidden", "4096",
                          "--batch-size", "512"],
    # two optimizers: the peak after both have stepped twice
    "gan_two_optimizers.py": ["--batch-size", "64", "--image-size", "64", "--ngf", "64",
                              "--ndf", "64", "--samples", "256"],
    # resumes from and saves over a checkpoint in its working folder (the plan's writes go to
    # a throw-away folder; the real run's stay in the test's)
    "resume_checkpoint.py": ["--features", "1024", "--hidden", "4096", "--batch-size", "256"],
}

# Runs a script unmodified; once every optimizer it made has stepped twice (the planner's
# rule: a GAN's two optimizers both), prints the peak and exits.
WRAPPER = textwrap.dedent("""\
    import json, os, runpy, sys
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    script, args = sys.argv[1], sys.argv[2:]
    a = torch.randn(64, 64, device="cuda", requires_grad=True)
    (a @ a).sum().backward()  # cuBLAS's workspaces (forward and backward) exist from here
    del a
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    steps = {}

    def hook(opt, *_):
        steps[id(opt)] = steps.get(id(opt), 0) + 1
        if min(steps.values()) >= 2:
            torch.cuda.synchronize()
            print("PEAK " + json.dumps({"peak": torch.cuda.max_memory_allocated() - base}),
                  flush=True)
            os._exit(0)

    register_optimizer_step_post_hook(hook)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
    print("PEAK null", flush=True)
""")

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def hardware() -> dict:
    """GPU 0, the driver (from NVML) and the versions, as every recorded result names them."""
    from helpers.core.nvml import nvml_status

    ok, driver = nvml_status()
    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "driver": driver.removeprefix("driver ") if ok else f"unknown ({driver})"}


def _record(name: str, entry: dict) -> None:
    """Add one script's figures to planner.json, a recorded GPU results file (the schema of
    scripts/gpu_check.py's validate_record: kind, script, date, hardware; cases by script)."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if data.get("kind") != KIND:  # none yet, or the old {script: entry} layout
        data = {"kind": KIND, "script": "tests/gpu/test_planner_gpu.py", "cases": {}}
    data["date"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    data["hardware"] = hardware()
    data["cases"][name] = entry
    RESULTS.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


@requires_cuda
@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_against_max_memory_allocated(name, tmp_path):
    args = CASES[name]
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    out = subprocess.run([sys.executable, str(wrapper), str(SCRIPTS / name), *args],
                         capture_output=True, text=True, cwd=tmp_path, timeout=600,
                         env=dict(os.environ, LOCAL_RANK="0"))
    line = next((x for x in out.stdout.splitlines() if x.startswith("PEAK ")), None)
    assert line and line != "PEAK null", out.stdout[-2000:] + out.stderr[-2000:]
    real = json.loads(line[5:])["peak"]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        plan = will_it_fit(str(SCRIPTS / name), args, gpu="H100-80GB")
    finally:
        os.chdir(cwd)
    ratio = plan.peak_allocated_bytes / real
    _record(name, {"args": args, "card": torch.cuda.get_device_name(0),
                   "torch": torch.__version__, "cuda": torch.version.cuda,
                   "max_memory_allocated": real, "planned": plan.peak_allocated_bytes,
                   "planned_over_real": round(ratio, 4),
                   "autocast_differences": [n for n, *_ in plan.autocast_differences],
                   "dispatch": sorted({f"{d.op}: {d.model}" for d in plan.dispatch})})
    assert 0.85 <= ratio <= 1.15, f"{name}: planned {plan.peak_allocated_bytes}, real {real}"
