"""Issue 33: a refusal changes nothing, counts that become processes or memory are bounded,
fake tensors are refused on devices this PyTorch lacks, and a rehearsed batch job leaves no
process behind."""

from __future__ import annotations

import random
import subprocess
import time

import numpy as np
import pytest
import torch

import helpers
from helpers.core import batch_job
from helpers.core.batch_job import rehearse_batch_job


# ---------------------------------------------------------------- setup(): all or nothing
def _state():
    return (random.getstate(), np.random.get_state()[1].tolist(), torch.initial_seed(),
            torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark)


@pytest.fixture
def restore_torch_flags():
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2:]


@pytest.mark.parametrize("kwargs", [
    {"deterministic": np.True_}, {"deterministic": np.False_},
    {"deterministic": np.False_, "benchmark": np.True_}, {"torch": np.True_},
])
def test_setup_takes_numpy_bools_as_bools(kwargs, restore_torch_flags):
    report = helpers.setup(seed=3, **kwargs)
    assert type(report.deterministic) is bool and type(report.benchmark) is bool
    assert torch.backends.cudnn.deterministic is report.deterministic
    assert torch.backends.cudnn.benchmark is report.benchmark


@pytest.mark.parametrize("kwargs", [
    {"seed": 5, "deterministic": "yes"}, {"seed": 5, "benchmark": 1},
    {"seed": 5, "deterministic": True, "benchmark": True}, {"seed": 5, "tensorflow": "no"},
    {"seed": 5, "torch": 0}, {"seed": -1},
])
def test_a_refused_setup_changes_nothing(kwargs, restore_torch_flags):
    helpers.setup(seed=1, deterministic=False)
    before = _state()
    with pytest.raises((TypeError, ValueError)):
        helpers.setup(**kwargs)
    assert _state() == before


# ---------------------------------------------------------- fake tensors on a missing device
@pytest.mark.skipif(torch.backends.cuda.is_built(), reason="this PyTorch is built with CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "mps", "xpu"])
def test_fake_tensors_on_a_device_this_torch_lacks_are_refused(device):
    kind = device.split(":")[0]
    if kind == "mps" and torch.backends.mps.is_built():
        pytest.skip("this PyTorch is built with MPS")
    if kind == "xpu" and torch.xpu._is_compiled():
        pytest.skip("this PyTorch is built with XPU")
    with pytest.raises(ValueError, match=rf"device='{kind}'.*not.*abort"):
        helpers.VirtualGPU("1 GiB", fake=True, device=device)
    with pytest.raises(ValueError, match=rf"device='{kind}'.*Use device='cpu'"):
        helpers.full_scale(device=device)
    helpers.VirtualGPU("1 GiB", device=device)  # counting real tensors of a kind is fine


@pytest.mark.skipif(torch.backends.cuda.is_built(), reason="this PyTorch is built with CUDA")
def test_fake_cuda_is_refused_under_simulated_cuda_too():
    with helpers.SimulatedCuda():  # torch.version.cuda and pick_device() say CUDA here
        with pytest.raises(ValueError, match=r"pick_device\(\)'s choice"):
            helpers.VirtualGPU("1 GiB", fake=True)
        with pytest.raises(ValueError, match="device='cuda'"):
            helpers.full_scale()


def test_fake_tensors_on_cpu_and_meta_still_work():
    for device in ("cpu", "meta"):
        with helpers.VirtualGPU("1 GiB", fake=True, device=device) as gpu:
            torch.nn.Linear(4, 4)(torch.ones(2, 4))
        assert gpu.peak_allocated_bytes > 0


# ------------------------------------------------------------------------------- bounds
def test_num_workers_and_prefetch_factor_are_bounded():
    x, y = helpers.classification_data(16, 2, 2)
    with pytest.raises(ValueError, match=r"num_workers must be at most \d+") as refused:
        helpers.torch_loader(x, y, num_workers=2**31)  # forked workers until memory ran out
    assert f"at most {helpers.core.data.most_workers()}," in str(refused.value)
    with pytest.raises(ValueError, match="num_workers must be at least 0"):
        helpers.torch_loader(x, y, num_workers=-1)
    with pytest.raises(TypeError, match="num_workers"):
        helpers.torch_loader(x, y, num_workers=1.5)
    with pytest.raises(ValueError, match="prefetch_factor must be at most 64"):
        helpers.torch_loader(x, y, num_workers=1, prefetch_factor=2**40)
    assert helpers.torch_loader(x, y, num_workers=np.int64(0)).num_workers == 0


def test_simulated_cuda_device_count_is_bounded():
    # 1025, not 2**31: before the bound, 2**31 hung (a simulated device each)
    with pytest.raises(ValueError, match="device_count must be at most 1024"):
        helpers.SimulatedCuda(device_count=1025)
    assert helpers.SimulatedCuda(device_count=8).device_count == 8


def test_classification_data_n_classes_is_bounded():
    with pytest.raises(ValueError, match="n_classes, n_features .* more than 1,073,741,824"):
        helpers.classification_data(n_classes=2**31)


# ------------------------------------------------------ rehearse_batch_job leaves nothing
def _sleeper(pid_file) -> str:
    return f"#!/bin/bash\nsleep 60 &\necho $! > {pid_file}\nsleep 60 &\n"


def test_a_job_s_background_processes_are_ended(tmp_path):
    pid_file = tmp_path / "pid"
    result = rehearse_batch_job(_sleeper(pid_file) + "echo done\n")
    assert result.returncode == 0 and "done" in result.output
    assert not batch_job._alive(int(pid_file.read_text()))


def test_an_error_or_timeout_ends_the_job_s_processes(tmp_path):
    pid_file = tmp_path / "pid"
    with pytest.raises(TimeoutError):
        rehearse_batch_job(_sleeper(pid_file) + "wait\n", timeout=0.3)
    assert not batch_job._alive(int(pid_file.read_text()))


def test_ctrl_c_ends_the_job(tmp_path, monkeypatch):
    pid_file = tmp_path / "pid"
    real_wait = subprocess.Popen.wait

    def interrupted(self, timeout=None):
        if timeout is not None and timeout > 5:  # the wait for the job: Ctrl-C in it
            deadline = time.monotonic() + 5
            while not pid_file.exists() or not pid_file.read_text().strip():
                assert time.monotonic() < deadline, "the job did not start its sleeps"
                time.sleep(0.02)
            raise KeyboardInterrupt
        return real_wait(self, timeout=timeout)

    monkeypatch.setattr(subprocess.Popen, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rehearse_batch_job(_sleeper(pid_file) + "wait\n", timeout=30)
    monkeypatch.undo()
    assert not batch_job._alive(int(pid_file.read_text()))


def test_binary_files_come_back_as_bytes():
    script = "#!/bin/bash\nprintf '\\x80\\x00\\xff' > blob.bin\necho hi > note.txt\n"
    result = rehearse_batch_job(script)
    assert result.files == {"blob.bin": b"\x80\x00\xff", "note.txt": "hi\n"}


# ------------------------------------------------------------------------ smaller ones
@pytest.mark.parametrize(("value", "error"), [
    (float("inf"), ValueError), (float("nan"), ValueError), (-1, ValueError),
    (1.5, ValueError), (2**64, ValueError), ("1 GiB", TypeError),
])
def test_fake_nvml_this_process_bytes_is_checked_before_any_change(value, error):
    from helpers.core.fake_nvml import FakeGpu, FakeNvml

    gpu = FakeGpu()
    with pytest.raises(error, match="this_process_bytes"):
        FakeNvml(gpu, this_process_bytes=value)
    assert gpu.uuid is None and list(gpu.processes) == []
    assert FakeNvml(FakeGpu(), this_process_bytes=2e9).gpus[0].processes[-1][1] == 2 * 10**9


def test_plot_timeline_names_ax_when_given_an_array_of_axes():
    import matplotlib.pyplot as plt

    with helpers.VirtualGPU("1 GiB", device="cpu"):
        report = helpers.measure_step(lambda: torch.ones(256) * 2)
    fig, axes = plt.subplots(1, 2)
    try:
        with pytest.raises(TypeError, match=r"ax must be a matplotlib Axes.*axes\[0\]"):
            report.plot_timeline(ax=axes)
        with pytest.raises(TypeError, match="legend"):
            report.plot_timeline(ax=axes[0], legend="yes")
        assert report.plot_timeline(ax=axes[0]) is fig
    finally:
        plt.close(fig)


def test_check_training_refuses_the_meta_device_up_front():
    from helpers import oom

    with pytest.raises(ValueError, match="device must be a device that computes.*'meta'"):
        helpers.check_training(oom.original_step, batch_size=2, device="meta")


def test_a_timeline_without_tensor_categories_still_plots():
    import matplotlib.pyplot as plt

    report = helpers.measure_step(lambda: None)  # outside a VirtualGPU: nothing counted
    fig = report.plot_timeline()  # was numpy's "need at least one array to concatenate"
    plt.close(fig)


@pytest.mark.parametrize("what", ["skipped", "notes"])
def test_compare_names_a_skipped_or_notes_that_is_not_a_mapping(what):
    with pytest.raises(TypeError, match=rf"{what} must be a dict"):
        helpers.compare({"a": lambda: 10}, rounds=1, **{what: 5})


# ------------------------------------------ the fuzz harness's last hard failures (issue 33)
def test_synthetic_images_sizes_are_bounded():
    """size=2**31 or channels=2**31 raised RuntimeError from the allocator."""
    for kwargs, words in (({"channels": 2**31}, "channels must be at most 1024"),
                          ({"size": 2**31}, "size must be at most 16384"),
                          ({"size": 16384, "channels": 1024}, "at most 1 GiB an image")):
        with pytest.raises(ValueError, match=words):
            helpers.SyntheticImages(4, **kwargs)


def test_compare_rounds_is_bounded():
    """compare(rounds=2**31) ran for ever."""
    with pytest.raises(ValueError, match="rounds must be at most 1000"):
        helpers.compare({"a": lambda: 1}, rounds=2**31)


def test_an_index_out_of_range_is_an_index_error_and_a_value_error():
    """SlowDataset.load_batch([10**400]) raised a bare IndexError; it is still one (the
    Dataset protocol) and also the ValueError a bad argument gets."""
    data = helpers.SlowDataset(8, 4, 2, latency_s=0.0)
    for bad in ([10**30], 2**63, -9):
        with pytest.raises(ValueError, match="out of range for a data set of 8 samples"):
            data.load_batch(bad)
    with pytest.raises(IndexError):
        data[8]


def test_a_checkpoint_file_name_longer_than_the_file_system_allows(tmp_path):
    """A 256-byte file name raised OSError(ENAMETOOLONG) from save and load."""
    model = torch.nn.Linear(2, 2)
    path = tmp_path / ("n" * 256)
    with pytest.raises(ValueError, match="file name is 256 bytes long"):
        helpers.save_checkpoint(path, model=model, epoch=1)
    with pytest.raises(ValueError, match="at most 255 bytes"):
        helpers.load_checkpoint(path, model=model)


def test_the_planner_refuses_a_fifo_without_reading_it(tmp_path):
    """`python -m helpers.fit <fifo>` blocked on reading the FIFO for the script's options."""
    import os

    from helpers.fit import script_options

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert script_options(str(fifo)) == set()  # returns at once: nothing is read
