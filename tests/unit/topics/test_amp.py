"""helpers.amp, helpers.core.timing and helpers.tf.policies (lesson 07)."""

import json
import re
import sys
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import helpers
from helpers.amp import parse_dtype, recorded_tables, short_name
from helpers.core.recorded import KIND
from helpers.tf.policies import keras_mixed_policy, onednn_setting


# ------------------------------------------------------------------ amp_settings
def test_cpu_uses_bf16_without_a_scaler():
    amp = helpers.amp_settings("cpu")
    assert (amp.device_type, amp.dtype, amp.use_scaler, amp.name) == (
        "cpu", torch.bfloat16, False, "bf16")
    assert "no GradScaler" in repr(amp)
    with amp.autocast():
        out = nn.Linear(4, 4)(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16
    assert not amp.grad_scaler().is_enabled()


def test_fp16_needs_a_scaler():
    amp = helpers.amp_settings(torch.device("cpu"), dtype="fp16")
    assert amp.dtype == torch.float16 and amp.use_scaler and amp.reason == "asked for"
    assert amp.grad_scaler(init_scale=8.0).get_scale() == 8.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="answer depends on this GPU")
def test_cuda_without_a_gpu_falls_back_to_fp16_and_says_why():
    amp = helpers.amp_settings("cuda:0")
    assert amp.dtype == torch.float16 and amp.use_scaler
    assert "no CUDA GPU" in amp.reason


def test_tf32_settings_on_a_cpu_read_the_switches_and_say_they_do_nothing():
    tf32 = helpers.tf32_settings("cpu")
    assert tf32.values == ("none", "tf32", "tf32")   # torch 2.13's defaults
    assert not tf32.applies and not tf32.matmul_tf32 and not tf32.conv_tf32
    text = repr(tf32)
    assert "torch.backends.cuda.matmul.fp32_precision = 'none'" in text
    assert "fp32 baseline: IEEE fp32 on this cpu" in text and "<table>" in tf32._repr_html_()
    assert helpers.amp_settings("cpu").tf32 == tf32


def test_tf32_settings_follow_the_switches():
    before = torch.backends.cuda.matmul.fp32_precision
    try:
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        assert helpers.tf32_settings("cpu").values[0] == "tf32"
    finally:
        torch.backends.cuda.matmul.fp32_precision = before
    assert torch.backends.cuda.matmul.allow_tf32 is False   # restored: the old getter works


def test_tf32_settings_reject_unknown_devices():
    with pytest.raises(ValueError, match="device"):
        helpers.tf32_settings("gpu")


@pytest.mark.real_pick_device
def test_default_device_is_the_picked_one():
    assert helpers.amp_settings().device_type == helpers.pick_device().type


@pytest.mark.parametrize("value, expected", [
    ("bf16", torch.bfloat16), ("BFloat16", torch.bfloat16), (torch.bfloat16, torch.bfloat16),
    ("fp16", torch.float16), ("half", torch.float16), (torch.float16, torch.float16),
])
def test_parse_dtype(value, expected):
    assert parse_dtype(value) is expected


@pytest.mark.parametrize("bad", ["fp32", torch.float32, "int8", None, 16])
def test_bad_dtypes_say_what_is_accepted(bad):
    with pytest.raises(ValueError, match="bf16.*fp16"):
        parse_dtype(bad)


@pytest.mark.parametrize("bad, error", [("gpu", ValueError), ("xla-ish", ValueError),
                                        (3.5, TypeError), (object(), TypeError),
                                        (b"H\xb8\xf0", TypeError)])
def test_bad_devices_are_rejected(bad, error):
    """A malformed name is a ValueError, a non-device a TypeError (bytes: fuzz finding)."""
    with pytest.raises(error, match="device"):
        helpers.amp_settings(bad)


def test_short_names():
    assert [short_name(d) for d in (torch.float32, torch.float16, torch.bfloat16)] == [
        "fp32", "fp16", "bf16"]
    assert short_name(torch.int64) == "int64"


# ------------------------------------------------------------------ trace_dtypes
def test_trace_shows_what_autocast_casts_and_keeps():
    torch.manual_seed(0)
    model = helpers.MLP(8, 16, 2, 3)
    x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        trace = helpers.trace_dtypes(lambda: nn.functional.cross_entropy(model(x), y))
    assert trace.ops_in("bf16") == ["addmm", "relu"]
    assert trace.ops_in(torch.float32) == ["_log_softmax", "nll_loss_forward"]
    assert "_to_copy" in trace.ops_in("bf16", skip=())
    assert trace.casts == 3 + 3 + 1 + 1  # 3 weights, 3 biases, the input; logits to fp32
    assert trace.result.dtype == torch.float32
    text = repr(trace)
    assert "addmm" in text and "t " not in text.split("casts")[0].split()  # views left out
    assert re.search(r"addmm\s+bf16\s+bf16, bf16, bf16\s+3", text)
    assert "<table>" in trace._repr_html_()


def test_trace_without_autocast_is_all_fp32():
    trace = helpers.trace_dtypes(nn.Linear(3, 2), torch.randn(5, 3))
    assert trace.ops_in("fp32") == ["addmm"] and trace.casts == 0
    with pytest.raises(TypeError, match="function"):
        helpers.trace_dtypes(42)


# ------------------------------------------------------------------ compare_memory
def _report(peak, acts, phase="backward"):
    cats = {"parameters": 100, "gradients": 100, "optimizer_state": 200,
            "activations": acts, "temporaries": 0, "inputs": 10, "other": 0}
    return SimpleNamespace(peak_bytes=peak, category_max=cats, peak_phase=phase)


def test_compare_memory_table_and_ratios():
    cmp = helpers.compare_memory({"fp32": _report(1000, 400), "bf16": _report(800, 250)})
    assert cmp.ratio("bf16") == 0.8 and cmp.ratio("bf16", "activations") == 0.625
    assert cmp.bytes("fp32", "parameters") == 100
    text = cmp.text()
    assert "temporaries" not in text  # empty categories are left out
    assert re.search(r"activations\s+400 B\s+250 B\s+0\.62x", text)
    assert re.search(r"peak\s+1000 B\s+800 B\s+0\.80x", text)
    assert "~" not in text  # exact bytes and exact ratios: compared by the notebook tests
    assert "peak during" in text and "<table>" in cmp._repr_html_()


def test_compare_memory_with_real_reports():
    reports = {}
    for name, dt in (("fp32", None), ("bf16", torch.bfloat16)):
        torch.manual_seed(0)
        model = helpers.MLP(16, 64, 2, 4)
        opt = torch.optim.Adam(model.parameters())
        x, y = torch.randn(512, 16), torch.randint(0, 4, (512,))

        def step(model=model, opt=opt, x=x, y=y, dt=dt):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=dt or torch.float32, enabled=dt is not None):
                loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()

        reports[name] = helpers.measure_step(step, model=model, optimizer=opt,
                                             inputs=(x, y), steps=2)
    cmp = helpers.compare_memory(reports)
    for cat in ("parameters", "gradients", "optimizer_state"):
        assert cmp.ratio("bf16", cat) == 1.0
    assert 0.5 < cmp.ratio("bf16", "activations") < 1.0


def test_compare_memory_rejects_bad_input():
    with pytest.raises(TypeError, match="two or more"):
        helpers.compare_memory({"fp32": _report(1, 1)})
    with pytest.raises(TypeError, match="two or more"):
        helpers.compare_memory([_report(1, 1), _report(1, 1)])
    with pytest.raises(TypeError, match="not a memory report"):
        helpers.compare_memory({"a": _report(1, 1), "b": 3})
    with pytest.raises(ValueError, match="baseline"):
        helpers.compare_memory({"a": _report(1, 1), "b": _report(1, 1)}, baseline="c")
    cmp = helpers.compare_memory({"a": _report(1, 1), "b": _report(1, 1)}, baseline="b")
    with pytest.raises(KeyError, match="no report named"):
        cmp.ratio("c")
    with pytest.raises(KeyError, match="unknown category"):
        cmp.ratio("a", "weights")


# ------------------------------------------------------------------ compare_times
def test_compare_times_interleaves_and_keeps_the_best():
    calls = []
    times = helpers.compare_times(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
        rounds=3, number=2, warmup=1)
    assert calls[:2] == ["a", "b"]                       # warm-up, once each
    assert calls[2:] == ["a", "a", "b", "b", "b", "b", "a", "a", "a", "a", "b", "b"]
    assert set(times.best_seconds) == {"a", "b"} and len(times.samples["a"]) == 3
    assert times.speedup("a") == 1.0
    assert times.speedup("b") == pytest.approx(times.best_seconds["a"] / times.best_seconds["b"])
    text = times.text()
    assert "best of 3 interleaved rounds, 2 calls each" in text and "baseline" in text
    assert re.search(r"b\s+~[0-9.,]+ ms \(~[0-9.]+x\)$", text)  # measured: masked in tests


def test_timing_table_layout_survives_masking():
    masked = re.compile(r"~[-+]?[0-9][0-9,]*(\.[0-9]+)?")  # tests/sanitize.cfg, regex1
    texts = set()
    for seconds in (0.0004, 0.098, 1.05, 123.4):
        times = helpers.TimeComparison(("fp32", "bf16"), {"fp32": [seconds * 3],
                                       "bf16": [seconds]}, "fp32", 1, 1)
        texts.add(masked.sub("~N", times.text()))
        texts.add(masked.sub("~N", times._repr_html_()))
    assert len(texts) == 2, texts
    assert json.dumps(times.to_dict())


def test_compare_times_syncs_around_each_timing():
    synced = []
    helpers.compare_times({"a": lambda: None}, rounds=2, warmup=0, sync=lambda: synced.append(1))
    assert len(synced) == 1 + 2 * 2
    helpers.compare_times({"a": lambda: None}, rounds=1, sync="cpu")
    helpers.compare_times({"a": lambda: None}, rounds=1, sync=torch.device("cpu"))


@pytest.mark.parametrize("kwargs, error", [
    ({"workloads": {}}, ValueError), ({"workloads": [lambda: None]}, TypeError),
    ({"workloads": {"a": 3}}, TypeError), ({"workloads": {"": lambda: None}}, ValueError),
    ({"rounds": 0}, ValueError), ({"number": 1.5}, TypeError), ({"warmup": -1}, ValueError),
    ({"baseline": "zzz"}, ValueError), ({"sync": "tpu"}, ValueError), ({"sync": 3}, TypeError),
    ({"unit": "min"}, ValueError),
])
def test_compare_times_validates(kwargs, error):
    args = {"workloads": {"a": lambda: None}} | kwargs
    with pytest.raises(error):
        helpers.compare_times(args.pop("workloads"), **args)


def test_times_print_in_one_fixed_unit():
    from helpers.core.timing import fmt_in_unit

    assert fmt_in_unit(1.0502) == "~1,050 ms"
    assert fmt_in_unit(0.0123) == "~12.3 ms"
    assert fmt_in_unit(4.2e-5) == "~0.0420 ms"
    assert fmt_in_unit(0.5, "s") == "~0.500 s" and fmt_in_unit(0) == "~0.00 ms"
    assert fmt_in_unit(3e-6, "µs") == "~3.00 µs"
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError):
            fmt_in_unit(bad)
    for bad in ("1", True):
        with pytest.raises(TypeError):
            fmt_in_unit(bad)
    times = helpers.compare_times({"a": lambda: None}, rounds=1, unit="s")
    assert re.search(r"a\s+~[0-9.]+ s \(baseline\)", times.text())


def test_speedup_names_unknown_workloads():
    times = helpers.compare_times({"a": lambda: None}, rounds=1)
    with pytest.raises(KeyError, match="measured: a"):
        times.speedup("b")


# ------------------------------------------------------------------ recorded results
def _results():
    return {
        "kind": KIND, "script": "tests/gpu/test_amp_gpu.py", "date": "2026-12-01",
        "hardware": {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.1", "torch": "2.13.0"},
        "memory": [{"model": "mlp", "batch": 256,
                    "peak_bytes": {"fp32": 2 * 2**20, "bf16": 2**20, "fp16": 2**20}}],
        "speed": [{"model": "mlp", "batch": 256,
                   "seconds": {"fp32": 0.004, "bf16": 0.002, "fp16": 0.001}}],
        "keras": {"width": 4096, "batch": 4096,
                  "seconds": {"float32": 0.01, "mixed_float16": 0.004}},
    }


def test_recorded_tables_from_a_results_file(tmp_path):
    (tmp_path / "amp.json").write_text(json.dumps(_results()))
    rec = helpers.recorded_gpu_results("amp", directory=tmp_path)
    assert "H100" in rec.label and "not measured on this machine" in rec.label
    memory, speed, keras = (t.text() for t in recorded_tables(rec))
    assert re.search(r"mlp\s+256\s+2\.00 MiB\s+1\.00 MiB\s+1\.00 MiB\s+0\.50x\s+0\.50x", memory)
    assert re.search(r"~4\.00 ms\s+~2\.00 ms\s+~1\.00 ms\s+~2\.00x\s+~4\.00x", speed)
    assert "mixed_float16" in keras and "~2.50x" in keras


def test_recorded_tables_skip_what_is_missing():
    data = _results()
    del data["keras"], data["speed"]
    data["memory"][0]["peak_bytes"].pop("bf16")
    (table,) = recorded_tables(data)
    assert "bf16" not in table.text() and "fp16/fp32" in table.text()
    with pytest.raises(TypeError, match="recorded_gpu_results"):
        recorded_tables("amp.json")


# ------------------------------------------------------------------ keras_amp
@pytest.mark.parametrize("device, capability, policy", [
    ("GPU", (8, 0), "mixed_bfloat16"), ("gpu:1", (9, 0), "mixed_bfloat16"),   # Ampere, Hopper
    ("/device:GPU:0", (7, 5), "mixed_float16"), ("GPU", (7, 0), "mixed_float16"),  # T4, V100
    ("CPU", None, "mixed_bfloat16"), ("CPU:0", (7, 0), "mixed_bfloat16"),   # a CPU: always bf16
])
def test_keras_policy_follows_the_device_and_its_capability(device, capability, policy):
    assert keras_mixed_policy(device, capability=capability) == policy


def _fake_tf(monkeypatch, capabilities):
    """A stand-in TensorFlow with one GPU per capability (None: details without one)."""
    gpus = [SimpleNamespace(name=f"/physical_device:GPU:{i}") for i in range(len(capabilities))]
    details = {g.name: ({"compute_capability": c} if c else {})
               for g, c in zip(gpus, capabilities, strict=True)}
    tf = SimpleNamespace(config=SimpleNamespace(
        list_physical_devices=lambda kind=None: gpus if kind == "GPU" else [],
        experimental=SimpleNamespace(get_device_details=lambda d: details[d.name])))
    monkeypatch.setitem(sys.modules, "tensorflow", tf)
    return tf


@pytest.mark.parametrize("capabilities, policy", [
    ([(8, 0)], "mixed_bfloat16"), ([(7, 5)], "mixed_float16"), ([None], "mixed_float16"),
    ([], "mixed_bfloat16"),   # no GPU: the CPU's policy
])
def test_keras_policy_asks_tensorflow_for_the_gpus_capability(monkeypatch, capabilities,
                                                               policy):
    _fake_tf(monkeypatch, capabilities)
    assert keras_mixed_policy() == policy


def test_keras_policy_agrees_with_amp_settings_for_each_gpu_generation():
    from helpers.memory.cuda_standin import SimulatedCuda

    for capability in ((7, 0), (7, 5), (8, 0), (8, 6), (9, 0)):
        with SimulatedCuda(capability=capability):
            torch_choice = helpers.amp_settings("cuda").name
        keras_choice = keras_mixed_policy("GPU", capability=capability)
        assert keras_choice == {"bf16": "mixed_bfloat16", "fp16": "mixed_float16"}[
            torch_choice], capability


@pytest.mark.parametrize("bad", ["TPU", "", 0])
def test_keras_policy_rejects_unknown_devices(bad):
    with pytest.raises((ValueError, TypeError), match="GPU"):
        keras_mixed_policy(bad)


@pytest.mark.parametrize("bad", [(8,), "8.0", (8, -1), (8.0, 0), (True, 0), [8, 0]])
def test_keras_policy_rejects_bad_capabilities(bad):
    with pytest.raises(ValueError, match="capability"):
        keras_mixed_policy("GPU", capability=bad)


def test_onednn_setting_in_words(monkeypatch):
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    assert "unset" in onednn_setting()
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    assert onednn_setting() == "TF_ENABLE_ONEDNN_OPTS=0: oneDNN off (helpers.setup's default)"
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1")
    assert onednn_setting() == "TF_ENABLE_ONEDNN_OPTS=1: oneDNN on"


def test_keras_policy_is_restored_even_after_an_error():
    keras = pytest.importorskip("tensorflow").keras
    assert keras.mixed_precision.global_policy().name == "float32"
    with pytest.raises(RuntimeError, match="boom"):
        with helpers.keras_policy("mixed_bfloat16") as policy:
            assert policy.name == "mixed_bfloat16"
            layer = keras.layers.Dense(2)
            raise RuntimeError("boom")
    assert keras.mixed_precision.global_policy().name == "float32"
    assert layer.dtype_policy.name == "mixed_bfloat16"
    assert keras_mixed_policy() in ("mixed_float16", "mixed_bfloat16")
    with pytest.raises(ValueError, match="mixed_bfloat16"):
        with helpers.keras_policy("bf16"):
            pass


# ------------------------------------------------------------------ property tests

_sizes = st.integers(min_value=0, max_value=2**50)
_fake_report = st.builds(
    lambda peak, cats: SimpleNamespace(peak_bytes=peak, category_max=cats),
    _sizes, st.dictionaries(st.sampled_from(["parameters", "gradients", "activations",
                                             "optimizer_state", "inputs"]), _sizes))


@given(st.dictionaries(st.text(min_size=1, max_size=6), _fake_report, min_size=2,
                       max_size=4))
def test_compare_memory_always_shows_itself(reports):
    """Fuzz case 11: a zero-peak report could not be shown (NaN ratio); a category one
    report lacks was a KeyError."""
    cmp = helpers.compare_memory(reports)
    text = cmp.text()
    assert text == repr(cmp) and "peak" in text and cmp._repr_html_()


@given(st.one_of(st.none(), st.integers(min_value=-5, max_value=5), st.text(max_size=3),
                 st.floats(), st.just(10**400)))
def test_compare_memory_rejects_bad_peaks_clearly(peak):
    reports = {"a": SimpleNamespace(peak_bytes=peak, category_max={}),
               "b": SimpleNamespace(peak_bytes=1, category_max={})}
    try:
        helpers.compare_memory(reports).text()
    except (TypeError, ValueError) as exc:
        assert "report 'a'" in str(exc) or "peak" in str(exc)
    else:
        assert isinstance(peak, int) and peak >= 0


def test_compare_memory_with_a_zero_peak_report():
    """Fuzz case 11: compare_memory with a zero-peak report can be shown."""
    zero = helpers.measure_step(lambda: None, device="cpu")
    some = helpers.measure_step(lambda: torch.ones(100), device="cpu")
    text = helpers.compare_memory({"a": zero, "b": some}).text()
    assert "peak" in text and "-" in text
