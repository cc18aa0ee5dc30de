"""The GPU check's own logic, on the CPU: the checks it runs must be able to fail."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lean_env import fake_kernelspec, hiding_sitecustomize

ROOT = Path(__file__).resolve().parents[3]


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def memory_gpu():
    return _load(ROOT / "tests" / "gpu" / "test_memory_gpu.py", "memory_gpu_under_test")


def _virtual_oom(memory_gpu, capacity, grid=None):
    """oom_check with the virtual GPU on both sides (what --selftest-cpu compares, fast)."""
    kwargs = {} if grid is None else {"grid": grid}
    return memory_gpu.oom_check("mlp", capacity, real_fits=memory_gpu.fits_virtual, **kwargs)


def test_memory_gpu_oom_limit_lies_inside_the_grid(memory_gpu):
    """With the GPU check's cap and grid the MLP really runs out of memory inside the grid."""
    oom = _virtual_oom(memory_gpu, memory_gpu.OOM_CAPACITY)
    assert memory_gpu.limit_inside_grid(oom) == []
    assert oom["grid_first"] < oom["virtual_max_batch"] < oom["grid_last"]


def test_memory_gpu_old_cap_is_caught(memory_gpu):
    """The old 2 GiB cap never ran out of memory on the grid: the check now says so."""
    oom = _virtual_oom(memory_gpu, "2 GiB")
    assert oom["virtual_max_batch"] == oom["grid_last"] == 16384
    problems = memory_gpu.limit_inside_grid(oom)
    assert len(problems) == 2 and "not strictly inside the grid 64..16384" in problems[0]


# ------------------------------------------------ the runner (scripts/gpu_check.py)
@pytest.fixture(scope="module")
def gpu_check():
    return _load(ROOT / "scripts" / "gpu_check.py", "gpu_check_under_test")


def _notebook(path: Path, *sources: str) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# A tiny notebook")]
    nb.cells += [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)
    return path


TF_CELL = """try:
    import tensorflow as tf
except ImportError as exc:  # a TensorFlow cell skips with a printed reason
    print(f"skipped: TensorFlow is not installed ({exc})")
else:
    print("TensorFlow", tf.__version__)"""


def test_dry_run_end_to_end_writes_valid_records(gpu_check, tmp_path):
    """The dry run of a quick part: a notebook that passes, one whose assert fails, and one
    tests/gpu file with its CPU stand-in; TensorFlow hidden (the no-TensorFlow path)."""
    good = _notebook(tmp_path / "good.ipynb", "x = sum(range(10))\nassert x == 45\nprint(x)",
                     TF_CELL)
    bad = _notebook(tmp_path / "bad.ipynb", "raise ValueError('shown on purpose')",
                    "x = 2 + 2\nassert x == 5, f'x is {x}'")
    import nbformat

    nb = nbformat.read(bad, as_version=4)
    nb.cells[1].metadata["tags"] = ["raises-exception"]  # an error the lesson expects
    nbformat.write(nb, bad)
    nb = nbformat.read(good, as_version=4)  # a lesson cell tagged 'tensorflow' (tf_cells.py)
    nb.cells.append(nbformat.v4.new_code_cell("import tensorflow as tf\nprint(tf.__version__)",
                                              metadata={"tags": ["tensorflow"]}))
    nbformat.write(nb, good)
    out, results = tmp_path / "out", tmp_path / "results"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--dry-run", "--out", str(out),
         "--results-dir", str(results), "--hide-tensorflow", "--notebooks", str(good), str(bad),
         "--gpu-tests", "tests/gpu/test_ddp_nccl_gpu.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})  # a CPU dry run on any machine
    assert done.returncode == 1, done.stdout + done.stderr  # bad.ipynb fails the part
    record = json.loads((out / "custom.json").read_text())
    assert gpu_check.validate_record(record) == []
    assert record["dry_run"] is True and record["status"] == "failed"
    assert record["label"].endswith("DRY RUN on the CPU")
    assert record["environment"]["tensorflow"] is None  # hidden
    assert record["host_rss_budget_mib"] == gpu_check.CPU_KERNEL_BUDGET_MIB
    steps = {s["name"]: s for s in record["steps"]}
    assert steps[str(good)]["status"] == "passed"
    assert 0 < steps[str(good)]["kernel_peak_rss_mib"] < gpu_check.CPU_KERNEL_BUDGET_MIB
    assert steps[str(bad)]["status"] == "failed"
    assert steps[str(bad)]["detail"] == "cell 2: AssertionError: x is 4"
    assert steps["pytest tests/gpu/test_ddp_nccl_gpu.py"]["status"] == "passed"
    assert steps["tests/gpu/test_ddp_nccl_gpu.py --selftest-cpu"]["status"] == "passed"
    executed = nbformat.read(out / "notebooks" / "good.ipynb", as_version=4)
    printed = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert "skipped: TensorFlow is not installed (No module named 'tensorflow')" in printed
    assert "(this cell needs TensorFlow)" in printed  # the tagged cell was skipped, not run
    assert "==== gpu-check part custom: FAILED" in done.stdout
    assert "host memory budget per kernel: 1536 MiB" in done.stdout
    assert not results.exists()  # a dry run never writes tests/gpu/results
    assert (out / "logs" / "custom.log").is_file()
    assert not (out / "hide-tensorflow").exists()


def _record(gpu_check, **changes) -> dict:
    env = {"python": "3.11.7", "cpu_count": 16, "gpus": [{"name": "NVIDIA H200",
                                                          "uuid": "GPU-1"}],
           "gpu_visibility": {"verdict": "usable", "message": "torch sees 1 GPU(s)"},
           "driver": "580.65.06", "torch": "2.13.0", "torch_cuda": "13.0", "cudnn": "92000",
           "tensorflow": None, "tf_cuda": None, "tf_cudnn": None, "cuda_libraries": {}}
    record = {"kind": gpu_check.PART_KIND, "schema_version": 1, "part": "gpu",
              "dry_run": False, "date": "2026-12-03T08:00:00Z", "label": "NVIDIA H200 ...",
              "status": "passed", "seconds": 12.5, "environment": env,
              "host_rss_budget_mib": 6144, "written": ["gpu-check-results/x/gpu.json"],
              "steps": [{"name": "pytest tests/gpu", "kind": "pytest", "status": "passed",
                         "seconds": 10.0, "log": "logs/gpu.log", "detail": "exit code 0"}]}
    record.update(changes)
    return record


def test_schema_accepts_a_complete_record(gpu_check):
    assert gpu_check.validate_record(_record(gpu_check)) == []


@pytest.mark.parametrize(("change", "problem"), [
    ({"dry_run": "no"}, "record.dry_run"),
    ({"kind": "something else"}, "kind: expected"),
    ({"status": "passed", "steps": [{"name": "n", "kind": "notebook", "status": "failed",
                                     "seconds": 1, "log": "l", "detail": "d",
                                     "kernel_peak_rss_mib": 800.0}]},
     "passed although a step failed"),
    ({"date": "yesterday"}, "date: 'yesterday'"),
    ({"steps": []}, "steps: empty"),
])
def test_schema_rejects_broken_records(gpu_check, change, problem):
    problems = gpu_check.validate_record(_record(gpu_check, **change))
    assert any(problem in p for p in problems), problems


def test_schema_wants_a_gpu_in_a_real_run_and_the_labels(gpu_check):
    record = _record(gpu_check)
    record["environment"]["gpus"] = []
    assert "a record that is not a dry run needs a GPU" in " ".join(
        gpu_check.validate_record(record))
    del record["environment"]["driver"]
    assert any("missing 'driver'" in p for p in gpu_check.validate_record(record))


def test_schema_of_results_recorded_by_gpu_tests(gpu_check):
    memory = {"kind": gpu_check.RECORDED_KIND, "script": "tests/gpu/test_memory_gpu.py",
              "date": "2026-12-03", "dry_run": False,
              "hardware": {"gpu": "NVIDIA H200", "driver": "580.65.06", "torch": "2.13.0"}}
    assert gpu_check.validate_record(memory) == []
    assert any("a recorded GPU result must come from a real GPU run" in p
               for p in gpu_check.validate_record({**memory, "dry_run": True}))
    del memory["hardware"]["driver"]
    assert gpu_check.validate_record(memory) == ["hardware: missing 'driver'"]
    throughput = {"kind": gpu_check.RECORDED_KIND, "script": "tests/gpu/throughput_gpu.py",
                  "date": "2026-12-03", "hardware": {"gpu": "NVIDIA H200", "driver": "580.1"},
                  "versions": {"torch": "2.13.0"}}
    assert gpu_check.validate_record(throughput) == []
    cpu_run = {**throughput, "hardware": {"cpu_cores": 2}}  # --device cpu: names no GPU
    assert "hardware: missing 'gpu'" in gpu_check.validate_record(cpu_run)


def test_every_committed_results_file_validates(gpu_check):
    for path in sorted(gpu_check.RESULTS_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        assert gpu_check.validate_record(data) == [], path.name


def test_a_part_that_passed_is_skipped_unless_forced(gpu_check, tmp_path, monkeypatch):
    record = _record(gpu_check, part="unit")
    (tmp_path / "unit.json").write_text(json.dumps(record))

    def no_probe(env):
        raise AssertionError("re-ran a part that had passed")

    monkeypatch.setattr(gpu_check, "probe_environment", no_probe)
    again = gpu_check.run_part("unit", [], out_dir=tmp_path, dry_run=False, force=False,
                               results_dir=None)
    assert again == record
    with pytest.raises(AssertionError, match="re-ran"):
        gpu_check.run_part("unit", [], out_dir=tmp_path, dry_run=False, force=True,
                           results_dir=None)
    (tmp_path / "unit.json").write_text(json.dumps({**record, "status": "failed"}))
    with pytest.raises(AssertionError, match="re-ran"):  # a failed part always re-runs
        gpu_check.run_part("unit", [], out_dir=tmp_path, dry_run=False, force=False,
                           results_dir=None)


def test_parts_cover_every_solutions_notebook_once(gpu_check):
    listed = [s for stems in gpu_check.NOTEBOOK_PARTS.values() for s in stems]
    assert sorted(listed) == sorted(p.stem for p in (ROOT / "solutions").glob("*.ipynb"))
    table = gpu_check.parts(dry_run=True, workers=1, out_dir=Path("/nonexistent"))
    assert list(table)[:3] == ["unit", "gpu-a", "gpu-b"]
    unit = table["unit"][0].command
    assert unit[unit.index("-m", 2) + 1] == "not browser and not gpu"
    in_parts = [f for part in gpu_check.GPU_PARTS for f in gpu_check.gpu_test_files(part)]
    assert sorted(in_parts) == sorted(
        f"tests/gpu/{p.name}" for p in (ROOT / "tests" / "gpu").glob("test_*.py"))
    dry = [s.command for part in gpu_check.GPU_PARTS for s in table[part]]
    assert [sys.executable, "tests/gpu/test_ddp_nccl_gpu.py", "--selftest-cpu"] in dry
    assert [sys.executable, gpu_check.THROUGHPUT, "--device", "cpu", "--quick", "--out",
            "/nonexistent/throughput-cpu.json"] in dry
    real = [s.command for part in gpu_check.GPU_PARTS for s in gpu_check.parts(False, 1)[part]]
    assert [sys.executable, gpu_check.THROUGHPUT] in real
    assert not any("--selftest-cpu" in c or "cpu" in c for c in real)


# ---------------------------------------------------------------- tests/gpu/conftest.py
FAKE_VERDICT = """
import helpers.core.gpu_visibility as gv
gv.gpu_visibility = lambda: gv.GpuVisibility({verdict!r}, {message!r})
"""


@pytest.mark.parametrize(("verdict", "expected"), [
    ("broken", "GPU visibility: BROKEN: driver 570 is too old"),
    ("hidden", "[GPU visibility: HIDDEN: CUDA_VISIBLE_DEVICES='' hides"),
])
def test_gpu_tests_fail_when_broken_and_skip_when_hidden(tmp_path, verdict, expected):
    message = ("driver 570 is too old" if verdict == "broken"
               else "CUDA_VISIBLE_DEVICES='' hides all 1 GPU(s) on purpose")
    (tmp_path / "fake_verdict.py").write_text(FAKE_VERDICT.format(verdict=verdict,
                                                                  message=message))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/gpu/test_ddp_nccl_gpu.py", "-m", "gpu", "-q",
         "-rEs", "-p", "fake_verdict", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
             "CUDA_VISIBLE_DEVICES": ""})  # as hidden as the fake verdict says
    assert expected in done.stdout, done.stdout + done.stderr
    if verdict == "broken":
        assert done.returncode == 1 and "1 error" in done.stdout
    else:
        assert done.returncode == 0 and "1 skipped" in done.stdout


def test_a_real_run_copies_its_record_for_committing(gpu_check, tmp_path, monkeypatch):
    """Not a dry run (the GPU stood in for by a probe answer): the record lands in the results
    folder as gpu-check-<part>.json, valid, labelled with the GPU and the budget for CUDA."""
    env = _record(gpu_check)["environment"]
    monkeypatch.setattr(gpu_check, "probe_environment", lambda child_env: env)
    step = gpu_check.Step("a step", "script", [sys.executable, "-c", "print('hello')"])
    results = tmp_path / "results"
    record = gpu_check.run_part("gpu-b", [step], out_dir=tmp_path / "out", dry_run=False,
                                force=False, results_dir=results)
    copy = json.loads((results / "gpu-check-gpu-b.json").read_text())
    assert copy == record and gpu_check.validate_record(copy) == []
    assert record["status"] == "passed" and record["dry_run"] is False
    assert record["host_rss_budget_mib"] == gpu_check.HOST_RSS_BUDGET_MIB
    assert record["label"].startswith("NVIDIA H200 (driver 580.65.06), torch 2.13.0 (CUDA 13.0")
    assert "hello" in (tmp_path / "out" / "logs" / "gpu-b.log").read_text()
    assert str(results / "gpu-check-gpu-b.json") in record["written"]


def test_tensorflow_gpu_kernel_part_skips_without_that_kernel(gpu_check, tmp_path, monkeypatch):
    """notebooks-tf runs lesson 02 in the TensorFlow GPU kernel, or says why it cannot."""
    steps = gpu_check.parts(dry_run=True, workers=1)["notebooks-tf"]
    assert [(s.notebook, s.kernel) for s in steps] == [
        ("solutions/02_tensorflow_gpu.ipynb", gpu_check.TF_KERNEL)]
    env = _record(gpu_check)["environment"]
    monkeypatch.setattr(gpu_check, "probe_environment", lambda child_env: env)
    monkeypatch.setattr(gpu_check, "kernel_installed", lambda name: name == "python3")
    record = gpu_check.run_part("notebooks-tf", steps, out_dir=tmp_path, dry_run=True,
                                force=False, results_dir=None)
    assert record["steps"][0]["status"] == "skipped"
    assert "'gpu-lessons-tf' is not installed" in record["steps"][0]["detail"]
    assert gpu_check.validate_record(record) == [], record.get("schema_problems")
    assert record["status"] == "skipped"  # nothing ran: never "passed" (review 4.4)


# ---------------------------------------------------------------- review C3: cuBLAS workspaces
HOPPER_WORKSPACE = 32 * 2**20  # PyTorch's cuBLAS workspace on compute capability 9.x


def test_memory_gpu_virtual_side_holds_the_cards_cublas_workspaces(memory_gpu):
    """On the real side, the cuBLAS workspaces of the training steps (forward thread and
    autograd's device thread) are allocations of the caching allocator and count against the
    256 MiB cap: on an H200 the MLP's largest batch is 3072, not 4608. The virtual side must
    hold the same workspaces, sized as the card's, or the two answers differ by ~24 grid
    steps on every GPU (turn-3 GPU review, C3)."""
    cap = memory_gpu.helpers.parse_capacity(memory_gpu.OOM_CAPACITY)
    assert memory_gpu.fits_virtual("mlp", 3072, cap, cublas_workspace=HOPPER_WORKSPACE)
    assert not memory_gpu.fits_virtual("mlp", 3136, cap, cublas_workspace=HOPPER_WORKSPACE)


def test_memory_gpu_real_side_makes_its_workspaces_inside_the_cap(memory_gpu, monkeypatch):
    """The real side frees the workspaces earlier checks left (empty_cache never does), caps
    the allocator, then runs the steps: their workspaces are made inside the cap, as the
    virtual side's are. Rehearsed on the CPU: the order of the calls."""
    calls = []
    torch = memory_gpu.torch
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces",
                        lambda: calls.append("clear workspaces"), raising=False)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device=None: calls.append(f"cap {fraction:.3f}"))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: type("P", (), {"total_memory": 2**30})())
    monkeypatch.setattr(memory_gpu, "cleanup", lambda: calls.append("cleanup"))
    monkeypatch.setattr(memory_gpu, "_two_steps_fit",
                        lambda name, batch, device: calls.append(f"steps {batch}") or True)
    assert memory_gpu.fits_real("mlp", 64, 2**28)
    assert calls.index("clear workspaces") < calls.index("cap 0.250") < calls.index("steps 64")
    assert calls[-2:] == ["cap 1.000", "cleanup"]


# ---------------------------------------------------------------- greens a GPU cannot earn
@pytest.mark.parametrize("verdict", ["hidden", "no-gpu", "broken"])
def test_a_real_part_fails_unless_a_gpu_is_usable(gpu_check, tmp_path, monkeypatch, verdict):
    """CUDA_VISIBLE_DEVICES="" (or a SLURM job without GPUs) hides the GPU: every GPU test
    skips, pytest exits 0, and NVML still names the GPU. Such a run must not pass, nor be
    recorded as that GPU's result (review 4.3)."""
    env = _record(gpu_check)["environment"]
    env["gpu_visibility"] = {"verdict": verdict, "message": "CUDA_VISIBLE_DEVICES='' hides"}
    monkeypatch.setattr(gpu_check, "probe_environment", lambda child_env: env)
    step = gpu_check.Step("a step", "script", [sys.executable, "-c", "print('hello')"])
    results = tmp_path / "results"
    record = gpu_check.run_part("gpu-b", [step], out_dir=tmp_path / "out", dry_run=False,
                                force=False, results_dir=results)
    assert record["status"] == "failed"
    assert f"GPU visibility is {verdict!r}" in " ".join(s["detail"] for s in record["steps"])
    assert gpu_check.validate_record(record) == [], record.get("schema_problems")
    assert not (results / "gpu-check-gpu-b.json").exists()  # never committed as GPU results


def test_a_part_whose_steps_all_skipped_is_skipped(gpu_check, tmp_path, monkeypatch):
    """Lesson 02 (or 05b, 08b) in a kernel without TensorFlow: every code cell is tagged
    'tensorflow' and skipped, so nothing ran. The step and the part say "skipped"."""
    nb = _notebook(tmp_path / "all_tf.ipynb", "import tensorflow as tf", "print(tf.ones(2))")
    import nbformat

    book = nbformat.read(nb, as_version=4)
    for cell in book.cells[1:]:
        cell.metadata["tags"] = ["tensorflow"]
    nbformat.write(book, nb)
    monkeypatch.setattr(gpu_check, "probe_environment",
                        lambda child_env: _record(gpu_check)["environment"])
    step = gpu_check.Step(str(nb), "notebook", notebook=str(nb))
    record = gpu_check.run_part("notebooks-a", [step], out_dir=tmp_path / "out", dry_run=True,
                                force=False, results_dir=None, hide_tf=True)
    assert record["steps"][0]["status"] == "skipped", record["steps"][0]
    assert "every code cell needs TensorFlow" in record["steps"][0]["detail"]
    assert record["status"] == "skipped"
    assert gpu_check.validate_record(record) == [], record.get("schema_problems")


def test_planner_results_have_the_recorded_results_schema(gpu_check, tmp_path, monkeypatch):
    """tests/gpu/test_planner_gpu.py's planner.json is committed with the other results: it
    must validate as a recorded GPU result (review C4: it was {script: entry}, no kind)."""
    planner_gpu = _load(ROOT / "tests" / "gpu" / "test_planner_gpu.py", "planner_gpu_under_test")
    monkeypatch.setattr(planner_gpu, "RESULTS", tmp_path / "planner.json")
    hardware = {"gpu": "NVIDIA H200", "driver": "580.65.06", "torch": "2.11.0"}
    monkeypatch.setattr(planner_gpu, "hardware", lambda: hardware, raising=False)
    for name in ("mlp_cuda_everywhere.py", "resnet_amp.py"):
        planner_gpu._record(name, {"args": [], "max_memory_allocated": 1, "planned": 1})
    data = json.loads((tmp_path / "planner.json").read_text())
    assert gpu_check.validate_record(data) == []
    assert sorted(data["cases"]) == ["mlp_cuda_everywhere.py", "resnet_amp.py"]


TF_TAGGED = ("import importlib.util\n"
             "assert importlib.util.find_spec('tensorflow'), 'this kernel has no TensorFlow'\n"
             "print('the TensorFlow cell ran')")


@pytest.mark.parametrize("kernel_has_tf", [True, False])
def test_run_notebook_skips_tensorflow_cells_by_the_kernels_interpreter(
        gpu_check, tmp_path, monkeypatch, kernel_has_tf):
    """notebooks-tf: the runner (.venv, or .venv-site without TensorFlow) is not the kernel's
    Python (gpu-lessons-tf: .venv-tf's). Here the kernel's interpreter is this Python behind a
    script that shows TensorFlow the runner's environment hides (a skip would be a false green),
    or hides the TensorFlow the runner sees (running the cell would fail)."""
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("needs TensorFlow in this environment (requirements.txt has it)")
    import nbformat

    folder = tmp_path / "interpreter"
    folder.mkdir()
    if kernel_has_tf:
        path = str(ROOT)  # the hiding sitecustomize of the runner's env dropped
    else:
        (folder / "sitecustomize.py").write_text(gpu_check.HIDE_TF)
        path = f"{folder}{os.pathsep}{ROOT}"
    python = folder / "python"
    python.write_text(f'#!/bin/sh\nexport PYTHONPATH="{path}"\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    fake_kernelspec(tmp_path / "jupyter", "fake-tf", python)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    nb_path = _notebook(tmp_path / "tf.ipynb", "x = 1")
    nb = nbformat.read(nb_path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(TF_TAGGED, metadata={"tags": ["tensorflow"]}))
    nbformat.write(nb, nb_path)
    out = tmp_path / "out"
    env = gpu_check.child_env(out, True, gpu_check.CPU_KERNEL_BUDGET_MIB,
                              hide_tf=kernel_has_tf)  # the runner's view: the opposite
    step = gpu_check.Step("tf.ipynb (kernel fake-tf)", "notebook", notebook=str(nb_path),
                          kernel="fake-tf")
    with (tmp_path / "log.txt").open("w") as log:
        result = gpu_check.run_notebook(step, env, log, out, gpu_check.CPU_KERNEL_BUDGET_MIB)
    log_text = (tmp_path / "log.txt").read_text()
    assert result["status"] == "passed", (result, log_text[-2000:])
    executed = nbformat.read(out / "notebooks" / "tf.ipynb", as_version=4)
    printed = "".join(o.get("text", "") for o in executed.cells[-1].outputs)
    if kernel_has_tf:
        assert printed == "the TensorFlow cell ran\n", (printed, log_text[-2000:])
    else:
        assert printed.startswith("skipped: TensorFlow is not installed (or hidden)"), printed


# ------------------------------------------------ the unit part in a lean environment
# sitecustomize.py for a child process: playwright (and its pytest plugin) are not installed,
# as in .venv-site on a cluster node (scripts/site_env.py never installs them): their modules
# are not found and their distributions (the plugin's entry point) are not listed
HIDE_PLAYWRIGHT = hiding_sitecustomize("playwright", "pytest_playwright")


def _collect_browser_tests_without_playwright(gpu_check, tmp_path, ci: str):
    """The unit part's own command, collecting tests/browser only, where playwright is absent."""
    (step,) = gpu_check.parts(dry_run=True, workers=2)["unit"]
    command = list(step.command)
    n = command.index("-n")
    del command[n:n + 2]  # one process: collection only
    command[command.index("tests")] = "tests/browser"
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE_PLAYWRIGHT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), str(ROOT)]), "CI": ci}
    return subprocess.run([*command, "--collect-only"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_unit_part_without_playwright_skips_the_browser_tests_naming_it(gpu_check, tmp_path):
    """A site environment has no playwright: the browser test files are skipped with that
    reason, not collection errors that fail the whole unit part after a full run."""
    done = _collect_browser_tests_without_playwright(gpu_check, tmp_path, ci="")
    out = done.stdout + done.stderr
    assert "ERROR" not in out and "errors during collection" not in out, out[-3000:]
    assert done.returncode in (0, 5), out[-3000:]  # 5: every test deselected (-m not browser)
    assert "SKIPPED" in out and "playwright is not installed" in out, out[-3000:]


def test_ci_without_playwright_still_fails_the_browser_tests(gpu_check, tmp_path):
    """CI=true is the full environment: a missing playwright is a broken setup, never a skip."""
    done = _collect_browser_tests_without_playwright(gpu_check, tmp_path, ci="true")
    out = done.stdout + done.stderr
    assert done.returncode not in (0, 5), out[-3000:]
    assert "playwright" in out and "SKIPPED" not in out, out[-3000:]


def test_a_part_stopped_by_a_time_limit_still_writes_its_record(gpu_check, tmp_path):
    """tests/gpu/first_run.sh gives each part a time limit (timeout sends SIGTERM): the part's
    record, with what ran and the step that was stopped, is what a 10-minute GPU run brings
    back. Without it, a part cut short left only its log."""
    import signal
    import time

    slow = tmp_path / "test_slow_gpu.py"
    slow.write_text("import time\nimport pytest\n\n\n@pytest.mark.gpu\n"
                    "def test_slow():\n    time.sleep(120)\n")
    out = tmp_path / "out"
    run = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--dry-run", "--out", str(out),
         "--gpu-tests", str(slow)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    log = out / "logs" / "custom.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
            log.is_file() and "==== pytest" in log.read_text()):
        time.sleep(0.5)
    time.sleep(3)  # pytest is running the slow test now
    run.send_signal(signal.SIGTERM)
    try:
        printed, _ = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 1, printed
    record = json.loads((out / "custom.json").read_text())
    assert record["status"] == "failed" and gpu_check.validate_record(record) == []
    step = record["steps"][0]
    assert step["status"] == "failed" and "stopped by SIGTERM" in step["detail"], step
    assert "stopped by SIGTERM" in printed
