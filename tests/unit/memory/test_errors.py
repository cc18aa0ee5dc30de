"""memory.errors.release_after_error and the error IPython keeps after a failed cell.

IPython keeps the error that ended a cell for ``%debug``: ``sys.last_type``,
``sys.last_value``, ``sys.last_traceback`` and, on Python 3.12 and later, ``sys.last_exc``.
CI runs Python 3.11, where ``sys.last_exc`` does not exist, so these tests set it.
"""

import gc
import sys
import weakref

import pytest
import torch

from helpers.memory.errors import release_after_error

_NAMES = ("last_type", "last_value", "last_traceback", "last_exc")


@pytest.fixture(autouse=True)
def keep_sys_last():
    """Whatever a test sets among sys.last_* is restored (or removed) afterwards; pytest itself
    deletes them before each test's call, so monkeypatch's own undo cannot be used."""
    saved = {name: getattr(sys, name) for name in _NAMES if hasattr(sys, name)}
    for name in _NAMES:
        setattr(sys, name, None)
    yield
    for name in _NAMES:
        if name in saved:
            setattr(sys, name, saved[name])
        elif hasattr(sys, name):
            delattr(sys, name)


def failed_step():
    """An error whose traceback holds a frame with a tensor; and a weakref to the tensor."""
    refs = []

    def step():
        activations = torch.ones(1000)
        refs.append(weakref.ref(activations))
        raise torch.OutOfMemoryError("CUDA out of memory.")

    try:
        step()
    except torch.OutOfMemoryError as exc:
        return exc, refs[0]


@pytest.fixture
def no_gc():
    """Frames must be released by clearing them, not by a collection that happens to run."""
    gc.disable()
    yield
    gc.enable()


def test_an_error_kept_only_in_sys_last_exc_is_released(no_gc):
    error, ref = failed_step()
    sys.last_exc = error  # Python >= 3.12 and IPython; the other three stay None
    del error
    assert ref() is not None  # sys.last_exc alone keeps the frame and its tensor
    emptied = []
    release_after_error(None, lambda: emptied.append(True))
    assert ref() is None and emptied == [True]
    assert sys.last_exc is None


def test_clearing_only_the_three_older_names_leaves_the_memory_held(no_gc):
    """The recipe taught before (sys.last_type/value/traceback = None) frees nothing on 3.12+."""
    error, ref = failed_step()
    sys.last_type, sys.last_value, sys.last_traceback = type(error), error, error.__traceback__
    sys.last_exc = error
    del error
    sys.last_type = sys.last_value = sys.last_traceback = None
    gc.collect()
    assert ref() is not None
    sys.last_exc = None
    gc.collect()
    assert ref() is None


def test_all_four_names_are_cleared(no_gc):
    error, ref = failed_step()
    sys.last_type, sys.last_value, sys.last_traceback = type(error), error, error.__traceback__
    sys.last_exc = error
    kept = error  # a reference of the learner's own: clearing the frames frees the tensor
    del error
    release_after_error(None)
    assert ref() is None and kept.__traceback__ is None
    assert all(getattr(sys, name) is None for name in _NAMES)


def test_on_python_3_11_without_sys_last_exc(no_gc):
    if hasattr(sys, "last_exc"):
        del sys.last_exc
    error, ref = failed_step()
    sys.last_type, sys.last_value, sys.last_traceback = type(error), error, error.__traceback__
    del error
    release_after_error(None)
    assert ref() is None and not hasattr(sys, "last_exc")


def test_last_error_false_leaves_the_notebook_error_alone(no_gc):
    error, ref = failed_step()
    sys.last_exc = error
    del error
    release_after_error(None, last_error=False)
    assert ref() is not None and sys.last_exc is not None
    release_after_error(None)
    assert ref() is None
