"""Hypothesis properties of the core layer's public functions and the models: valid input
works, bad input raises only TypeError or ValueError, naming the argument."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers.core.data import classification_data, image_data, torch_dataset, torch_loader
from helpers.core.device import device_report
from helpers.core.environment import pick_device, setup
from helpers.core.exercises import EXERCISE_ID, check
from helpers.core.fmt import Table, fmt_bytes, fmt_gib, fmt_mib, fmt_rate, fmt_ratio, fmt_seconds
from helpers.core.timing import fmt_in_unit
from helpers.models import MLP, ResNet, SmallCNN, TransformerBlock, count_parameters

ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**30, max_value=10**4000),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.binary(max_size=4), st.lists(st.integers(), max_size=3), st.just(object()),
    st.just(np.int64(3)), st.just(np.float64(-0.5)),
)
REALS = st.one_of(st.integers(min_value=-(10**500), max_value=10**500),
                  st.floats(allow_nan=False), st.fractions(),
                  st.integers(-(2**40), 2**40).map(np.int64))


def rejected(fn, name, *args, **kwargs):
    """Call ``fn``: True if it raised TypeError/ValueError naming ``name``, False if it
    returned; any other exception fails the test."""
    try:
        fn(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        assert name in str(exc), (name, str(exc))
        return True
    return False


# ------------------------------------------------------------------------------ formatters
@given(REALS)
def test_formatters_print_every_real_number_on_one_short_line(value):
    for fmt in (fmt_bytes, fmt_mib, fmt_gib, fmt_ratio):
        shown = fmt(value)
        assert "\n" not in shown and len(shown) < 40
    if value >= 0:
        for fmt in (fmt_seconds, fmt_rate, fmt_in_unit):
            shown = fmt(value)
            assert shown.startswith("~") and len(shown) < 40


@given(ANYTHING, ANYTHING)
def test_formatters_reject_bad_input_naming_it(value, digits):
    for fmt, name in ((fmt_bytes, "n_bytes"), (fmt_mib, "n_bytes"), (fmt_gib, "n_bytes"),
                      (fmt_ratio, "ratio"), (fmt_seconds, "seconds")):
        rejected(fmt, name, value)
        rejected(fmt, "digits", 1.0, digits)
    rejected(fmt_rate, "unit", 1.0, digits)
    rejected(fmt_ratio, "measured", 1.0, 2, digits)


LINE = st.characters(blacklist_characters="\n")


@given(st.lists(st.text(LINE, max_size=6), min_size=1, max_size=4),
       st.lists(st.lists(st.one_of(st.integers(), st.floats(), st.text(LINE, max_size=8))),
                max_size=5), st.one_of(st.none(), st.text(LINE, min_size=1, max_size=10)))
def test_tables_show_any_cells(headers, rows, title):
    rows = [(r + [""] * len(headers))[: len(headers)] for r in rows]
    table = Table(headers, rows, title=title)
    assert len(table.text().split("\n")) == 2 + len(rows) + bool(title)
    assert table._repr_html_().startswith("<table>")


@given(ANYTHING, ANYTHING)
def test_tables_reject_bad_parts(headers, rows):
    try:
        Table(headers, rows)
    except (TypeError, ValueError) as exc:
        assert any(w in str(exc) for w in ("headers", "rows", "row ")), str(exc)


# ------------------------------------------------------------------------ setup and devices
@given(ANYTHING)
def test_setup_rejects_bad_seeds_before_changing_anything(seed):
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) \
            and 0 <= seed < 2**32:
        return  # a valid seed: tests/unit/core/test_import_and_setup.py runs those
    assert rejected(setup, "seed", seed)


@given(ANYTHING, st.sampled_from(["deterministic", "benchmark", "tensorflow", "torch"]))
def test_setup_rejects_bad_flags(value, name):
    if isinstance(value, (bool, np.bool_)) or (name in ("tensorflow", "torch") and value is None):
        return
    assert rejected(setup, name, 0, **{name: value})


@given(st.one_of(ANYTHING, st.sampled_from(["auto", "cuda", "mps", "cpu"])))
def test_pick_device_gives_a_device_or_names_prefer(prefer):
    try:
        device = pick_device(prefer)
    except (TypeError, ValueError) as exc:
        assert "prefer" in str(exc)
    else:
        assert isinstance(device, torch.device)


@given(ANYTHING)
def test_device_report_rejects_a_non_flag(value):
    if not isinstance(value, (bool, np.bool_)):
        assert rejected(device_report, "tensorflow", tensorflow=value)


# --------------------------------------------------------------------------------- check()
@given(st.one_of(ANYTHING, st.from_regex(EXERCISE_ID, fullmatch=True)), st.text(max_size=20))
def test_check_reports_or_names_the_bad_argument(exercise_id, message):
    def failing():
        raise AssertionError(message)

    try:
        result = check(exercise_id, failing)
    except (TypeError, ValueError) as exc:
        assert "exercise_id" in str(exc)
    else:
        assert not result and exercise_id in result.text()
        assert result._repr_html_().startswith("<div")


@given(ANYTHING)
def test_check_rejects_a_non_text_success_message(success):
    if not isinstance(success, str):
        assert rejected(check, "success", "01-demo", lambda: None, success)


# ---------------------------------------------------------------------------------- data
@given(st.integers(1, 40), st.integers(1, 6), st.integers(2, 5), st.integers(0, 2**63 - 1),
       st.floats(0, 10))
def test_classification_data_is_deterministic_and_shaped(n, features, classes, seed, noise):
    x, y = classification_data(n, features, classes, seed=seed, noise=noise)
    assert x.shape == (n, features) and x.dtype == np.float32 and y.dtype == np.int64
    assert y.min() >= 0 and y.max() < classes
    x2, y2 = classification_data(n, features, classes, seed=seed, noise=noise)
    assert np.array_equal(x, x2) and np.array_equal(y, y2)


@given(st.sampled_from(["n_samples", "n_features", "n_classes", "seed", "noise"]), ANYTHING)
def test_classification_data_names_bad_arguments(name, value):
    rejected(classification_data, name, **{name: value})


@given(st.integers(1, 6), st.integers(1, 3), st.integers(1, 8), st.integers(1, 12),
       st.booleans())
def test_image_data_is_shaped(n, channels, size, classes, last):
    x, y = image_data(n, channels=channels, size=size, n_classes=classes, channels_last=last)
    assert x.shape == ((n, size, size, channels) if last else (n, channels, size, size))
    assert y.shape == (n,) and np.isfinite(x).all()


@given(st.sampled_from(["n_samples", "channels", "size", "n_classes", "seed",
                        "channels_last"]), ANYTHING)
def test_image_data_names_bad_arguments(name, value):
    if name == "n_samples":
        rejected(image_data, name, value, size=2)
    else:
        rejected(image_data, name, 2, **{"size": 2, name: value})


@given(st.integers(1, 20), st.integers(1, 8), st.booleans(), st.integers(0, 2**63 - 1))
def test_torch_loader_covers_every_sample_once(n, batch, shuffle, seed):
    x, y = classification_data(n, 3, 2)
    loader = torch_loader(x, y, batch, shuffle=shuffle, seed=seed)
    seen = torch.cat([b[0] for b in loader])
    assert len(seen) == n and len(torch_dataset(x, y)) == n


@given(st.sampled_from(["batch_size", "seed", "shuffle"]), ANYTHING)
def test_torch_loader_names_bad_arguments(name, value):
    x, y = classification_data(4, 2, 2)
    rejected(torch_loader, name, x, y, **{name: value})


@given(ANYTHING, ANYTHING)
def test_torch_dataset_rejects_what_is_not_two_arrays(x, y):
    rejected(torch_dataset, "", x, y)


# -------------------------------------------------------------------------------- models
@given(st.integers(1, 16), st.integers(1, 16), st.integers(1, 3), st.integers(1, 5))
def test_mlp_maps_features_to_classes(features, hidden, depth, classes):
    model = MLP(features, hidden, depth, classes)
    assert model(torch.zeros(2, features)).shape == (2, classes)
    assert count_parameters(model) == sum(p.numel() for p in model.parameters())


@given(st.integers(1, 3), st.integers(1, 5), st.integers(1, 4))
def test_small_cnn_maps_images_to_classes(channels, classes, width):
    model = SmallCNN(channels, classes, width)
    assert model(torch.zeros(1, channels, 8, 8)).shape == (1, classes)


@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 8))
def test_transformer_block_keeps_its_shape(heads, per_head, tokens):
    block = TransformerBlock(heads * per_head, heads)
    assert block(torch.zeros(2, tokens, heads * per_head)).shape == (2, tokens, heads * per_head)


def test_resnet_has_torchvisions_parameter_count():
    assert count_parameters(ResNet(18, width=2, n_classes=3)) > 0
    assert count_parameters(ResNet(152)) == 60_192_808


@pytest.mark.parametrize("cls, names", [
    (MLP, ["in_features", "hidden", "depth", "n_classes"]),
    (SmallCNN, ["in_channels", "n_classes", "width"]),
    (ResNet, ["depth", "n_classes", "in_channels", "width"]),
    (TransformerBlock, ["d_model", "n_heads", "d_ff"]),
])
@given(value=ANYTHING)
def test_model_constructors_name_bad_arguments(cls, names, value):
    for name in names:
        if name == "d_ff" and value is None:
            continue
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) \
                and 1 <= value <= 2**20 and not (cls is ResNet and name == "depth"):
            continue  # a valid size: building it is tested above (large ones take memory)
        if cls is ResNet and name == "depth" and value in (18, 34, 50, 101, 152, 200):
            continue
        assert rejected(cls, name, **{name: value})


@given(ANYTHING)
def test_count_parameters_rejects_a_non_module(value):
    assert rejected(count_parameters, "model", value)


# ---------------------------------------------------------------------------------- NVML
@given(ANYTHING)
def test_nvml_queries_name_a_bad_gpu_index(index):
    from helpers.core import nvml

    for query in (nvml.gpu_memory, nvml.gpu_utilization, nvml.gpu_status, nvml.gpu_processes):
        rejected(query, "index", index)
