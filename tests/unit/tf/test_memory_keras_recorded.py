"""measure_keras_step (TensorFlow, in a subprocess) and recorded_gpu_results."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

import helpers
from helpers.core import recorded

KERAS_SCRIPT = textwrap.dedent("""
    import json, os
    import helpers
    helpers.setup(seed=0, tensorflow=True)
    import numpy as np
    import tensorflow as tf
    from helpers.tf import keras as mk

    def build(policy):
        tf.keras.mixed_precision.set_global_policy(policy)
        inp = tf.keras.Input((32,))
        h = tf.keras.layers.Dense(256, activation="relu")(inp)
        h = tf.keras.layers.Dense(256, activation="relu")(h)
        out = tf.keras.layers.Dense(4, dtype="float32")(h)
        return tf.keras.Model(inp, out)

    x = np.random.randn(512, 32).astype("float32")
    y = np.random.randint(0, 4, 512)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    out = {}
    m = build("float32")
    r = helpers.measure_keras_step(m, x, y, loss=loss, optimizer=tf.keras.optimizers.Adam(),
                                   steps=2)
    out["fp32"] = r.to_dict()
    out["text"] = r.text()
    out["weights"] = int(sum(np.prod(v.shape) * 4 for v in m.weights))
    b = build("mixed_bfloat16")
    out["bf16"] = helpers.measure_keras_step(b, x, y, loss=loss, optimizer="sgd").to_dict()
    tf.keras.mixed_precision.set_global_policy("float32")
    m.compile(optimizer="sgd", loss=loss)
    out["compiled"] = helpers.measure_keras_step(m, x, y).peak_bytes is not None
    errors = []
    for kwargs in ({"model": "net"}, {"steps": 0}, {"device": "TPU:0"}):
        args = {"model": m, "loss": loss, "optimizer": "sgd", **kwargs}
        try:
            helpers.measure_keras_step(args.pop("model"), x, y, **args)
        except (TypeError, ValueError) as e:
            errors.append(str(e))
    out["errors"] = errors
    def no_stats(device):
        raise ValueError("Allocator stats not available")
    tf.config.experimental.get_memory_info = no_stats
    out["no_stats"] = helpers.measure_keras_step(m, x, y).text()
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def keras_results():
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed (a PyTorch-only GPU node)")
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true"}
    done = subprocess.run([sys.executable, "-c", KERAS_SCRIPT], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_keras_report_measures_and_breaks_down(keras_results):
    fp32 = keras_results["fp32"]
    cats = fp32["category_max"]
    assert cats["parameters"] == keras_results["weights"]
    assert cats["gradients"] == keras_results["weights"]  # all weights are trainable
    # Adam: two slots per weight (m, v) plus its iteration counter and learning rate
    assert 2 * keras_results["weights"] <= cats["optimizer_state"] <= \
        2 * keras_results["weights"] + 64
    assert cats["activations"] == 512 * (256 + 256 + 4) * 4  # every Dense output, float32
    assert cats["inputs"] == 512 * 32 * 4 + 512 * 8
    assert fp32["peak_bytes"] > fp32["baseline_bytes"] > 0
    assert len(fp32["step_peaks"]) == 2 and all(i > 0 for i in fp32["step_increases"])
    assert "measured peak" in keras_results["text"] and "analytic total" in keras_results["text"]
    assert [la["shape"] for la in fp32["layers"]] == [[512, 256], [512, 256], [512, 4]]


def test_keras_mixed_bfloat16_halves_hidden_activations(keras_results):
    bf16 = keras_results["bf16"]
    assert bf16["policy"] == "mixed_bfloat16"
    # hidden layers compute in bfloat16; the float32 output layer stays float32
    assert bf16["category_max"]["activations"] == 512 * (256 + 256) * 2 + 512 * 4 * 4
    assert keras_results["compiled"]


def test_keras_bad_input_and_missing_statistics(keras_results):
    errors = keras_results["errors"]
    assert "tf.keras.Model" in errors[0] and "at least 1" in errors[1] and "GPU:0" in errors[2]
    assert "not available" in keras_results["no_stats"]
    assert "TF_CPU_ALLOCATOR_USE_BFC=true" in keras_results["no_stats"]


# ---------------------------------------------------------------- recorded GPU results
def test_no_recorded_results_means_none(tmp_path):
    assert helpers.recorded_gpu_results("memory", directory=tmp_path) is None


def test_recorded_results_load_with_a_label(tmp_path):
    data = {"kind": recorded.KIND, "script": "tests/gpu/test_memory_gpu.py",
            "date": "2026-12-01", "hardware": {"gpu": "NVIDIA H100 80GB HBM3",
                                               "driver": "550.54", "torch": "2.13.0"},
            "figures": {"peak": 1}}
    (tmp_path / "memory.json").write_text(json.dumps(data))
    rec = helpers.recorded_gpu_results("memory", directory=tmp_path)
    assert rec["figures"] == {"peak": 1} and rec.hardware["gpu"].startswith("NVIDIA")
    assert rec.label.startswith("Recorded GPU results: NVIDIA H100 80GB HBM3 (driver 550.54")
    assert "not measured on this machine" in repr(rec)


@pytest.mark.parametrize("content, match", [
    ("{not json", "not valid JSON"), ('{"kind": "other"}', "not a recorded"), ("[]", "not a")])
def test_recorded_results_refuse_other_files(tmp_path, content, match):
    (tmp_path / "memory.json").write_text(content)
    with pytest.raises(ValueError, match=match):
        helpers.recorded_gpu_results("memory", directory=tmp_path)


@pytest.mark.parametrize("name, error, match", [
    ("", ValueError, "name must not be empty"), ("../x", ValueError, "file stem"),
    ("Memory", ValueError, "file stem"), (3, TypeError, "name must be a string"),
    (None, TypeError, "name must be a string")])
def test_recorded_results_names(name, error, match):
    with pytest.raises(error, match=match):
        helpers.recorded_gpu_results(name)
