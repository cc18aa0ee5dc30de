"""scripts/cuda_coverage.py: which lines count as CUDA-only (the rule in its docstring)."""

from __future__ import annotations

import os
import textwrap

from script_loader import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
cuda_coverage = load_script("cuda_coverage")

SOURCE = textwrap.dedent('''\
    import torch

    def f(device, x):
        if device.type == "cuda":
            torch.cuda.synchronize()          # 5
        else:
            print("cpu")                      # 7
        if not torch.cuda.is_available():
            return None
        n = torch.cuda.device_count()         # 10
        if isinstance(n, bool) or x < 0:
            raise ValueError("x")             # 12
        if kind in ("cpu", "cuda", "mps"):
            print(kind)                       # 14
        return n                              # 15

    def g(nv):
        try:
            nv.query()
        except nv.NVMLError:
            return "unsupported"              # 21
        ok, why = nvml_status()
        if ok or x:
            print(why)                        # 24
        if ok and x:
            print(why)                        # 26
        y = _helper() if torch.cuda.is_available() else 0
        return y

    def _helper():
        return 1                              # 31

    def h():
        with torch.cuda.device(1):
            _private()                        # 35

    def _private():
        return 2                              # 38

    def v(n, kind):
        n = torch.cuda.device_count()
        if isinstance(n, bool) or n < 0:
            raise ValueError("n")             # 43
        if kind in ("cpu", "cuda"):
            print(kind)                       # 45
    ''')


def test_the_rule_finds_cuda_branches_and_nothing_else():
    lines, one_line, why = cuda_coverage.cuda_lines(SOURCE, "nvml_free.py")
    statements = {5, 7, 10, 12, 14, 15, 21, 24, 26, 31, 35, 38, 43, 45} & lines
    assert statements == {5, 10, 12, 14, 15, 21, 26, 31, 35, 38}
    # not: the CPU side (7), "ok or x" (24), a type check (43), a kind among several (45)
    assert one_line == [27]  # line coverage cannot tell its sides apart
    assert why[10] == "after an early exit on a negated CUDA condition"
    assert why[21] == "NVML exception handler"
    assert why[31] == "_helper is only used on CUDA-only lines"
    assert why[35] == "body of a CUDA with-block"


def test_list_mode_prints_every_file_and_a_total(capsys):
    assert cuda_coverage.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "helpers/core/nvml.py" in out and out.rstrip().splitlines()[-1].startswith("total: ")
    assert "helpers/core/fake_nvml.py" not in out  # the stand-ins are tools, not CUDA code


def test_min_fails_below_the_floor(tmp_path, capsys):
    import coverage

    data = coverage.CoverageData(basename=str(tmp_path / ".coverage"))
    data.add_lines({os.path.join(ROOT, "helpers", "nvml.py"): [1]})  # no CUDA-only line ran
    data.write()
    assert cuda_coverage.main(["--data-file", str(tmp_path / ".coverage"), "--min", "0.8"]) == 1
    out = capsys.readouterr().out
    assert "CUDA rehearsal coverage: 0 of " in out and "below the floor --min 80%" in out
    assert cuda_coverage.main(["--data-file", str(tmp_path / ".coverage"), "--min", "0"]) == 0
