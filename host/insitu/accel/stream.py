"""Words and beats of the accelerator's AXI streams.

A stream is a flat int64 array of signed 16-bit words, :data:`~insitu.accel.params.STREAM_WORDS`
per 128-bit beat, word 0 in the low bits. The TT and LRT golden models lay their operands out in
such words; the twins and the cocotb bench move them as beats.
"""

from __future__ import annotations

import numpy as np

from .params import STREAM_WORDS, WORD_BITS

_MASK = (1 << WORD_BITS) - 1


def to_words(values) -> np.ndarray:
    """Signed codes -> unsigned 16-bit words (the bus view)."""
    return np.asarray(values, dtype=np.int64) & _MASK


def from_words(words) -> np.ndarray:
    """Unsigned 16-bit words -> signed codes."""
    w = np.asarray(words, dtype=np.int64) & _MASK
    return np.where(w >= 1 << (WORD_BITS - 1), w - (1 << WORD_BITS), w)


def pad_words(values) -> np.ndarray:
    """A flat stream of words padded with zeros to a whole number of beats."""
    v = np.asarray(values, dtype=np.int64).ravel()
    return np.concatenate([v, np.zeros(-v.size % STREAM_WORDS, np.int64)])


def beats(words) -> list[int]:
    """Words (a whole number of beats) -> 128-bit beat integers (word 0 in the low bits)."""
    w = to_words(words).reshape(-1, STREAM_WORDS)
    return [sum(int(v) << (WORD_BITS * k) for k, v in enumerate(row)) for row in w]


def words_of(beat_values) -> np.ndarray:
    """128-bit beat integers -> signed words."""
    out = [(int(b) >> (WORD_BITS * k)) & _MASK for b in beat_values for k in range(STREAM_WORDS)]
    return from_words(np.array(out, dtype=np.int64))
