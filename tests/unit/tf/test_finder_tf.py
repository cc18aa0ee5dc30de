"""The finder's TensorFlow side (helpers/tf/finder.py): Keras detection without importing
TensorFlow, where a Keras step's memory is measured, and the Keras state restored after every
trial; with stand-ins for TensorFlow and Keras, and once for real (slow)."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest
import torch

import helpers
from helpers.core.fake_nvml import FakeGpu, FakeNvml
from helpers.tf import finder

MiB, GiB = 2**20, 2**30
ResourceExhaustedError = type("ResourceExhaustedError", (Exception,), {
    "__module__": "tensorflow.python.framework.errors_impl"})


class Model:  # a stand-in keras.Model: its weights, as numpy arrays
    def __init__(self):
        self.w = [np.zeros(3, np.float32), np.ones(2, np.float32)]

    def get_weights(self):
        return [w.copy() for w in self.w]

    def set_weights(self, weights):
        self.w = [w.copy() for w in weights]


class Variable:
    def __init__(self, value):
        self.value = np.asarray(value, np.float32)

    def numpy(self):
        return self.value.copy()

    def assign(self, value):
        self.value = np.asarray(value, np.float32).copy()


class Optimizer:  # a stand-in keras.optimizers.Optimizer
    def __init__(self):
        self.variables = [Variable(0.0)]


class FakeTensorFlow(types.ModuleType):
    """TensorFlow's allocator statistics, for a step whose memory grows by ``per_sample``."""

    def __init__(self, gpus=0, fixed=4 * MiB, per_sample=64 * 1024):
        super().__init__("tensorflow")
        self.fixed, self.per_sample, self.limit = fixed, per_sample, None
        self.current, self.peak = fixed, fixed
        gpu = [types.SimpleNamespace(name="/physical_device:GPU:0")] * gpus
        self.config = types.SimpleNamespace(
            list_physical_devices=lambda kind=None: gpu if kind == "GPU" else [],
            experimental=types.SimpleNamespace(get_memory_info=self.info,
                                               reset_memory_stats=self.reset))

    def info(self, device):
        return {"current": self.current, "peak": self.peak}

    def reset(self, device):
        self.peak = self.current

    def step(self, b):
        need = self.fixed + self.per_sample * b
        if self.limit is not None and need > self.limit:
            raise ResourceExhaustedError(f"\x1b[31mOOM when allocating tensor of {need}\x1b[0m")
        self.peak = max(self.peak, need)


@pytest.fixture
def keras(monkeypatch):
    """A stand-in Keras (and TensorFlow) in sys.modules, as after `import keras`."""
    fake = types.ModuleType("keras")
    fake.Model, fake.optimizers = Model, types.SimpleNamespace(Optimizer=Optimizer)
    tf = FakeTensorFlow()
    monkeypatch.setitem(sys.modules, "keras", fake)
    monkeypatch.setitem(sys.modules, "tensorflow", tf)
    return tf


def test_keras_kind_looks_only_at_keras_modules_already_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "keras", raising=False)
    monkeypatch.delitem(sys.modules, "tf_keras", raising=False)
    assert finder.keras_kind(Model()) is None
    assert "keras" not in sys.modules  # nothing was imported to ask
    monkeypatch.setitem(sys.modules, "keras", None)  # blocked: still no answer, no error
    assert finder.keras_kind(Model()) is None


def test_keras_kind_knows_models_and_optimizers(keras):
    assert finder.keras_kind(Model()) == "model"
    assert finder.keras_kind(Optimizer()) == "optimizer"
    assert finder.keras_kind(torch.nn.Linear(2, 2)) is None
    assert finder.keras_kind("adam") is None


def test_find_batch_size_measures_a_keras_step_with_tensorflows_allocator(keras, monkeypatch):
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "true")
    monkeypatch.setenv("TF_CPU_BFC_MEM_LIMIT_IN_MB", "64")
    keras.limit = 64 * MiB
    model, opt = Model(), Optimizer()

    def step(b):  # trains: changes the weights and the optimizer's variables
        keras.step(b)
        model.w = [w + 1 for w in model.w]
        opt.variables[0].assign(opt.variables[0].numpy() + 1)

    r = helpers.find_batch_size(step, model=model, optimizer=opt)
    assert r.device == "TensorFlow CPU:0" and r.capacity_bytes == 64 * MiB
    largest = (r.budget_bytes - keras.fixed) // keras.per_sample
    assert r.batch_size == largest // 8 * 8  # exactly linear: the line finds it
    assert r.n_trials <= 6, r.text()
    assert [w.tolist() for w in model.w] == [[0, 0, 0], [1, 1]]  # restored after every trial
    assert opt.variables[0].numpy() == 0


def test_a_keras_out_of_memory_error_is_part_of_the_search(keras):
    keras.limit = 8 * MiB
    r = helpers.find_batch_size(keras.step, model=Model(), optimizer=Optimizer(),
                                capacity="1 GiB", start=256, margin=0)
    oom = [t for t in r.trials if t.oom]
    assert oom and oom[0].error.startswith("ResourceExhaustedError: OOM when allocating")
    assert r.trial(r.batch_size).fits and r.batch_size <= (4 * MiB) // keras.per_sample


def test_keras_memory_on_a_gpu_takes_the_capacity_from_nvml(keras):
    keras.config.list_physical_devices = lambda kind=None: [object()] if kind == "GPU" else []
    with FakeNvml(FakeGpu(total_bytes=24 * GiB, used_bytes=2 * GiB)):
        source, capacity, other = finder.keras_memory()
    assert source.name == "TensorFlow GPU:0" and capacity == 24 * GiB
    assert other == 2 * GiB - keras.fixed  # what TensorFlow does not hold
    assert finder.keras_memory(capacity=GiB)[1:] == (GiB, 0)  # a given capacity wins


@pytest.mark.parametrize("env, limit", [
    ({}, None), ({"TF_CPU_ALLOCATOR_USE_BFC": "true"}, None),
    ({"TF_CPU_ALLOCATOR_USE_BFC": "TRUE", "TF_CPU_BFC_MEM_LIMIT_IN_MB": "16"}, 16 * MiB),
    ({"TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPU_BFC_MEM_LIMIT_IN_MB": "lots"}, None),
    ({"TF_CPU_ALLOCATOR_USE_BFC": "false", "TF_CPU_BFC_MEM_LIMIT_IN_MB": "16"}, None),
])
def test_tf_cpu_limit_reads_the_bfc_allocators_settings(monkeypatch, env, limit):
    for name in ("TF_CPU_ALLOCATOR_USE_BFC", "TF_CPU_BFC_MEM_LIMIT_IN_MB"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert finder._tf_cpu_limit() == limit


# made before the stand-in TensorFlow is installed (torch's first optimizer imports
# torch._dynamo, which asks importlib about a "tensorflow" module)
TORCH_MODEL = torch.nn.Linear(2, 2)
TORCH_OPTIMIZER = torch.optim.SGD(TORCH_MODEL.parameters(), lr=0.1)


@pytest.mark.parametrize("pair", ["keras model, torch optimizer", "torch model, keras one"])
def test_a_model_and_an_optimizer_of_different_frameworks_are_refused(keras, pair):
    model, optimizer = (Model(), TORCH_OPTIMIZER) if pair.startswith("keras") \
        else (TORCH_MODEL, Optimizer())
    with pytest.raises(TypeError, match="model and optimizer must both be"):
        helpers.find_batch_size(lambda b: None, model=model, optimizer=optimizer, maximum=64)


# ---------------------------------------------------------------- TensorFlow, for real
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                    reason="TensorFlow is not installed (a PyTorch-only GPU node)")
def test_tensorflow_runs_out_of_memory_for_real_on_the_cpu():
    """TensorFlow's CPU allocator with a limit raises a real ResourceExhaustedError; a real
    Keras model and optimizer are recognised as Keras ones."""
    code = textwrap.dedent("""
        import os
        os.environ.update(TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS="0",
                          TF_CPU_ALLOCATOR_USE_BFC="true", TF_CPU_BFC_MEM_LIMIT_IN_MB="16")
        import json
        import numpy as np
        import tensorflow as tf
        import helpers
        from helpers.tf.finder import keras_kind
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential([tf.keras.Input((128,)),
                                     tf.keras.layers.Dense(256, activation="relu"),
                                     tf.keras.layers.Dense(10)])
        opt = tf.keras.optimizers.Adam()
        loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        def step(b):
            x = tf.random.normal((b, 128))
            y = tf.zeros((b,), tf.int32)
            with tf.GradientTape() as tape:
                value = loss(y, model(x, training=True))
            grads = tape.gradient(value, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        step(8)  # build the optimizer's slots
        weights = [w.copy() for w in model.get_weights()]
        # each out-of-memory error costs 10 s: TensorFlow's allocator waits that long for
        # memory to be freed before it gives up; start above the limit, close coarsely
        r = helpers.find_batch_size(step, model=model, optimizer=opt, margin=0, start=4000,
                                    tolerance=0.25)
        same = all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights()))
        print(json.dumps({"batch": r.batch_size, "device": r.device, "same": same,
                          "cap": r.capacity_bytes, "kinds": [keras_kind(model), keras_kind(opt)],
                          "errors": [t.error for t in r.trials if t.oom]}))
    """)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["kinds"] == ["model", "optimizer"]
    assert res["device"] == "TensorFlow CPU:0" and res["cap"] == 16 * MiB
    assert res["errors"]
    assert all(e.startswith("ResourceExhaustedError: OOM when allocating tensor")
               for e in res["errors"]), res["errors"]
    assert 1000 < res["batch"] < 4000
    assert res["same"]
