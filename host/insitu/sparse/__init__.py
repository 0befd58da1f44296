"""Sparse update with quantization-aware scaling (Tiny Training): the int8 graph IR, models,
their pretraining and quantization, tasks, update schemes, the training compiler and its code generation, gradient
calibration, the NumPy golden model of every kernel, the host simulator, and the scheme search.

It runs on no board: the microcontroller platform (:mod:`insitu.mcu`) flashes, links and trains
what this package compiles, and imports it; this package imports no platform.
"""

from insitu import lazy_exports

#: The default rates of training on the microcontroller (``insitu train --algo sparse`` and the
#: ``insitu mcu`` commands): lr 0.01 for the backbone and ``HEAD_LR_FACTOR`` times that for the
#: new classifier. Measured in docs/mcu.md ("int8 (QAS) vs float", mbv2-28 -> digits, means of 3
#: seeds): at lr 0.05 for every layer, the previous default, the full update fell below the
#: classifier alone (40.9 vs 59.7 % after 500 samples; float SGD does the same), because one rate
#: does not suit both the fresh head and the pretrained backbone; at these rates it reached 95.8 %
#: (3 epochs).
DEFAULT_LR = 0.01
HEAD_LR_FACTOR = 5.0

__all__ = ["Graph", "Scheme", "Simulator", "Compiled", "compile_training", "pretrained", "run_search"]
__getattr__, __dir__ = lazy_exports(__name__, {
    "Graph": "insitu.sparse.graph", "Scheme": "insitu.sparse.scheme",
    "Simulator": "insitu.sparse.simulate", "Compiled": "insitu.sparse.compiler",
    "compile_training": "insitu.sparse.compiler", "pretrained": "insitu.sparse.pretrain",
    "run_search": "insitu.sparse.search",
})
