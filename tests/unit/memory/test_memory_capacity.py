"""parse_capacity, KNOWN_GPUS and the simulated CUDA caching allocator (no torch needed)."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import helpers
from helpers.memory.allocator import (
    LARGE_BUFFER,
    MIN_BLOCK,
    SMALL_BUFFER,
    CachingAllocator,
    ExactAllocator,
    SimulatedOOM,
    allocation_size,
    round_size,
)
from helpers.memory.capacity import card_name, resolve_capacity

MiB, GiB = 2**20, 2**30


# ---------------------------------------------------------------- capacities
@pytest.mark.parametrize("value, expected", [
    ("48GB", 48 * 10**9),
    ("48 GB", 48 * 10**9),
    ("48 GiB", 48 * GiB),
    ("48gib", 48 * GiB),
    ("1.5 TiB", int(1.5 * 2**40)),
    ("512 MiB", 512 * MiB),
    ("0.5KB", 500),
    ("100 B", 100),
    ("1_000 bytes", 1000),
    (48_000_000_000, 48 * 10**9),
    (48e9, 48 * 10**9),
])
def test_sizes(value, expected):
    assert helpers.parse_capacity(value) == expected


def test_known_cards_use_driver_reported_totals():
    assert helpers.KNOWN_GPUS["L40S"] == 46068 * MiB  # what nvidia-smi shows for an L40S
    assert set(helpers.KNOWN_GPUS) == {
        "L40S", "A100-40GB", "A100-80GB", "H100-80GB", "H200", "T4", "V100-16GB", "V100-32GB"}
    for name, n_bytes in helpers.KNOWN_GPUS.items():
        assert helpers.parse_capacity(name) == n_bytes
        assert n_bytes % MiB == 0
    # every card reports less than its marketing size in GB would suggest in GiB terms
    assert helpers.KNOWN_GPUS["A100-80GB"] < 80 * 10**9 * 1.08
    with pytest.raises(TypeError):
        helpers.KNOWN_GPUS["X"] = 1  # read-only


@pytest.mark.parametrize("name, card", [
    ("l40s", "L40S"), ("NVIDIA L40S", "L40S"), ("L40S 48GB", "L40S"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("A100 80GB PCIe", "A100-80GB"),
    ("a100_40gb", "A100-40GB"), ("NVIDIA H100 80GB HBM3", "H100-80GB"),
    ("NVIDIA H200", "H200"), ("H200 141GB", "H200"), ("Tesla T4", "T4"),
    ("Tesla V100-SXM2-16GB", "V100-16GB"), ("Tesla V100-PCIE-32GB", "V100-32GB"),
    ("V100S-PCIE-32GB", "V100-32GB"),
])
def test_card_spellings(name, card):
    assert card_name(name) == card
    assert resolve_capacity(name) == (card, helpers.KNOWN_GPUS[card])


@pytest.mark.parametrize("name, choices", [
    ("A100", "A100-40GB or A100-80GB"), ("V100", "V100-16GB or V100-32GB"),
    ("NVIDIA H100 PCIe", "H100-80GB"),
])
def test_ambiguous_cards_are_refused_with_the_choices(name, choices):
    with pytest.raises(ValueError, match="ambiguous") as info:
        helpers.parse_capacity(name)
    assert choices in str(info.value)


@pytest.mark.parametrize("value, match", [
    (0, "more than 0"), (-1, "more than 0"), ("0 GB", "more than 0"), ("0.1 B", "more than 0"),
    ("48", "no unit"), ("48G", "ambiguous"), ("48 M", "ambiguous"), ("12 XB", "unknown unit"),
    ("L40", "unknown GPU"), ("nonsense", "unknown GPU"), ("", "unknown GPU"),
    ("RTX 4090", "unknown GPU"), (1.5, "whole number"), (math.nan, "finite"),
    (math.inf, "finite"), ("-5 GB", "more than 0"),
])
def test_bad_capacities_say_what_is_accepted(value, match):
    with pytest.raises(ValueError, match=match) as info:
        helpers.parse_capacity(value)
    if "unknown" in match:
        assert "L40S" in str(info.value) and "GiB" in str(info.value)


@pytest.mark.parametrize("value", [None, True, [48], {"GB": 48}, b"48GB"])
def test_capacity_types(value):
    with pytest.raises(TypeError, match="Accepted"):
        helpers.parse_capacity(value)


def test_allow_zero_is_for_overheads():
    assert helpers.parse_capacity(0, allow_zero=True) == 0
    assert helpers.parse_capacity("500 MiB", allow_zero=True) == 500 * MiB
    with pytest.raises(TypeError):
        helpers.parse_capacity(0, allow_zero="yes")


_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


@settings(max_examples=200, deadline=None)
@given(n=st.integers(min_value=1, max_value=10**6), unit=st.sampled_from(sorted(_UNITS)),
       space=st.sampled_from(["", " ", "  "]), lower=st.booleans())
def test_property_whole_sizes_parse_exactly(n, unit, space, lower):
    text = f"{n}{space}{unit.lower() if lower else unit}"
    assert helpers.parse_capacity(text) == n * _UNITS[unit]


@settings(max_examples=200, deadline=None)
@given(n=st.integers(min_value=1, max_value=2**62))
def test_property_bytes_round_trip(n):
    assert helpers.parse_capacity(n) == n
    assert helpers.parse_capacity(f"{n} B") == n


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=20))
def test_property_any_string_parses_or_says_why(text):
    try:
        n = helpers.parse_capacity(text)
    except ValueError as exc:
        assert str(exc)  # a message, never another exception type
    else:
        assert isinstance(n, int) and n > 0


# ---------------------------------------------------------------- allocator simulation
def test_rounding_rules_match_the_cuda_caching_allocator():
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    assert allocation_size(512) == SMALL_BUFFER  # small requests share 2 MiB segments
    assert allocation_size(MiB) == SMALL_BUFFER
    assert allocation_size(MiB + 512) == LARGE_BUFFER  # under 10 MiB: a 20 MiB segment
    assert allocation_size(10 * MiB) == 10 * MiB
    assert allocation_size(10 * MiB + 512) == 12 * MiB  # larger: rounded up to 2 MiB


def test_caching_allocator_reuses_splits_and_caches():
    a = CachingAllocator(None)
    b1 = a.malloc(100)
    assert (a.allocated_bytes, a.reserved_bytes) == (MIN_BLOCK, SMALL_BUFFER)
    b2 = a.malloc(1000)  # fits in the same 2 MiB segment
    assert a.reserved_bytes == SMALL_BUFFER and a.allocated_bytes == 512 + 1024
    a.free(b1)
    a.free(b2)
    assert a.allocated_bytes == 0 and a.reserved_bytes == SMALL_BUFFER  # cached, not returned
    big = a.malloc(3 * MiB)  # 20 MiB segment, split
    assert a.reserved_bytes == SMALL_BUFFER + LARGE_BUFFER and a.allocated_bytes == 3 * MiB
    a.free(big)
    a.empty_cache()
    assert a.reserved_bytes == 0


def test_caching_allocator_empties_its_cache_before_failing():
    a = CachingAllocator(30 * MiB)
    x = a.malloc(15 * MiB)  # 16 MiB segment
    a.free(x)
    y = a.malloc(2 * MiB)  # reuses the cached 16 MiB segment (split)
    assert a.reserved_bytes == 16 * MiB
    with pytest.raises(SimulatedOOM) as info:
        a.malloc(20 * MiB)  # 16 + 20 > 30 even after emptying the (busy) cache
    assert info.value.alloc_size == 20 * MiB
    a.free(y)
    z = a.malloc(20 * MiB)  # now the 16 MiB segment is free: released, then it fits
    assert a.reserved_bytes == 20 * MiB
    a.free(z)


def test_exact_allocator_limit_is_inclusive():
    a = ExactAllocator(1000)
    a.malloc(600)
    a.malloc(400)  # exactly full is fine
    with pytest.raises(SimulatedOOM):
        a.malloc(1)
    assert a.reserved_bytes == a.allocated_bytes == 1000


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 300))
def test_property_caching_allocator_invariants(seed, n):
    rng = random.Random(seed)
    a = CachingAllocator(None)
    live = []
    for _ in range(n):
        if live and rng.random() < 0.45:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice([rng.randint(1, 4096), rng.randint(1, 3 * MiB),
                               rng.randint(1, 40 * MiB)])
            block = a.malloc(size)
            assert block.size >= size and block.size % MIN_BLOCK == 0
            live.append(block)
        assert a.allocated_bytes == sum(b.size for b in live)
        assert a.reserved_bytes == sum(a.segments.values()) >= a.allocated_bytes
        assert a.peak_reserved_bytes >= a.reserved_bytes
    for block in live:
        a.free(block)
    a.empty_cache()
    assert a.allocated_bytes == 0 and a.reserved_bytes == 0  # every split merged back
