"""Progress bars that help learners live and stay out of stored outputs (tqdm).

``progress()`` picks what ``tqdm.auto`` would pick (a widget bar in Jupyter, a text bar
elsewhere) but without ``tqdm.auto``'s asyncio wrapper: that wrapper calls ``iter()`` on the
iterable as soon as the bar is created, so wrapping a ``DataLoader`` starts an extra
iterator, which draws from the loader's shuffle generator (the batch order changes) and, with
``num_workers > 0``, starts a second set of worker processes.
"""

from __future__ import annotations

from .runtime import MODE, headless

__all__ = ["progress"]


def _tqdm_class():
    if MODE == "jupyter":
        try:
            import ipywidgets  # noqa: F401  (tqdm.notebook needs it)
            from tqdm.notebook import tqdm

            return tqdm
        except ImportError:
            pass
    from tqdm.std import tqdm

    return tqdm


def progress(iterable=None, **kwargs):
    """A tqdm progress bar over ``iterable``, switched off when nobody watches live output.

    In JupyterLab this is tqdm's widget bar; in scripts and headless runs (nbval,
    ``make outputs``) it is disabled, so stored notebooks hold no half-drawn bars. Any tqdm
    keyword works (``desc=``, ``total=``, ``leave=``); pass ``disable=False`` to force it on.
    Iterating through it yields exactly what iterating ``iterable`` yields, in the same order.
    """
    kwargs.setdefault("disable", headless())
    return _tqdm_class()(iterable, **kwargs)
