"""Where the MCU path's model comes from: a built-in name (``mbv2-28``, ``mbv2-tiny``, the paper's
128x128 networks ``mbv2-w0.35``, ``proxyless-w0.3``, ``mcunet-5fps``: pretrained here,
:mod:`insitu.sparse.pretrain`) or a float ONNX file (``*.onnx``: imported,
:mod:`insitu.sparse.onnx_io`). Everything that takes ``--model`` asks these functions, so the two
kinds go through one path:

* :func:`check_model` (milliseconds, before any slow work): a known name, or a readable ONNX
  file the int8 graph can express, else a :class:`~insitu.errors.UsageError` naming it;
* :func:`model_input_shape`, :func:`model_untrained_graph` (names and shapes, for checks),
  :func:`model_graph` (the int8 graph to train), :func:`model_label` (a file-name-safe name);
* :func:`calibration_images`: the task's images an ONNX model's activation scales are measured on
  (when the file does not carry insitu's).

Which module does what, for :func:`model_graph`: a built-in name goes to
:func:`insitu.sparse.pretrain.pretrained` (the cache, else float training), which quantizes with
:mod:`insitu.sparse.quantize` (calibration, the int8 graph); an ONNX file goes to
:func:`insitu.sparse.onnx_io.import_onnx`, which calibrates with the same rule. The untrained
graphs (:func:`model_untrained_graph`) and the new head are :mod:`insitu.sparse.quantize`'s.

``onnx`` is imported only when an ONNX model is used. Imported graphs are kept per process, keyed
by the file's sha256 and the calibration (a changed file is imported again).
"""

from __future__ import annotations

import collections
import copy
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from insitu.errors import UsageError
from insitu.sparse.graph import Graph

if TYPE_CHECKING:                       # onnx_io is imported only when an ONNX model is used
    from insitu.sparse.onnx_io import FloatNet

__all__ = ["MODEL_FILE_SUFFIX", "is_model_file", "check_model", "model_label", "file_safe", "model_input_shape",
           "model_untrained_graph", "model_graph", "calibration_images", "CALIBRATION_SEED"]

MODEL_FILE_SUFFIX = ".onnx"
#: The calibration images of an ONNX model: CALIBRATION_SAMPLES of the task's training images,
#: drawn with this seed (not the run's: one model, one calibration, whatever the seed).
CALIBRATION_SEED = 0

_NETS: "collections.OrderedDict[str, FloatNet]" = collections.OrderedDict()     # sha256 -> FloatNet
_GRAPHS: "collections.OrderedDict[tuple, Graph]" = collections.OrderedDict()    # (sha256, calibration) -> Graph
_KEEP = 8


def is_model_file(model) -> bool:
    return str(model).lower().endswith(MODEL_FILE_SUFFIX)


def _keep(cache: collections.OrderedDict, key, value):
    cache[key] = value
    while len(cache) > _KEEP:
        cache.popitem(last=False)
    return value


def _net(path: str) -> tuple[str, FloatNet]:
    """``(sha256, FloatNet)`` of an ONNX file, read once per content."""
    from insitu.sparse import onnx_io

    sha = onnx_io.file_sha256(path)
    if sha not in _NETS:
        _keep(_NETS, sha, onnx_io.read_onnx(path))
    _NETS.move_to_end(sha)
    return sha, _NETS[sha]


def check_model(model) -> None:
    """A built-in model name, or an ONNX file that exists, reads as ONNX and maps onto the int8
    graph with rows the firmware takes; else a UsageError naming it."""
    if is_model_file(model):
        from insitu.sparse import abi

        graph = model_untrained_graph(model)
        _, height, width = graph.tensors[graph.input].shape
        if height != width:     # the tasks are brought to square inputs (insitu.sparse.tasks)
            raise UsageError(f"model {model} takes {height}x{width} images; the MCU path takes square "
                             "inputs: export the model with a square input")
        wide = max(t.shape[2] for t in graph.tensors.values())
        if wide > abi.MAX_ROW:
            raise UsageError(f"model {model}: maps {wide} pixels wide; the firmware's kernels take rows of at "
                             f"most {abi.MAX_ROW}")
        return
    from insitu.sparse.models import model_names

    if model not in model_names():
        raise UsageError(f"unknown model {model!r}; known models: {', '.join(model_names())}, "
                         f"or a FILE{MODEL_FILE_SUFFIX}")


def file_safe(text: str) -> str:
    """``text`` with every character but letters, digits and ``-_.`` replaced by ``_``."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)


def model_label(model) -> str:
    """A short file-name-safe name: the built-in name, or ``<file stem>-<sha256[:12]>``."""
    if not is_model_file(model):
        return str(model)
    from insitu.sparse import onnx_io

    stem = file_safe(Path(model).stem) or "model"
    return f"{stem}-{onnx_io.file_sha256(model)[:12]}"


def model_input_shape(model) -> tuple[int, int, int]:
    """The model's input ``(C, H, W)``."""
    if is_model_file(model):
        _, net = _net(model)
        return net.shapes[net.input]
    from insitu.sparse.models import model_config

    config = model_config(model)
    return (config.in_channels, config.input_size, config.input_size)


def model_untrained_graph(model, num_classes: int | None = None) -> Graph:
    """The model's layers' names and shapes in milliseconds, for checks (no pretraining, no
    calibration): the built-in :func:`~insitu.sparse.quantize.untrained_graph`, or the ONNX
    file's graph with placeholder scales; with ``num_classes``, with a new head."""
    from insitu.sparse.quantize import new_head, untrained_graph

    if not is_model_file(model):
        return untrained_graph(model, num_classes)
    graph = _imported(model, "untrained", lambda path, net: _import(path, net, uncalibrated=True))
    return graph if num_classes is None else new_head(graph, num_classes)


def model_graph(model, calib_images: np.ndarray | None = None) -> Graph:
    """The int8 graph to train: a built-in model pretrained (and cached) by
    :func:`~insitu.sparse.pretrain.pretrained` (``calib_images`` unused), or the ONNX file
    imported, with its own insitu scales if it carries them, else calibrated on ``calib_images``
    (uint8, in the model's size and channels: e.g. :func:`calibration_images` of the task's)."""
    if not is_model_file(model):
        from insitu.sparse.pretrain import pretrained

        return pretrained(model)
    if calib_images is None:
        key = "own"                     # a file without insitu's scales: import_onnx says what is missing
    else:
        images = np.ascontiguousarray(calib_images)
        key = hashlib.sha256(images.tobytes() + repr(images.shape).encode()).hexdigest()
    return _imported(model, key, lambda path, net: _import(path, net, calib_images))


def _import(path, net, calib_images=None, **kwargs) -> Graph:
    from insitu.sparse.onnx_io import import_onnx

    return import_onnx(path, calib_images, net=net, **kwargs)


def _imported(model, key: str, make) -> Graph:
    sha, net = _net(model)
    full = (sha, key)
    if full not in _GRAPHS:
        _keep(_GRAPHS, full, make(model, net))
    _GRAPHS.move_to_end(full)
    return copy.deepcopy(_GRAPHS[full])         # callers may change theirs (a new head, training)


def calibration_images(images: np.ndarray) -> np.ndarray:
    """The :data:`~insitu.sparse.quantize.CALIBRATION_SAMPLES` training images an ONNX model's
    activation scales are measured on (all of them if fewer), drawn with :data:`CALIBRATION_SEED`."""
    from insitu.sparse.quantize import CALIBRATION_SAMPLES

    order = np.random.default_rng(CALIBRATION_SEED).permutation(len(images))[:CALIBRATION_SAMPLES]
    return np.asarray(images)[np.sort(order)]
