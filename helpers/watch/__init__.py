"""watch layer; see CONTRIBUTING "Layers"."""

from ..core import lazy_submodules as _lazy_submodules

__getattr__ = _lazy_submodules(__name__)
