"""Progress bars that help learners live and stay out of stored outputs (tqdm.auto)."""

from __future__ import annotations

from .runtime import headless

__all__ = ["progress"]


def progress(iterable=None, **kwargs):
    """``tqdm.auto.tqdm(iterable, **kwargs)``, disabled when nobody watches live output.

    In JupyterLab this is tqdm's widget bar; in scripts and headless runs (nbval,
    ``make outputs``) it is switched off, so stored notebooks hold no half-drawn bars.
    Pass ``disable=False`` to force it on.
    """
    from tqdm.auto import tqdm

    kwargs.setdefault("disable", headless())
    return tqdm(iterable, **kwargs)
