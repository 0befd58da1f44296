"""The host simulator of the MCU path: the compiled program run by the golden kernels.

It executes the very program table the device runs, on an arena with the very layout of the
memory plan, with :mod:`insitu.sparse.golden` (the NumPy golden model of the firmware kernels), so
its results are bit-exact with the device's. Used to search schemes and to predict what the device
will report.
"""

from __future__ import annotations

import numpy as np

from insitu.sparse import abi, golden
from insitu.sparse.compiler import Compiled


class Simulator:
    def __init__(self, compiled: Compiled):
        self.c = compiled
        self.A = np.zeros(compiled.arena_bytes, dtype=np.uint8)
        self.P = np.asarray(compiled.program, dtype=np.int32)      # a buffer of its own, as on the device
        self.blob = compiled.blob
        self._run("init")
        self.samples_done = 0

    def _run(self, segment: str) -> None:
        for o in self.c.calls[segment]:
            golden.run(self.A, self.P, o, self.blob)

    def _io(self, word: int) -> int:
        return int(self.A[self.c.io_off + 4 * word:self.c.io_off + 4 * word + 4].view("<i4")[0])

    def _put(self, codes: np.ndarray) -> None:
        """The sample's input as the device takes it: window by window into the input buffer,
        each window's part of the forward pass run as it arrives (the stage segments)."""
        stream = self.c.input_stream(codes).view(np.uint8)
        at, off = 0, self.c.input_off
        for p, n in enumerate(self.c.window_bytes()):
            self.A[off:off + n] = stream[at:at + n]
            at += n
            if self.c.stages:
                self._run(f"stage{p}")

    def train_step(self, codes: np.ndarray, label: int) -> int:
        """One sample of training; returns the class predicted before the update."""
        self._put(codes)
        self.A[self.c.io_off + 4 * abi.IO_LABEL:self.c.io_off + 4 * abi.IO_LABEL + 4] = \
            np.frombuffer(np.int32(label).astype("<i4").tobytes(), dtype=np.uint8)
        self._run("train")
        self.samples_done += 1
        if self.c.options.accumulate > 1 and (self._io(abi.IO_STEP) & 0xFFFFFFFF) % self.c.options.accumulate == 0:
            self._run("apply")
        return self._io(abi.IO_PREDICTED)

    def predict(self, codes: np.ndarray) -> int:
        self._put(codes)
        self._run("infer")
        return self._io(abi.IO_PREDICTED)

    def accuracy(self, x_codes: np.ndarray, labels: np.ndarray) -> float:
        hits = sum(self.predict(x) == int(y) for x, y in zip(x_codes, labels))
        return hits / max(1, len(labels))

    def train(self, x_codes: np.ndarray, labels: np.ndarray) -> None:
        for x, y in zip(x_codes, labels):
            self.train_step(x, int(y))

    def trained_bytes(self) -> bytes:
        """The checkpointed state: the trained tensors' arena ranges, concatenated."""
        return b"".join(self.A[o:o + n].tobytes() for o, n in self.c.trained)
