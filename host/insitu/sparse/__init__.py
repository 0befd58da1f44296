"""Sparse update with quantization-aware scaling (Tiny Training): the int8 graph IR, models,
quantization and tasks, update schemes, the training compiler and its code generation, gradient
calibration, the NumPy golden model of every kernel, the host simulator, and the scheme search.

It runs on no board: the microcontroller platform (:mod:`insitu.mcu`) flashes, links and trains
what this package compiles, and imports it; this package imports no platform.
"""

from insitu import lazy_exports

__all__ = ["Graph", "Scheme", "Simulator", "Compiled", "compile_training", "pretrained", "run_search"]
__getattr__, __dir__ = lazy_exports(__name__, {
    "Graph": "insitu.sparse.graph", "Scheme": "insitu.sparse.scheme",
    "Simulator": "insitu.sparse.simulate", "Compiled": "insitu.sparse.compiler",
    "compile_training": "insitu.sparse.compiler", "pretrained": "insitu.sparse.quantize",
    "run_search": "insitu.sparse.search",
})
