"""Rehearsal of scripts/tf_memory_modes.py's GPU branch (lesson 02): each process applies
exactly one memory mode, reads it back, and NVML shows when the memory was taken.

The stand-in TensorFlow follows TensorFlow 2.21's rules (tensorflow/python/eager/context.py):
growth on a device with virtual devices is a ValueError, and either setting changed after the
GPU devices are initialised is a RuntimeError. It records every setting that took; the fake
NVML's card takes what a real one would at the first operation.
"""

from __future__ import annotations

import os
import sys
import types

import pytest
from script_loader import load_script

from helpers.core.fake_nvml import FakeGpu, FakeNvml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB, GiB = 2**20, 2**30
CONTEXT = 500 * MiB  # a CUDA context, roughly


modes = load_script("tf_memory_modes")


class LogicalDeviceConfiguration(types.SimpleNamespace):
    def __init__(self, memory_limit=None):
        super().__init__(memory_limit=memory_limit)


class FakeTensorFlow(types.ModuleType):
    """tf.config's memory settings with TensorFlow 2.21's checks. ``applied`` lists the settings
    that took, ``env_at_start`` what TF_FORCE_GPU_ALLOW_GROWTH was when TensorFlow started;
    the first operation takes GPU 0's memory on ``card`` as the settings say."""

    def __init__(self, card: FakeGpu | None = None, n_gpus: int = 2):
        super().__init__("tensorflow")
        self.card = card
        self.gpus = [types.SimpleNamespace(name=f"/physical_device:GPU:{i}", device_type="GPU")
                     for i in range(n_gpus)]
        self.cpu = types.SimpleNamespace(name="/physical_device:CPU:0", device_type="CPU")
        self.growth, self.virtual, self.applied = {}, {}, []
        self.initialised, self.env_at_start, self.ops = False, "unread", []
        self.config = types.SimpleNamespace(
            list_physical_devices=self.physical, list_logical_devices=self.logical,
            LogicalDeviceConfiguration=LogicalDeviceConfiguration,
            set_logical_device_configuration=self.set_logical,
            get_logical_device_configuration=lambda dev: self.virtual.get(dev.name),
            experimental=types.SimpleNamespace(
                set_memory_growth=self.set_growth,
                get_memory_growth=lambda dev: self.growth.get(dev.name, False)))

    def physical(self, kind=None):
        if self.env_at_start == "unread":
            self.env_at_start = os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH")
        return {None: [self.cpu, *self.gpus], "GPU": self.gpus, "CPU": [self.cpu]}[kind]

    def logical(self, kind=None):
        if not self.initialised and self.card is not None:
            self.card.used_bytes += CONTEXT
        self.initialised = True
        return self.physical(kind)

    def set_growth(self, dev, enable):
        if dev.name in self.virtual:
            raise ValueError("Cannot set memory growth on device when virtual devices configured")
        if dev.device_type != "GPU":
            raise ValueError("Cannot set memory growth on non-GPU and non-Pluggable devices")
        if self.initialised:
            raise RuntimeError("Physical devices cannot be modified after being initialized")
        self.growth[dev.name] = enable
        self.applied.append(("growth", dev.name))

    def set_logical(self, dev, configs):
        if self.initialised:
            raise RuntimeError("Virtual devices cannot be modified after being initialized")
        self.virtual[dev.name] = list(configs)
        self.applied.append(("limit", dev.name))

    def device(self, name):
        self.logical()
        self.ops.append(name)
        if self.card is not None and len(self.ops) == 1:  # the first allocation on GPU 0
            gpu0 = self.gpus[0].name
            growth = self.growth.get(gpu0) or os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH")
            limits = self.virtual.get(gpu0)
            free = self.card.total_bytes - self.card.used_bytes
            pool = limits[0].memory_limit * MiB if limits else free * 9 // 10  # default: ~all
            self.card.used_bytes += 2 * MiB if growth else pool
        return _Scope()

    def zeros(self, shape):
        return _Tensor()


class _Scope:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Tensor:
    def __add__(self, other):
        return self

    def numpy(self):
        return 0


@pytest.fixture
def card():
    gpu = FakeGpu("NVIDIA H200", used_bytes=0)
    with FakeNvml([gpu]):
        yield gpu


@pytest.fixture
def fake_tf(monkeypatch, card):
    tf = FakeTensorFlow(card)
    monkeypatch.setitem(sys.modules, "tensorflow", tf)
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "true")  # as helpers.setup leaves it
    return tf


@pytest.mark.parametrize("mode", ["growth", "limit"])
def test_a_process_applies_exactly_its_one_mode(mode, fake_tf, capsys):
    assert modes.main([mode]) == 0
    out = capsys.readouterr().out
    assert fake_tf.applied == [(mode, "/physical_device:GPU:0"), (mode, "/physical_device:GPU:1")]
    assert fake_tf.env_at_start is None  # removed before TensorFlow started
    assert "TF_FORCE_GPU_ALLOW_GROWTH=true removed from this process" in out
    applied = [line for line in out.splitlines() if line.startswith("applied: ")]
    assert len(applied) == 2 and all(line.startswith(f"applied: {mode}: ") for line in applied)
    want = {"growth": "memory growth True, logical devices none",
            "limit": "memory growth False, logical devices ['1024 MiB']"}[mode]
    assert f"read back: GPU:0 {want}" in out and f"read back: GPU:1 {want}" in out
    assert fake_tf.ops == ["/GPU:0"] and "NOT APPLIED" not in out


def test_nvml_shows_the_memory_taken_at_initialisation_not_at_import(fake_tf, capsys):
    assert modes.main(["limit"]) == 0
    rows = dict(line.rsplit(None, 2)[0:1] + [" ".join(line.rsplit(None, 2)[1:])]
                for line in capsys.readouterr().out.splitlines()
                if line.startswith(("before", "after")))
    assert rows == {"before import tensorflow": "~0 MiB", "after import tensorflow": "~0 MiB",
                    "after the GPU devices are initialised": "~500 MiB",  # the context
                    "after the first operation": "~1,524 MiB"}  # + the 1024 MiB pool


def test_default_mode_sets_nothing_and_takes_nearly_the_whole_card(fake_tf, card, capsys):
    assert modes.main(["default"]) == 0
    out = capsys.readouterr().out
    assert fake_tf.applied == [] and "applied:" not in out and "NOT APPLIED" not in out
    assert card.used_bytes > card.total_bytes * 0.8


def test_a_limit_whose_pool_grows_is_reported(fake_tf, monkeypatch, capsys):
    """With TF_FORCE_GPU_ALLOW_GROWTH left in place the 1024 MiB pool would grow on demand:
    the NVML check catches it."""
    monkeypatch.setattr(modes, "FORCE_GROWTH", "NOT_THE_VARIABLE")  # leaves it in place
    assert modes.main(["limit"]) == 1
    assert "NOT APPLIED: limit: only 502 MiB taken by the first operation" in (
        capsys.readouterr().out)


def test_a_setting_that_did_not_take_fails_the_run(fake_tf, capsys):
    fake_tf.config.experimental.set_memory_growth = lambda dev, enable: None  # silently ignored
    assert modes.main(["growth"]) == 1
    assert "NOT APPLIED: GPU:0: memory growth is False, mode growth wants True" in (
        capsys.readouterr().out)


def test_the_fake_keeps_tensorflows_rules():
    """What the script avoids, in TensorFlow 2.21's words."""
    tf = FakeTensorFlow(n_gpus=1)
    gpu = tf.gpus[0]
    tf.config.set_logical_device_configuration(gpu, [LogicalDeviceConfiguration(1024)])
    with pytest.raises(ValueError, match="virtual devices configured"):
        tf.config.experimental.set_memory_growth(gpu, True)
    tf.config.list_logical_devices()
    with pytest.raises(RuntimeError, match="cannot be modified after being initialized"):
        tf.config.set_logical_device_configuration(gpu, [LogicalDeviceConfiguration(2048)])


def test_without_nvml_the_settings_are_still_read_back(fake_tf, monkeypatch, capsys):
    monkeypatch.setattr(modes, "_nvml_used", lambda: None)  # no driver library, say
    assert modes.main(["limit", "--mib", "2048"]) == 0
    out = capsys.readouterr().out
    assert "read back: GPU:0 memory growth False, logical devices ['2048 MiB']" in out
    assert out.rstrip().endswith("NVML not available: no memory figures")
