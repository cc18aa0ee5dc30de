"""core layer; see CONTRIBUTING "Layers"."""

import importlib as _importlib


def lazy_submodules(package: str):
    """A module ``__getattr__`` for the layer package ``package``: ``helpers.<layer>.<module>``
    works without importing the module first (it is imported on first use). Every layer's
    ``__init__`` uses it: ``__getattr__ = lazy_submodules(__name__)``."""

    def __getattr__(name: str):
        try:
            return _importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{package}.{name}":
                raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return __getattr__


__getattr__ = lazy_submodules(__name__)
