"""Property tests for the memory layer's parsers, constructors and reports: every
valid input works, every bad one raises only ValueError or TypeError naming the argument."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers.core.checks import LARGEST
from helpers.core.fmt import fmt_bytes
from helpers.memory.capacity import KNOWN_GPUS, parse_capacity
from helpers.memory.measure import measure_step
from helpers.memory.virtual import VirtualGPU

anything = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.binary(max_size=4), st.lists(st.integers(), max_size=2), st.just(object()))
units = st.sampled_from(["B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"])


def accepted_or_named(fn, *names):
    """Run fn(); a failure must be ValueError/TypeError whose message names the argument
    and stays short (no 5,000-digit numbers, no int-string limit)."""
    try:
        return fn()
    except (ValueError, TypeError) as exc:
        message = str(exc)
        assert any(name in message for name in names), message
        assert "limit (4300 digits)" not in message and len(message) < 2000, message
        return None


@given(st.integers(min_value=1, max_value=LARGEST))
def test_parse_capacity_takes_every_byte_count(n):
    assert parse_capacity(n) == n


@given(st.integers(min_value=0, max_value=10**6), units)
def test_parse_capacity_reads_number_and_unit(number, unit):
    n = accepted_or_named(lambda: parse_capacity(f"{number} {unit}"), "capacity")
    if number == 0:
        assert n is None
    else:
        assert n >= number and parse_capacity(f"{number}{unit}") == n


@given(st.sampled_from(sorted(KNOWN_GPUS)))
def test_parse_capacity_knows_every_card(card):
    assert parse_capacity(card) == KNOWN_GPUS[card]


@given(anything)
def test_parse_capacity_rejects_clearly(value):
    n = accepted_or_named(lambda: parse_capacity(value), "capacity", "GPU", "unit")
    assert n is None or 0 < n <= LARGEST


@given(capacity=anything, rounding=anything, context=anything, fake=anything,
       device=anything, index=anything)
def test_virtual_gpu_constructor(capacity, rounding, context, fake, device, index):
    gpu = accepted_or_named(
        lambda: VirtualGPU(capacity, rounding=rounding, context_bytes=context, fake=fake,
                           device=device, index=index),
        "capacity", "GPU", "unit", "rounding", "context_bytes", "fake", "device", "index")
    if gpu is not None:
        assert 0 <= gpu.context_bytes < gpu.capacity_bytes <= LARGEST
        assert gpu.summary().startswith("VirtualGPU")


@given(st.integers(min_value=1, max_value=2**40), st.booleans(), st.booleans())
def test_virtual_gpu_accepts_valid_sizes(capacity, rounding, fake):
    gpu = VirtualGPU(capacity, rounding=rounding, fake=fake, device="cpu")
    assert gpu.capacity_bytes == capacity and gpu.free_bytes == capacity
    assert fmt_bytes(capacity) in gpu.summary() or gpu.name in gpu.summary()


@given(steps=anything, title=anything, track_modules=anything, device=anything)
def test_measure_step_arguments(steps, title, track_modules, device):
    report = accepted_or_named(
        lambda: measure_step(lambda: torch.ones(4), steps=steps, title=title,
                             track_modules=track_modules, device=device),
        "steps", "title", "track_modules", "device")
    if report is not None:
        assert len(report.steps) == steps and report.peak_bytes >= 0


@given(st.lists(st.integers(min_value=0, max_value=2**20), min_size=0, max_size=5),
       st.integers(min_value=1, max_value=3))
def test_memory_report_always_shows_itself(sizes, steps):
    def step():
        kept = [torch.empty(n, dtype=torch.uint8) for n in sizes]
        return sum(t.numel() for t in kept)

    report = measure_step(step, steps=steps, device="cpu", title="prop")
    text, html = report.text(), report._repr_html_()
    assert fmt_bytes(report.peak_bytes) in text and "prop" in html
    assert report.peak_bytes >= sum(sizes) and str(report) == repr(report) == text
    assert report.to_dict()["peak_bytes"] == report.peak_bytes
    assert len(report.timeline.records()) == len(report.timeline)


@pytest.mark.parametrize("bad", [3, "3", None])
def test_measure_step_needs_a_function(bad):
    with pytest.raises(TypeError, match="step must be a function"):
        measure_step(bad)
