"""Properties of find_batch_size's arguments: any value of any argument either gives a result
or a TypeError/ValueError that names the argument (the rule in helpers/core/checks.py)."""

import pytest

hypothesis = pytest.importorskip("hypothesis")
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import helpers  # noqa: E402

# numbers around every boundary, huge and odd ones, and things that are not numbers at all
ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70), st.integers(-10**30, 10**30),
    st.sampled_from([2**62, 2**62 + 1, 10**400, 10**5000]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 0.05, 0.25, 0.5]),
    st.text(max_size=8), st.sampled_from(["L40S", "1 GiB", "5%", "adam"]),
    st.lists(st.integers(0, 3), max_size=2), st.just(object()),
)
ARGUMENTS = ["start", "maximum", "margin", "steps_per_trial", "multiple_of", "tolerance",
             "max_trials", "capacity", "model", "optimizer"]


def _search(**kwargs):
    kwargs.setdefault("maximum", 64)
    with helpers.VirtualGPU("1 GiB", device="cpu"):
        return helpers.find_batch_size(lambda b: None, **kwargs)


@given(name=st.sampled_from(ARGUMENTS), value=ANYTHING)
def test_any_value_of_any_argument_gives_a_result_or_an_error_naming_it(name, value):
    try:
        result = _search(**{name: value})
    except (TypeError, ValueError) as exc:
        assert name in str(exc), f"{name}={value!r:.60}: {exc}"
    else:
        assert isinstance(result.batch_size, int) and result.batch_size >= 1
        assert result.n_steps <= result.steps_per_trial * result.n_trials
        assert result.maximum is None or result.batch_size <= result.maximum


@given(step=ANYTHING)
def test_a_step_that_is_not_a_function_is_refused_naming_step(step):
    with pytest.raises(TypeError, match="step must be a function"):
        helpers.find_batch_size(step, maximum=8)


@settings(max_examples=15)  # each out-of-memory trial runs a full garbage collection
@given(start=st.integers(1, 64), maximum=st.integers(1, 128), multiple_of=st.integers(1, 16),
       tolerance=st.sampled_from([0, 0.01, 0.25]))
def test_valid_settings_always_close_on_a_simulated_limit(start, maximum, multiple_of,
                                                          tolerance):
    """A step that runs out of memory above 50 samples (no memory statistics): the search
    closes below the limit, and with multiple_of=1, tolerance=0 finds it exactly."""
    def step(b):
        if b > 50:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    if maximum < start:
        with pytest.raises(ValueError, match="maximum"):
            helpers.find_batch_size(step, start=start, maximum=maximum)
        return
    r = helpers.find_batch_size(step, start=start, maximum=maximum, multiple_of=multiple_of,
                                tolerance=tolerance, margin=0)
    ran = max(t.batch_size for t in r.trials if t.fits)  # the answer is it, snapped
    assert r.batch_size <= ran <= min(50, maximum)
    assert r.stopped in ("the maximum fits", f"{ran} fits, {r.smallest_too_big} does not")
    if multiple_of == 1 and tolerance == 0:
        assert r.batch_size == min(50, maximum)
