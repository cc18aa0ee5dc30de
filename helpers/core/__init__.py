"""core layer; see CONTRIBUTING "Layers"."""

import importlib as _importlib


def __getattr__(name: str):
    """``helpers.<layer>.<module>`` without importing it first (imported on first use)."""
    try:
        return _importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
