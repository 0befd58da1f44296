"""insitu: a hardware/software co-design flow for training neural networks on edge devices.

Subpackages: ``numerics`` (the one fixed-point spec), ``nn`` (NumPy training core), ``data``
(datasets), ``boards`` (board descriptions and twins), ``rtl`` (Amaranth processing elements),
``cli`` (the ``insitu`` command). See README.md for the map.
"""

__version__ = "0.1.0"


def lazy_exports(package: str, where: dict[str, str]):
    """``(__getattr__, __dir__)`` for a package whose public names (``where``: name -> module) are
    imported on first use, so ``from insitu.lrt import KroneckerSum`` works while importing the
    package stays cheap (the CLI imports every method package at start)."""
    import importlib
    import sys

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name]), name)

    def __dir__():                        # the package's own names and the lazy ones
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__
