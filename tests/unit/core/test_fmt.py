import re

import pytest

from helpers.core.fmt import Table, fmt_bytes, fmt_gib, fmt_mib, fmt_rate, fmt_ratio, fmt_seconds


def test_bytes():
    assert fmt_bytes(0) == "0 B"
    assert fmt_bytes(1023) == "1023 B"
    assert fmt_bytes(1536) == "1.50 KiB"
    assert fmt_bytes(3 * 2**20) == "3.00 MiB"
    assert fmt_bytes(46068 * 2**20) == "44.99 GiB"
    assert fmt_bytes(-2 * 2**20) == "-2.00 MiB"
    assert fmt_mib(2**21) == "2.0 MiB"
    assert fmt_gib(2**30, 1) == "1.0 GiB"


def test_measured_values_carry_a_tilde():
    assert fmt_seconds(0.0123) == "~12.3 ms"
    assert fmt_seconds(2.5) == "~2.50 s"
    assert fmt_seconds(4e-6) == "~4.00 µs"
    assert fmt_rate(1234.4) == "~1,234 samples/s"
    assert fmt_rate(12.345, "steps/s") == "~12.3 steps/s"
    assert fmt_ratio(1.834) == "~1.83x"
    assert fmt_ratio(0.5, measured=False) == "0.50x"


def sanitize(text: str) -> str:
    """Apply tests/sanitize.cfg the way nbval does (same parser, same order)."""
    from pathlib import Path

    from nbval.plugin import get_sanitize_patterns

    cfg = (Path(__file__).resolve().parents[2] / "sanitize.cfg").read_text()
    for regex, replace in get_sanitize_patterns(cfg):
        text = re.sub(regex, replace, text)
    return text


def test_sanitizer_masks_every_measured_format():
    for a, b in [(fmt_seconds(0.5), fmt_seconds(0.0005)), (fmt_seconds(12), fmt_seconds(3e-6)),
                 (fmt_rate(98765.4), fmt_rate(1.5)), (fmt_ratio(12.3), fmt_ratio(0.97))]:
        assert sanitize(f"took {a} here") == sanitize(f"took {b} here")
    # exact numbers are compared as they are
    assert sanitize("peak 12.50 MiB") == "peak 12.50 MiB"
    assert sanitize("peak 12.50 MiB") != sanitize("peak 12.51 MiB")


@pytest.mark.parametrize("bad", ["1", None, True, float("nan")])
def test_bad_numbers_are_rejected(bad):
    with pytest.raises((TypeError, ValueError)):
        fmt_bytes(bad)


def test_negative_durations_and_rates_are_rejected():
    with pytest.raises(ValueError, match="seconds"):
        fmt_seconds(-1)
    with pytest.raises(ValueError, match="per_second"):
        fmt_rate(-5)


def test_table_text_and_html():
    t = Table(["batch", "peak"], [[32, "1.00 GiB"], [64, "2.00 GiB"]], title="Peaks")
    text = t.text()
    assert text.splitlines()[0] == "Peaks"
    assert "batch" in text and "2.00 GiB" in text
    assert "<th>batch</th>" in t._repr_html_()
    assert "<caption>Peaks</caption>" in t._repr_html_()


def test_table_rejects_ragged_rows():
    with pytest.raises(ValueError, match="row 1 has 1 cells but there are 2 headers"):
        Table(["a", "b"], [[1, 2], [3]])
