"""The GPU test mode: unit tests, tests/gpu and every solutions notebook, in resumable parts.

`make test GPU=1` and `make gpu-check` run this script; each part takes at most about four
minutes on one H200 with 16 cores, and can be re-run alone:

    python scripts/gpu_check.py                      # every part, in order
    python scripts/gpu_check.py --part gpu           # one part (make gpu-check PART=gpu)
    python scripts/gpu_check.py --force              # re-run parts that already passed
    python scripts/gpu_check.py --dry-run            # on a CPU: the same code, CPU stand-ins
    python scripts/gpu_check.py --list               # the parts and what they run

Parts: `unit` (pytest tests -m "not browser and not gpu", CUDA_VISIBLE_DEVICES untouched),
`gpu-a`, `gpu-b` (tests/gpu, and lesson 09's throughput recorder: a GPU that NVML sees but
torch cannot use FAILS, see helpers.core.gpu_visibility), and `notebooks-a`... (every solutions/
notebook top to bottom with nbclient and ipykernel: asserts in cells must hold, outputs are
not compared, the kernel's host memory (VmHWM) must stay within HOST_RSS_BUDGET_MIB).

No green a GPU cannot earn: a real (not dry) part runs only where the GPU visibility verdict
is "usable" (a hidden GPU fails it at once, and nothing is copied for committing); a notebook
whose every code cell needs the TensorFlow its kernel lacks is "skipped", and so is a part
whose steps all skipped: never "passed".

Everything goes to one folder (default gpu-check-results/<date>/, git-ignored): one JSON
record per part (<part>.json, the schema is validate_record below), logs/<part>.log, and the
executed notebooks. A part whose record says "passed" is skipped unless --force. A real
(non-dry) run also copies each record to tests/gpu/results/gpu-check-<part>.json (or to
$GPU_LESSONS_RESULTS_DIR): commit those, with the results files the GPU tests write there
(memory.json, amp.json, ...).

--dry-run (make gpu-check DRY_RUN=1) runs on a machine without a GPU: the same driver code,
the same schema with "dry_run": true, and the GPU tests' --selftest-cpu paths as CPU
stand-ins. It exercises everything except CUDA itself, and writes nothing to tests/gpu/results.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "tests" / "gpu" / "results"
RESULTS_ENV = "GPU_LESSONS_RESULTS_DIR"  # = helpers.core.recorded.RESULTS_ENV
DEFAULT_OUT = ROOT / "gpu-check-results"
PART_KIND = "gpu-lessons gpu-check part"
# helpers.core.recorded.KIND (not imported: no torch here)
RECORDED_KIND = "gpu-lessons recorded GPU results"
SCHEMA_VERSION = 1

# Host memory of one notebook kernel (VmHWM, as the root conftest reads it). On a CPU the
# Binder-sized 1536 MiB applies (conftest.py). A kernel holding CUDA torch (cuBLAS, cuDNN
# loaded) plus TensorFlow-GPU needs more host memory: 6 GiB is the stated budget until the
# first GPU run measures it (each record stores every kernel's peak: lower it then).
CPU_KERNEL_BUDGET_MIB = 1536
HOST_RSS_BUDGET_MIB = 6144
CELL_TIMEOUT_S = 600

# solutions/ notebooks per part, each part <= ~4 min on one H200 (16 cores). Estimated from
# the CPU run times of `make outputs` on 2 cores (tests/gpu/README.md has the table): a
# part's CPU total stays under ~150 s, leaving room for CUDA and TensorFlow start-up.
NOTEBOOK_PARTS = {
    "notebooks-a": ["00_setup", "01_pytorch_gpu", "02_tensorflow_gpu"],
    "notebooks-b": ["03_multi_gpu", "03b_clusters_and_scale", "04_monitoring"],
    "notebooks-c": ["05_batch_size", "06_gradient_checkpointing"],
    "notebooks-d": ["07_mixed_precision", "07b_precision_in_practice"],
    "notebooks-e": ["08_oom_challenge"],
    "notebooks-f": ["09_throughput", "09b_faster_steps", "10_plan_your_job"],
    # the Keras track: TensorFlow cells only, skipped where the kernel has no TensorFlow
    "notebooks-g": ["05b_keras_batch_size"],
    "notebooks-h": ["08b_keras_oom_challenge"],
}
# On a GPU machine the main kernel's TensorFlow is the CPU build (one CUDA stack per
# environment, README "GPU machines"); TensorFlow on the GPU lives in the optional .venv-tf
# and its Jupyter kernel. This part runs the TensorFlow lesson there, when that kernel exists.
TF_KERNEL = "gpu-lessons-tf"
TF_KERNEL_PART = {"notebooks-tf": ["02_tensorflow_gpu"]}
# tests/gpu files per part (None: every test file not named in another part, new ones too).
# --dry-run adds each file's --selftest-cpu stand-in, where the file has one.
GPU_PARTS = {"gpu-a": ["test_memory_gpu.py", "test_batch_size_gpu.py", "test_oom_gpu.py"],
             "gpu-b": None}
THROUGHPUT, THROUGHPUT_PART = "tests/gpu/throughput_gpu.py", "gpu-b"
STATUSES = ("passed", "failed", "skipped")
# "check": a condition of the whole part (a real part on a GPU torch cannot use)
STEP_KINDS = ("pytest", "script", "notebook", "check")


class Stopped(BaseException):
    """SIGTERM (a time limit: tests/gpu/first_run.sh runs each part under `timeout`) or
    SIGINT: the running step is stopped, and the part still writes its record. A
    BaseException, as KeyboardInterrupt is, so that no step's `except Exception` takes it."""


def _stop(signum, frame):
    raise Stopped(f"stopped by {signal.Signals(signum).name} (a time limit?)")


# ---------------------------------------------------------------- parts and steps
@dataclass
class Step:
    name: str
    kind: str  # "pytest", "script" or "notebook"
    command: list[str] = field(default_factory=list)
    notebook: str | None = None
    kernel: str = "python3"


def gpu_test_files(part: str) -> list[str]:
    """The tests/gpu files of a gpu part; the last part takes every file not named before."""
    folder = ROOT / "tests" / "gpu"
    named = [f for files in GPU_PARTS.values() if files for f in files]
    files = GPU_PARTS[part] or sorted(p.name for p in folder.glob("test_*.py")
                                      if p.name not in named)
    return [f"tests/gpu/{f}" for f in files if (folder / f).is_file()]


def has_selftest(path: str) -> bool:
    return '"--selftest-cpu"' in (ROOT / path).read_text(encoding="utf-8")


def parts(dry_run: bool, workers: int, out_dir: Path | None = None) -> dict[str, list[Step]]:
    """Every part's steps, in the order `make test GPU=1` runs them."""
    py = sys.executable
    # -ra: every skip with its reason in the log (what this environment lacks, e.g. a site
    # environment's TensorFlow, JupyterLab, playwright: tests/lean_env.py); -rs alone would
    # drop the failures and errors from the short summary
    out = {"unit": [Step("pytest tests (not browser, not gpu)", "pytest",
                         [py, "-m", "pytest", "tests", "-m", "not browser and not gpu", "-q",
                          "-ra", "-n", str(workers), "-p", "no:cacheprovider"])]}
    for name in GPU_PARTS:
        files = gpu_test_files(name)
        steps = [Step(f"pytest {' '.join(Path(f).name for f in files)}", "pytest",
                      [py, "-m", "pytest", *files, "-m", "gpu", "-q", "-ra",
                       "-p", "no:cacheprovider"])]
        if dry_run:
            steps += [Step(f"{f} --selftest-cpu", "script", [py, f, "--selftest-cpu"])
                      for f in files if has_selftest(f)]
        out[name] = steps
    if dry_run:  # lesson 09's recorder: its CPU rungs, into the results folder, never recorded
        target = (out_dir or DEFAULT_OUT) / "throughput-cpu.json"
        out[THROUGHPUT_PART].append(Step(f"{THROUGHPUT} --device cpu --quick", "script", [
            py, THROUGHPUT, "--device", "cpu", "--quick", "--out", str(target)]))
    else:  # writes tests/gpu/results/09_throughput.json
        out[THROUGHPUT_PART].append(Step(THROUGHPUT, "script", [py, THROUGHPUT]))
    for name, stems in NOTEBOOK_PARTS.items():
        out[name] = [Step(f"solutions/{s}.ipynb", "notebook", notebook=f"solutions/{s}.ipynb")
                     for s in stems]
    for name, stems in TF_KERNEL_PART.items():
        out[name] = [Step(f"solutions/{s}.ipynb (kernel {TF_KERNEL})", "notebook",
                          notebook=f"solutions/{s}.ipynb", kernel=TF_KERNEL) for s in stems]
    return out


def kernel_installed(name: str) -> bool:
    from jupyter_client.kernelspec import KernelSpecManager

    return name in KernelSpecManager().find_kernel_specs()


def custom_part(notebooks: list[str], gpu_tests: list[str], dry_run: bool) -> list[Step]:
    """A part made of the given notebooks and tests/gpu files (tests and quick checks)."""
    py = sys.executable
    steps = [Step(f"{n}", "notebook", notebook=n) for n in notebooks]
    for path in gpu_tests:
        steps.append(Step(f"pytest {path}", "pytest",
                          [py, "-m", "pytest", path, "-m", "gpu", "-q", "-ra",
                           "-p", "no:cacheprovider"]))
        if dry_run and has_selftest(path):
            steps.append(Step(f"{path} --selftest-cpu", "script",
                              [py, path, "--selftest-cpu"]))
    return steps


# ---------------------------------------------------------------- the environment
PROBE = r"""
import importlib.metadata as md, json, os, platform, sys
out = {"python": platform.python_version(), "cpu_count": os.cpu_count()}
from helpers.core.gpu_visibility import gpu_visibility
vis = gpu_visibility()
out["gpu_visibility"] = {"verdict": vis.verdict, "message": vis.message}
out["driver"] = vis.driver
out["gpus"] = [{"name": g.name, "uuid": g.uuid,
                "compute_capability": ".".join(map(str, g.compute_capability or ())) or None}
               for g in vis.nvml_gpus]
import torch
out["torch"] = torch.__version__
out["torch_cuda"] = torch.version.cuda
out["cudnn"] = (str(torch.backends.cudnn.version())
                if torch.version.cuda and torch.backends.cudnn.is_available() else None)
if vis.usable:
    out["torch_gpus"] = [{"name": p.name, "total_bytes": p.total_memory,
                          "compute_capability": f"{p.major}.{p.minor}"}
                         for p in map(torch.cuda.get_device_properties,
                                      range(torch.cuda.device_count()))]
from helpers.core.cuda_libs import cudnn_report, loaded_libraries
# one convolution (only with a usable GPU) loads cuDNN's sub-libraries; the report says where
# each came from and flags any missing from torch's own nvidia/cudnn/lib (cuDNN 9.20.0.48)
cudnn = cudnn_report()
out["cudnn_report"] = {"checked": cudnn.checked, "ok": cudnn.ok, "text": str(cudnn),
                       "problems": list(cudnn.problems)}
LIBS = r"^lib(cudnn|nccl|cublas|cudart)"
out["tensorflow"] = out["tf_cuda"] = out["tf_cudnn"] = None
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
try:
    import tensorflow as tf
    out["tensorflow"] = tf.__version__
    info = tf.sysconfig.get_build_info()
    out["tf_cuda"] = info.get("cuda_version")
    out["tf_cudnn"] = info.get("cudnn_version")
    out["tf_gpus"] = len(tf.config.list_physical_devices("GPU"))
except ImportError as exc:
    out["tensorflow_absent"] = str(exc)
out["cuda_libraries"] = {lib.name: lib.path for lib in loaded_libraries(LIBS)}
print("GPU_CHECK_PROBE " + json.dumps(out))
"""


def probe_environment(env: dict) -> dict:
    """GPUs, driver, visibility verdict and versions, from a child process (no CUDA here)."""
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=300)
    for line in done.stdout.splitlines():
        if line.startswith("GPU_CHECK_PROBE "):
            return json.loads(line.split(" ", 1)[1])
    raise RuntimeError(f"the environment probe failed (exit {done.returncode}):\n"
                       f"{done.stdout[-2000:]}{done.stderr[-3000:]}")


def label(env_info: dict, dry_run: bool, date: str) -> str:
    """One line: where and with what these results were obtained."""
    gpus = env_info.get("gpus") or []
    names = ", ".join(sorted({g["name"] for g in gpus})) or "no GPU"
    count = f"{len(gpus)} x " if len(gpus) > 1 else ""
    bits = [f"{count}{names} (driver {env_info.get('driver') or 'none'})",
            f"torch {env_info.get('torch')} (CUDA {env_info.get('torch_cuda') or '-'}, "
            f"cuDNN {env_info.get('cudnn') or '-'})",
            f"TensorFlow {env_info.get('tensorflow') or 'absent'}", date[:10]]
    return ", ".join(bits) + (", DRY RUN on the CPU" if dry_run else "")


# ---------------------------------------------------------------- running steps
def run_command(step: Step, env: dict, log) -> dict:
    log.write(f"\n==== {step.name}\n$ {' '.join(step.command)}\n")
    log.flush()
    done = subprocess.run(step.command, cwd=ROOT, env=env, stdout=log,
                          stderr=subprocess.STDOUT, text=True)
    return {"status": "passed" if done.returncode == 0 else "failed",
            "detail": f"exit code {done.returncode}"}


def run_notebook(step: Step, env: dict, log, out_dir: Path, budget_mib: int) -> dict:
    """Execute a notebook top to bottom; keep the executed copy; read the kernel's VmHWM."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    from helpers.authoring.build import KERNEL_ARGS, clean_metadata, kernel_peak_rss_mib

    path = (ROOT / step.notebook) if not Path(step.notebook).is_absolute() else Path(
        step.notebook)
    nb = nbformat.read(path, as_version=4)
    # without TensorFlow (or with --hide-tensorflow) the cells tagged 'tensorflow' print why
    # they were skipped instead of failing; the kernel's view decides (its interpreter, from
    # its kernelspec, with this step's env)
    if str(Path(__file__).resolve().parent) not in sys.path:
        sys.path.insert(0, str(Path(__file__).resolve().parent))  # loaded by file path
    from tf_cells import kernel_python, skip_tensorflow_cells, tensorflow_available

    tf_found, tf_reason = tensorflow_available(env, python=kernel_python(step.kernel))
    skipped = []
    if not tf_found:
        skipped = skip_tensorflow_cells(nb, reason=tf_reason)
        log.write(f"{tf_reason}: skipping the cells tagged 'tensorflow': {skipped}\n")
    code = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"]
    nothing_runs = bool(code) and set(code) <= set(skipped)
    peak: dict[str, float] = {}
    current: dict[str, int] = {}

    def on_cell_start(cell, cell_index, **kwargs):  # the cell that raised or timed out
        current["index"] = cell_index

    def on_cell_executed(**kwargs):  # VmHWM only grows: the last read is the kernel's peak
        process = getattr(getattr(client.km, "provisioner", None), "process", None)
        mib = kernel_peak_rss_mib(process.pid) if process is not None else None
        if mib is not None:
            peak["mib"] = mib

    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name=step.kernel,
                            resources={"metadata": {"path": str(path.parent)}},
                            extra_arguments=KERNEL_ARGS, record_timing=False,
                            store_widget_state=False, on_cell_start=on_cell_start,
                            on_cell_executed=on_cell_executed)
    log.write(f"\n==== {step.name}: executing with nbclient (outputs not compared)\n")
    log.flush()
    result = {"status": "passed", "detail": "every cell ran, asserts held"}
    try:
        client.execute(env=env, stdout=log, stderr=log)  # the kernel's own output: the log
    except (CellExecutionError, CellTimeoutError) as exc:
        text = str(exc)
        log.write(text + "\n")
        last = [ln for ln in text.splitlines() if ln.strip()][-1:] or ["?"]
        result = {"status": "failed",
                  "detail": f"cell {current.get('index')}: {_strip_ansi(last[0])[:300]}"}
    except Exception as exc:  # kernel died, could not start, ...
        log.write(f"{type(exc).__name__}: {exc}\n")
        result = {"status": "failed", "detail": f"{type(exc).__name__}: {str(exc)[:300]}"}
    if nothing_runs and result["status"] == "passed":  # only the skip lines were printed
        result = {"status": "skipped",
                  "detail": f"every code cell needs TensorFlow ({tf_reason}): nothing ran"}
    clean_metadata(nb)
    executed = out_dir / "notebooks" / path.name
    executed.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, executed)
    result["executed_notebook"] = str(executed.relative_to(out_dir))
    result["kernel_peak_rss_mib"] = round(peak["mib"], 1) if "mib" in peak else None
    if result["kernel_peak_rss_mib"] is not None and result["kernel_peak_rss_mib"] > budget_mib:
        result["status"] = "failed"
        result["detail"] += (f"; kernel host memory peaked at {result['kernel_peak_rss_mib']:.0f}"
                             f" MiB > budget {budget_mib} MiB")
    log.write(f"{result['status']}: {result['detail']} (kernel peak "
              f"{result['kernel_peak_rss_mib']} MiB)\n")
    return result


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


HIDE_TF = '''"""Written by gpu_check.py --hide-tensorflow: TensorFlow cannot be imported.

The path finder is wrapped, not overruled: importlib.util.find_spec("tensorflow") returns
None and `import tensorflow` raises ModuleNotFoundError, exactly as without TensorFlow.
"""
import sys
from importlib.machinery import PathFinder

HIDDEN = ("tensorflow", "tf_keras")


class _PathFinderWithoutTensorFlow:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            return None
        return PathFinder.find_spec(name, path, target)

    invalidate_caches = staticmethod(PathFinder.invalidate_caches)
    find_distributions = staticmethod(PathFinder.find_distributions)


sys.meta_path[:] = [_PathFinderWithoutTensorFlow if f is PathFinder else f
                    for f in sys.meta_path]
'''


def child_env(out_dir: Path, dry_run: bool, budget_mib: int, hide_tf: bool) -> dict:
    """The environment of every step: the tests' kernel settings; CUDA_VISIBLE_DEVICES kept."""
    from helpers.authoring.build import KERNEL_ENV

    env = {**os.environ, **KERNEL_ENV, "GPU_LESSONS_KERNEL_BUDGET_MIB": str(budget_mib),
           "GPU_LESSONS_GPU_CHECK": "dry-run" if dry_run else "1", "PYTHONUNBUFFERED": "1"}
    if not dry_run:  # the tests' one thread per kernel suits 2 shared cores, not a GPU node
        env["OMP_NUM_THREADS"] = str(max(1, min(8, (os.cpu_count() or 2) // 2)))
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    if hide_tf:
        hide = out_dir / "hide-tensorflow"
        hide.mkdir(parents=True, exist_ok=True)
        (hide / "sitecustomize.py").write_text(HIDE_TF)
        env["PYTHONPATH"] = f"{hide}{os.pathsep}{env['PYTHONPATH']}"
    return env


# ---------------------------------------------------------------- one part
def run_part(name: str, steps: list[Step], *, out_dir: Path, dry_run: bool, force: bool,
             results_dir: Path | None, hide_tf: bool = False) -> dict:
    record_path = out_dir / f"{name}.json"
    if record_path.is_file() and not force:
        previous = json.loads(record_path.read_text())
        if previous.get("status") == "passed":
            print(f"part {name}: already passed ({record_path}); --force (FORCE=1) re-runs it")
            return previous
    budget = CPU_KERNEL_BUDGET_MIB if dry_run else HOST_RSS_BUDGET_MIB
    env = child_env(out_dir, dry_run, budget, hide_tf)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    log_path = out_dir / "logs" / f"{name}.log"
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    env_info = probe_environment(env)
    start = time.perf_counter()
    rows = []
    # a real part is GPU evidence only where this process can use the GPU: with it hidden
    # (CUDA_VISIBLE_DEVICES="", a SLURM job without GPUs) every GPU test would skip and
    # pytest exit 0, while NVML still names the GPU the record would be labelled with
    vis = env_info.get("gpu_visibility") or {}
    usable = dry_run or vis.get("verdict") == "usable"
    stopped = None
    with log_path.open("w") as log:
        log.write(f"gpu_check part {name} ({'dry run' if dry_run else 'GPU'}), {date}\n"
                  f"{json.dumps(env_info, indent=1)}\n")
        if not usable:
            detail = (f"GPU visibility is {vis.get('verdict')!r} ({vis.get('message')}): a "
                      "real part passes only where torch can use the GPU; nothing was run "
                      "(python -m helpers.core.gpu_visibility says why)")
            rows.append({"name": "GPU visibility", "kind": "check", "status": "failed",
                         "seconds": 0.0, "log": str(log_path.relative_to(out_dir)),
                         "detail": detail})
            log.write(f"\n==== {detail}\n")
            print(f"  failed    0.0 s  GPU visibility: {detail}", flush=True)
        for step in steps if usable else []:
            t0 = time.perf_counter()
            if step.kind == "notebook" and not kernel_installed(step.kernel):
                res = {"status": "skipped", "kernel_peak_rss_mib": None,
                       "detail": f"Jupyter kernel {step.kernel!r} is not installed (the "
                                 "optional TensorFlow GPU environment, README 'GPU machines')"}
                log.write(f"\n==== {step.name}: skipped: {res['detail']}\n")
            else:
                try:
                    res = (run_notebook(step, env, log, out_dir, budget)
                           if step.kind == "notebook" else run_command(step, env, log))
                except Stopped as exc:  # the steps after it do not run
                    stopped = exc
                    res = {"status": "failed", "detail": f"{exc} after "
                           f"{time.perf_counter() - t0:.0f} s; the steps after it did not run"}
                    if step.kind == "notebook":
                        res["kernel_peak_rss_mib"] = None
                    log.write(f"\n==== {step.name}: {res['detail']}\n")
            row = {"name": step.name, "kind": step.kind,
                   "seconds": round(time.perf_counter() - t0, 1),
                   "log": str(log_path.relative_to(out_dir)), **res}
            rows.append(row)
            print(f"  {row['status']:6s} {row['seconds']:6.1f} s  {step.name}"
                  + (f"  [{row['detail']}]" if stopped else ""), flush=True)
            if stopped:
                break
    written = [_rel(record_path), _rel(log_path)]
    written += [_rel(out_dir / r["executed_notebook"]) for r in rows if "executed_notebook" in r]
    record = {
        "kind": PART_KIND, "schema_version": SCHEMA_VERSION, "part": name,
        "dry_run": dry_run, "date": date, "label": label(env_info, dry_run, date),
        "status": part_status(rows),
        "seconds": round(time.perf_counter() - start, 1), "environment": env_info,
        "host_rss_budget_mib": budget, "steps": rows, "written": written,
    }
    commit = not dry_run and usable and results_dir is not None
    if commit:
        copy = results_dir / f"gpu-check-{name}.json"
        record["written"].append(_rel(copy))
    problems = validate_record(record)
    if problems:  # a bug in this script: say so loudly, keep the record for inspection
        record["status"] = "failed"
        record["schema_problems"] = problems
    text = json.dumps(record, indent=1) + "\n"
    record_path.write_text(text)
    if commit:
        results_dir.mkdir(parents=True, exist_ok=True)
        (results_dir / f"gpu-check-{name}.json").write_text(text)
    print(summary(record))
    if stopped is not None:
        raise stopped
    return record


def part_status(rows: list[dict]) -> str:
    """failed if a step failed; skipped if every step skipped (nothing ran: never passed)."""
    if any(r["status"] == "failed" for r in rows):
        return "failed"
    return "skipped" if all(r["status"] == "skipped" for r in rows) else "passed"


def _rel(path: Path) -> str:
    """A path as written in records: relative to the repository when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def summary(record: dict) -> str:
    """The one-screen summary printed at the end of each part."""
    e = record["environment"]
    lines = [f"==== gpu-check part {record['part']}: {record['status'].upper()} "
             f"in {record['seconds']:.0f} s{' (DRY RUN)' if record['dry_run'] else ''}",
             f"GPU(s):     {', '.join(g['name'] for g in e.get('gpus', [])) or 'none'}",
             f"driver:     {e.get('driver') or 'none'}; visibility: "
             f"{e['gpu_visibility']['verdict']} ({e['gpu_visibility']['message']})",
             f"torch:      {e.get('torch')} (CUDA {e.get('torch_cuda') or '-'}, cuDNN "
             f"{e.get('cudnn') or '-'})",
             f"TensorFlow: {e.get('tensorflow') or 'absent'} (CUDA {e.get('tf_cuda') or '-'}, "
             f"cuDNN {e.get('tf_cudnn') or '-'})"]
    for lib, path in sorted(e.get("cuda_libraries", {}).items()):
        lines.append(f"  loaded {lib} from {path}")
    cudnn = e.get("cudnn_report")
    if cudnn:  # where each cuDNN sub-library came from (helpers.core.cuda_libs.cudnn_report)
        lines += [f"  {line}" for line in cudnn["text"].splitlines()]
    for row in record["steps"]:
        peak = row.get("kernel_peak_rss_mib")
        mem = f", kernel {peak:.0f} MiB" if peak is not None else ""
        lines.append(f"  {row['status']:6s} {row['seconds']:6.1f} s  {row['name']}{mem}"
                     + ("" if row["status"] == "passed" else f"  [{row['detail']}]"))
    lines.append(f"host memory budget per kernel: {record['host_rss_budget_mib']} MiB")
    lines += [f"written: {p}" for p in record["written"]]
    return "\n".join(lines)


# ---------------------------------------------------------------- the schema
_ENV_FIELDS = {"python": str, "cpu_count": int, "gpu_visibility": dict, "gpus": list,
               "torch": str, "cuda_libraries": dict}
_OPT_STR = ("driver", "torch_cuda", "cudnn", "tensorflow", "tf_cuda", "tf_cudnn")
_STEP_FIELDS = {"name": str, "kind": str, "status": str, "seconds": (int, float), "log": str,
                "detail": str}
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}:\d{2}Z)?$")


def _typed(obj: dict, fields: dict, where: str) -> list[str]:
    out = []
    for key, typ in fields.items():
        if key not in obj:
            out.append(f"{where}: missing {key!r}")
        elif isinstance(obj[key], bool) and typ is not bool or not isinstance(obj[key], typ):
            out.append(f"{where}.{key}: expected {typ}, got {type(obj[key]).__name__}")
    return out


def validate_record(data) -> list[str]:
    """What is wrong with a results file (empty list: valid). The schema of tests/gpu/results.

    Two kinds of file live there, both labelled with GPU, driver, torch/TensorFlow versions,
    date and a dry-run flag:

    * gpu-check part records (``kind`` = PART_KIND, written by this script): part, dry_run,
      date, label, status, seconds, environment (GPUs, driver, visibility verdict, versions,
      the CUDA libraries loaded and from where), host_rss_budget_mib, steps, written;
    * results recorded by a GPU test (``kind`` = RECORDED_KIND, e.g. memory.json): script,
      date, hardware.gpu/driver, hardware.torch (or versions.torch); dry_run (never true)
      and hardware.tensorflow when present.
    """
    if not isinstance(data, dict):
        return [f"expected a JSON object, got {type(data).__name__}"]
    kind = data.get("kind")
    if kind == RECORDED_KIND:
        out = _typed(data, {"script": str, "date": str, "hardware": dict}, "record")
        hw = data.get("hardware") if isinstance(data.get("hardware"), dict) else {}
        out += _typed(hw, {"gpu": str, "driver": str}, "hardware")
        versions = data.get("versions") if isinstance(data.get("versions"), dict) else {}
        if not isinstance(hw.get("torch", versions.get("torch")), str):
            out.append("hardware.torch (or versions.torch): missing")
        if "dry_run" in data and not isinstance(data["dry_run"], bool):
            out.append("dry_run: expected a bool")
        if data.get("dry_run") is True:
            out.append("dry_run: a recorded GPU result must come from a real GPU run")
        if isinstance(data.get("date"), str) and not _DATE.match(data["date"]):
            out.append(f"date: {data['date']!r} is not YYYY-MM-DD")
        return out
    if kind != PART_KIND:
        return [f"kind: expected {PART_KIND!r} or {RECORDED_KIND!r}, got {kind!r}"]
    out = _typed(data, {"schema_version": int, "part": str, "dry_run": bool, "date": str,
                        "label": str, "status": str, "seconds": (int, float),
                        "environment": dict, "host_rss_budget_mib": int, "steps": list,
                        "written": list}, "record")
    if out:
        return out
    if data["schema_version"] != SCHEMA_VERSION:
        out.append(f"schema_version: expected {SCHEMA_VERSION}, got {data['schema_version']}")
    if data["status"] not in STATUSES:
        out.append(f"status: {data['status']!r} is not passed/failed/skipped")
    if not _DATE.match(data["date"]):
        out.append(f"date: {data['date']!r} is not an ISO date")
    env = data["environment"]
    out += _typed(env, _ENV_FIELDS, "environment")
    for key in _OPT_STR:
        if key not in env:
            out.append(f"environment: missing {key!r} (null when absent)")
        elif env[key] is not None and not isinstance(env[key], str):
            out.append(f"environment.{key}: expected a string or null")
    vis = env.get("gpu_visibility")
    if isinstance(vis, dict) and vis.get("verdict") not in ("usable", "hidden", "no-gpu",
                                                             "broken"):
        out.append(f"environment.gpu_visibility.verdict: {vis.get('verdict')!r}")
    for i, gpu in enumerate(env.get("gpus") if isinstance(env.get("gpus"), list) else []):
        if not isinstance(gpu, dict):
            out.append(f"environment.gpus[{i}]: expected an object")
            continue
        out += _typed(gpu, {"name": str, "uuid": str}, f"environment.gpus[{i}]")
    if not data["dry_run"] and not env.get("gpus"):
        out.append("environment.gpus: a record that is not a dry run needs a GPU")
    if not data["steps"]:
        out.append("steps: empty")
    for i, step in enumerate(data["steps"]):
        if not isinstance(step, dict):
            out.append(f"steps[{i}]: expected an object")
            continue
        out += _typed(step, _STEP_FIELDS, f"steps[{i}]")
        if step.get("status") not in STATUSES:
            out.append(f"steps[{i}].status: {step.get('status')!r}")
        if step.get("kind") not in STEP_KINDS:
            out.append(f"steps[{i}].kind: {step.get('kind')!r}")
        if step.get("kind") == "notebook":
            peak = step.get("kernel_peak_rss_mib", "missing")
            if peak is not None and not isinstance(peak, (int, float)):
                out.append(f"steps[{i}].kernel_peak_rss_mib: expected a number or null")
    statuses = [s.get("status") for s in data["steps"] if isinstance(s, dict)]
    if data["status"] == "passed" and "failed" in statuses:
        out.append("status: passed although a step failed")
    if data["status"] == "passed" and statuses and set(statuses) == {"skipped"}:
        out.append("status: passed although every step skipped")
    return out


# ---------------------------------------------------------------- command line
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu_check.py",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--part", nargs="+", metavar="PART",
                        help="parts to run (default: all, in order); see --list")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU needed: CPU stand-ins, records say dry_run: true")
    parser.add_argument("--force", action="store_true", help="re-run parts that passed")
    parser.add_argument("--out", type=Path, default=None,
                        help="results folder (default gpu-check-results/<date>[-dry-run])")
    parser.add_argument("--results-dir", type=Path, default=None,
                        help="where a real run copies its records (for committing; default "
                             f"${RESULTS_ENV} if set, else tests/gpu/results)")
    parser.add_argument("--notebooks", nargs="+", default=[], metavar="IPYNB",
                        help="run these notebooks as a part named 'custom'")
    parser.add_argument("--gpu-tests", nargs="+", default=[], metavar="FILE",
                        help="run these tests/gpu files (and their CPU stand-ins) in 'custom'")
    parser.add_argument("--hide-tensorflow", action="store_true",
                        help="make TensorFlow unimportable in every step (the no-TF path)")
    parser.add_argument("--workers", type=int, default=None,
                        help="pytest-xdist workers for the unit part (default: cores / 2, 1-8)")
    parser.add_argument("--list", action="store_true", help="list the parts and exit")
    args = parser.parse_args(argv)
    if args.results_dir is None:
        args.results_dir = Path(os.environ.get(RESULTS_ENV, "").strip() or RESULTS_DIR)
    workers = args.workers or max(1, min(8, (os.cpu_count() or 2) // 2))
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    out_dir = args.out or DEFAULT_OUT / (today + ("-dry-run" if args.dry_run else ""))
    out_dir = out_dir.resolve()
    table = parts(args.dry_run, workers, out_dir)
    if args.notebooks or args.gpu_tests:
        table = {"custom": custom_part(args.notebooks, args.gpu_tests, args.dry_run)}
    if args.list:
        for name, steps in table.items():
            print(f"{name}:")
            for step in steps:
                print(f"  {step.kind:8s} {step.name}")
        return 0
    names = args.part or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(table)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"gpu-check: parts {', '.join(names)}; results in {out_dir}", flush=True)
    failed, skipped = [], []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    for name in names:
        print(f"---- part {name}", flush=True)
        try:
            record = run_part(name, table[name], out_dir=out_dir, dry_run=args.dry_run,
                              force=args.force, results_dir=args.results_dir,
                              hide_tf=args.hide_tensorflow)
        except Stopped as exc:
            print(f"gpu-check: {exc} in part {name}; its record is written, the parts after "
                  "it did not run")
            return 1
        if record["status"] == "failed":
            failed.append(name)
        elif record["status"] == "skipped":
            skipped.append(name)
    shutil.rmtree(out_dir / "hide-tensorflow", ignore_errors=True)
    if failed:
        print(f"gpu-check: FAILED part(s): {', '.join(failed)} (logs in {out_dir / 'logs'})")
        return 1
    if skipped:  # nothing ran in them: no evidence either way
        print(f"gpu-check: SKIPPED part(s), nothing ran: {', '.join(skipped)}")
    print(f"gpu-check: {len(names) - len(skipped)} part(s) passed; results in {out_dir}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
