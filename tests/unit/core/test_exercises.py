import pytest

from helpers.core.exercises import CheckResult, NotSolved, check


def test_check_passes_with_default_and_custom_message():
    assert check("01-demo", lambda: None).text() == "Challenge 01-demo: solved: well done."
    assert check("01-demo", lambda: "loss fell to 0.1").message == "loss fell to 0.1"


def test_check_reports_not_solved_without_raising():
    def test():
        raise NotSolved("`device` is still None: set it with pick_device().")

    result = check("01-demo", test)
    assert not result
    assert result.text() == (
        "Challenge 01-demo: not solved yet: `device` is still None: set it with pick_device()."
    )
    assert "alert-warning" in result._repr_html_()


def test_plain_asserts_and_learner_errors_are_reported():
    def failing_assert():
        raise AssertionError("one is not two")

    assert check("02-x", failing_assert).message == "one is not two"

    def broken():
        return {}["missing"]

    result = check("02-x", broken)
    assert not result.passed
    assert result.message.startswith("your code raised KeyError: 'missing' (in broken, line")


def test_unwritten_stub_functions_are_named():
    def train_step():
        raise NotImplementedError

    result = check("01-demo", train_step)
    assert result.message == (
        "`train_step` is not written yet (it still raises NotImplementedError)."
    )


@pytest.mark.parametrize("bad", ["1-demo", "01_demo", "01-Demo", "01-", "01-demo\n"])
def test_bad_ids_are_rejected(bad):
    with pytest.raises(ValueError, match="exercise_id must look like"):
        check(bad, lambda: None)


def test_an_empty_or_non_string_id_is_rejected():
    with pytest.raises(ValueError, match="exercise_id must not be empty"):
        check("", lambda: None)
    with pytest.raises(TypeError, match="exercise_id must be a string"):
        check(None, lambda: None)


def test_non_callable_tests_are_rejected():
    with pytest.raises(TypeError, match="function without arguments"):
        check("01-demo", True)


def test_result_is_a_small_value_object():
    r = CheckResult("03-a", True, "ok")
    assert repr(r) == "Challenge 03-a: solved: ok" and bool(r)
