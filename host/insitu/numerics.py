"""The one fixed-point spec of insitu.

Every format that a hardware kernel (RTL processing element, MicroPython firmware kernel) computes in
is defined here, once. The golden model, the RTL generator (for bit widths) and the firmware tests
all import this module; nothing else defines a format, a rounding rule or an accumulator width.

Conventions (read these before touching a kernel):

* A format stores an integer *code*; its real value is ``code * 2**-frac`` (or, for the mid-rise
  variant, ``(code + 1/2) * 2**-frac``). Signed codes are two's complement.
* **Rounding** is to the nearest code, **ties toward +infinity** ("round half up"):
  ``round(x) = floor(x + 1/2)``. In integer hardware this is the add-half-then-arithmetic-shift
  ``(v + 2**(s-1)) >> s``, which is why this tie rule was chosen: it is what a shifter does for free.
* **Stochastic rounding** (tiny training's int8 weight updates, :func:`sr_shift`): a step in
  ``2**-SR_BITS`` codes moves the weight by ``floor((u + rnd) / 2**SR_BITS)``, ``rnd`` a
  deterministic hash of the training step, the op and the element (:func:`sr_noise`).
* **Saturation**: a code that does not fit is clamped to the format's ``[qmin, qmax]``.
  Nothing wraps around, anywhere.
* **Products and sums** of codes are exact integers; :func:`product_bits` and
  :func:`accumulator_bits` give the width an accumulator needs never to overflow.
* The **float view** of each operation (``quantize``, ``requantize_float``) is derived from the
  integer form and agrees with it exactly; the property tests check that.

Formats by paper:

* LRT hardware model (appendix D): weights 8 b in [-1, 1], biases and accumulators 16 b in [-8, 8],
  activations 8 b in [0, 2], gradients 8 b in [-1, 1]; 1- and 2-bit formats are mid-rise; the
  low-rank factors L, R are 16 b with a power-of-2 range set by their max |x| (:func:`max_abs_format`).
* TT on FPGA (section 3.2-3.3): 4-bit factors with a fixed scale, 8-bit activations and biases,
  16-bit activations-or-gradients in the PEs, power-of-2 scales chosen on the fly so that the mean
  |x| of each tensor stays in [0.1, 0.3] (:class:`AutoScale`).
* Tiny training (eq. 1): int8 x int8 products plus an int32 bias, requantized per output channel
  by a float or a fixed-point (multiplier, shift) scale (:class:`RequantScale`).
* E2-Train PSG: 8-bit activations and weights, 16-bit gradients; the most significant bits of the
  codes (:func:`msb_code`) feed the sign predictor (:func:`psg_weight_gradient`, :func:`psg_sign`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

__all__ = [
    "FixedPoint",
    "round_half_up",
    "shift_round",
    "SR_BITS",
    "SR_K_STEP",
    "SR_K_SALT",
    "SR_M1",
    "SR_M2",
    "sr_noise",
    "sr_shift",
    "saturate",
    "code_range",
    "product_bits",
    "accumulator_bits",
    "max_abs_format",
    "AutoScale",
    "RequantScale",
    "requantize_fixed",
    "requantize_float",
    "msb_code",
    "LRT_WEIGHT",
    "LRT_BIAS",
    "LRT_ACCUMULATOR",
    "LRT_ACTIVATION",
    "LRT_GRADIENT",
    "LRT_FACTOR_BITS",
    "lrt_weight_format",
    "TT_FACTOR_BITS",
    "TT_ACTIVATION_BITS",
    "TT_BIAS_BITS",
    "TT_PE_DATA_BITS",
    "TT_MEAN_ABS_TARGET",
    "TT_PE_HEADROOM_BITS",
    "TT_ACTIVATION_HEADROOM_BITS",
    "tt_factor_format",
    "tt_pe_format",
    "tt_factor_frac",
    "TT_FACTOR_CLIP_STDS",
    "tt_autoscale",
    "TT_BIAS",
    "INT8",
    "INT32",
    "REQUANT_MULTIPLIER_BITS",
    "PSG_ACTIVATION_BITS",
    "PSG_WEIGHT_BITS",
    "PSG_GRADIENT_BITS",
    "PSG_OUTPUT_BITS",
    "PSG_ACTIVATION_MSB_BITS",
    "PSG_GRADIENT_MSB_BITS",
    "psg_weight_gradient",
    "psg_threshold",
    "psg_sign",
    "FORMATS",
]

# Integer codes are held in int64 arrays. The functions below refuse (ValueError) operands whose
# shifts or products would leave 63 bits, so NumPy integer arithmetic is exact where it answers.
CODE_DTYPE = np.int64
_INT_LIMIT = 1 << 62          # magnitudes kept below this so that +half and shifts cannot overflow


# --------------------------------------------------------------------------- integer primitives

def round_half_up(x):
    """Round to nearest, ties toward +infinity: ``floor(x + 1/2)``, as int64 codes.

    Computed as ``floor(x)`` plus one where the fraction is >= 1/2 (both exact in float64);
    ``floor(x + 0.5)`` itself would round 0.49999999999999994 up. Magnitudes clip at 2**62.
    """
    x = np.asarray(x, dtype=np.float64)
    if np.isnan(x).any():
        raise ValueError("round_half_up: cannot round NaN")
    whole = np.floor(x)
    rounded = whole + (x - whole >= 0.5)
    return np.clip(rounded, -_INT_LIMIT, _INT_LIMIT).astype(CODE_DTYPE)


def _check_magnitude(v, what: str) -> None:
    if v.size and max(int(v.max()), -int(v.min())) >= _INT_LIMIT:
        raise ValueError(f"{what}: magnitude reaches 2**62; int64 arithmetic would overflow")


def shift_round(v, shift: int | np.ndarray):
    """Integer ``v * 2**-shift`` rounded by the spec's tie rule (ties toward +infinity).

    ``shift > 0`` is the add-half-then-arithmetic-shift of the hardware; ``shift <= 0`` is an exact
    left shift. ``shift`` may be an array (one per channel, broadcast against ``v``; all >= 1).
    """
    v = np.asarray(v, dtype=CODE_DTYPE)
    _check_magnitude(v, "shift_round")
    shift = np.asarray(shift, dtype=CODE_DTYPE)
    if shift.ndim == 0 and shift <= 0:
        if v.size and int(np.max(np.abs(v))) >= _INT_LIMIT >> int(-shift):
            raise ValueError(f"shift_round: left shift by {-shift} overflows int64")
        return v << -shift
    if shift.ndim == 0 and shift < 63:          # one shift: the hardware formula as it stands
        return (v + (np.int64(1) << (int(shift) - 1))) >> int(shift)
    if np.any(shift < 1):
        raise ValueError("shift_round: an array of shifts (one per channel) must be >= 1")
    # |v| < 2**62: from a shift of 63 on, every result is 0 (and the hardware shifter agrees).
    return np.where(shift >= 63, 0, (v + (np.int64(1) << np.minimum(shift, 62) - 1)) >> np.minimum(shift, 62))


# --------------------------------------------------------------------------- stochastic rounding
#
# Tiny training's weight updates round stochastically at 2**-SR_BITS of a code. Round-to-nearest
# loses every step smaller than half a code, and which steps those are is not random: the softmax
# spreads the wrong classes' small negative steps over many rows while the label's row gets one
# large positive step, so the rows drift up together until the logits saturate (measured: a
# classifier-only scheme collapsed to one class after ~450 samples at lr 0.05, docs/mcu.md).
# A step u in 2**-SR_BITS codes moves the weight by floor((u + rnd) / 2**SR_BITS), rnd uniform in
# [0, 2**SR_BITS): unbiased. rnd is a hash, not a generator, so that the device (MicroPython
# viper, 32-bit words) and the host draw the same numbers without sharing state: rnd of element e
# (its index in the op's trained rows) of the op with salt `salt` in step `step` is the top
# SR_BITS bits of mix(step*SR_K_STEP + salt*SR_K_SALT + e), mix(x) = x ^= x >> 16; x *= SR_M1;
# x ^= x >> 15; x *= SR_M2; x ^= x >> 16, all mod 2**32 with logical shifts (constants below
# 2**30: small ints on a 32-bit MicroPython).

SR_BITS = 8
SR_K_STEP = 0x2545F491
SR_K_SALT = 0x1B873593
SR_M1 = 0x2C1B3C6D
SR_M2 = 0x297A2D39


def sr_noise(step: int, salt: int, n: int) -> np.ndarray:
    """``rnd`` of elements 0..n-1 of a weight update in training step ``step`` of the op with
    ``salt``: uniform in [0, 2**SR_BITS), the hash above (uint32 arithmetic)."""
    mask = np.uint64(0xFFFFFFFF)
    key = (int(step) * SR_K_STEP + int(salt) * SR_K_SALT) & 0xFFFFFFFF
    x = (np.uint64(key) + np.arange(n, dtype=np.uint64)) & mask
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(SR_M1)) & mask
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(SR_M2)) & mask
    x ^= x >> np.uint64(16)
    return (x >> np.uint64(32 - SR_BITS)).astype(CODE_DTYPE)


def sr_shift(u, rnd):
    """A step ``u`` in ``2**-SR_BITS`` codes, rounded stochastically to whole codes with the noise
    ``rnd`` of :func:`sr_noise`: ``floor((u + rnd) / 2**SR_BITS)``."""
    return (np.asarray(u, dtype=CODE_DTYPE) + np.asarray(rnd, dtype=CODE_DTYPE)) >> SR_BITS


def saturate(v, bits: int, signed: bool = True):
    """Clamp integer codes into the range of a ``bits``-wide (un)signed integer."""
    lo, hi = code_range(bits, signed)
    return np.clip(np.asarray(v, dtype=CODE_DTYPE), lo, hi)


def code_range(bits: int, signed: bool = True) -> tuple[int, int]:
    """``(qmin, qmax)`` of a ``bits``-wide (un)signed integer code."""
    if bits < 1:
        raise ValueError(f"bits must be >= 1, got {bits}")
    if signed:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def _signed_width(lo: int, hi: int) -> int:
    """The fewest bits of a two's complement register that holds every integer in [lo, hi]."""
    return max(lo.bit_length() if lo >= 0 else (-lo - 1).bit_length(),
               hi.bit_length() if hi >= 0 else (-hi - 1).bit_length()) + 1


def _product_range(a_bits, b_bits, a_signed, b_signed) -> tuple[int, int]:
    a, b = code_range(a_bits, a_signed), code_range(b_bits, b_signed)
    products = [x * y for x in a for y in b]
    return min(products), max(products)


def product_bits(a_bits: int, b_bits: int, a_signed: bool = True, b_signed: bool = True) -> int:
    """Width of a signed register that holds any product of two codes (the exact minimum).

    Signed x signed needs ``a + b`` bits: only ``(-2**(a-1)) * (-2**(b-1))`` needs the top bit.
    """
    return _signed_width(*_product_range(a_bits, b_bits, a_signed, b_signed))


def accumulator_bits(a_bits: int, b_bits: int, terms: int,
                     a_signed: bool = True, b_signed: bool = True) -> int:
    """Width of a signed accumulator that never overflows summing ``terms`` products (the exact
    minimum for the worst case, all terms at the same extreme)."""
    if terms < 1:
        raise ValueError(f"terms must be >= 1, got {terms}")
    lo, hi = _product_range(a_bits, b_bits, a_signed, b_signed)
    return _signed_width(terms * lo, terms * hi)


# --------------------------------------------------------------------------- formats

@dataclass(frozen=True)
class FixedPoint:
    """A fixed-point format: ``bits``-wide codes whose value is ``code * 2**-frac``.

    ``frac`` may be negative (LSB above 1) or larger than ``bits`` (all values below 1/2).
    ``midrise`` formats have no zero level: value ``(code + 1/2) * 2**-frac`` (the LRT paper's
    1- and 2-bit weights: 1 bit in [-1, 1] gives {-0.5, +0.5}).
    """

    bits: int
    frac: int
    signed: bool = True
    midrise: bool = False
    name: str = ""

    def __post_init__(self):
        if not isinstance(self.bits, int) or self.bits < 1:
            raise ValueError(f"format {self.name or '?'}: bits must be an integer >= 1, got {self.bits!r}")
        if not isinstance(self.frac, int):
            raise ValueError(f"format {self.name or '?'}: frac must be an integer, got {self.frac!r}")
        if self.midrise and not self.signed:
            raise ValueError(f"format {self.name or '?'}: a mid-rise format must be signed")

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_range(cls, bits: int, lo: float, hi: float, *, midrise: bool | None = None,
                   name: str = "") -> "FixedPoint":
        """The uniform format that splits the clipping range [lo, hi] into ``2**bits`` steps.

        The step ``(hi - lo) / 2**bits`` must be a power of two. ``lo`` must be ``-hi`` (signed)
        or 0 (unsigned). Mid-rise is the default for signed formats of 1 or 2 bits, as in the
        LRT paper's bit-width study.
        """
        if not hi > lo:
            raise ValueError(f"format {name or '?'}: clipping range needs lo < hi, got [{lo}, {hi}]")
        step = Fraction(hi) - Fraction(lo)
        step /= 1 << bits
        frac = -math.log2(step)
        if frac != int(frac):
            raise ValueError(f"format {name or '?'}: range [{lo}, {hi}] in {bits} bits gives step "
                             f"{float(step)}, which is not a power of two")
        if lo == 0:
            signed = False
        elif lo == -hi:
            signed = True
        else:
            raise ValueError(f"format {name or '?'}: range [{lo}, {hi}] must be symmetric or start at 0")
        if midrise is None:
            midrise = signed and bits <= 2
        return cls(bits=bits, frac=int(frac), signed=signed, midrise=midrise, name=name)

    def with_frac(self, frac: int) -> "FixedPoint":
        """The same format at another power-of-2 scale."""
        return FixedPoint(self.bits, frac, self.signed, self.midrise, self.name)

    # -- derived properties ---------------------------------------------------------------------
    @property
    def qmin(self) -> int:
        return code_range(self.bits, self.signed)[0]

    @property
    def qmax(self) -> int:
        return code_range(self.bits, self.signed)[1]

    @property
    def lsb(self) -> float:
        """The step between neighbouring values."""
        return math.ldexp(1.0, -self.frac)

    @property
    def min_value(self) -> float:
        return float(self.to_float(self.qmin))

    @property
    def max_value(self) -> float:
        return float(self.to_float(self.qmax))

    # -- the integer form ------------------------------------------------------------------------
    def quantize_code(self, x):
        """Real values -> codes: nearest level (ties toward +inf), saturated."""
        scaled = np.ldexp(np.asarray(x, dtype=np.float64), self.frac)
        if np.isnan(scaled).any():
            raise ValueError(f"format {self.name or self}: cannot quantize NaN")
        if self.midrise:
            # Levels sit at (k + 1/2) LSB; the nearest one is floor(x / LSB) (boundaries at
            # integers, a value on a boundary goes up).
            codes = np.floor(np.clip(scaled, self.qmin - 1, self.qmax + 1))
        else:
            codes = round_half_up(np.clip(scaled, self.qmin - 1, self.qmax + 1))
        return np.clip(codes, self.qmin, self.qmax).astype(CODE_DTYPE)

    def saturate(self, codes):
        """Clamp integer codes into the format (no rescaling)."""
        return saturate(codes, self.bits, self.signed)

    def requantize(self, codes, from_frac: int):
        """Codes of scale ``2**-from_frac`` (for example an accumulator) -> codes of this format.

        Integer-only: a rounding shift by ``from_frac - frac`` and saturation. Equals
        ``quantize_code(codes * 2**-from_frac)`` exactly (a property test checks it).
        """
        codes = np.asarray(codes, dtype=CODE_DTYPE)
        _check_magnitude(codes, f"{self.name or 'format'}.requantize")
        shift = from_frac - self.frac
        if shift < 0:
            # An exact left shift; first clamp what would saturate anyway, so nothing overflows.
            bound = (abs(self.qmin) + self.qmax) >> min(-shift, 62)
            codes = np.clip(codes, -bound - 1, bound + 1)
        if self.midrise:
            # Nearest mid-rise level: floor(v * 2**-shift), an arithmetic shift.
            shifted = codes >> min(shift, 63) if shift > 0 else codes << -shift
        else:
            shifted = shift_round(codes, shift)
        return self.saturate(shifted)

    # -- the float view ---------------------------------------------------------------------------
    def to_float(self, codes):
        """Codes -> real values (exact in float64 for any format up to 52 bits)."""
        codes = np.asarray(codes, dtype=np.float64)
        if self.midrise:
            codes = codes + 0.5
        return np.ldexp(codes, -self.frac)

    def quantize(self, x):
        """Real values -> nearest representable real values (the 'fake quantization' view)."""
        return self.to_float(self.quantize_code(x))

    def describe(self) -> dict:
        """A JSON-friendly description (for reports, register maps, test vectors)."""
        return {
            "name": self.name,
            "bits": self.bits,
            "frac": self.frac,
            "signed": self.signed,
            "midrise": self.midrise,
            "lsb": self.lsb,
            "min": self.min_value,
            "max": self.max_value,
        }

    def __str__(self) -> str:
        kind = ("s" if self.signed else "u") + ("m" if self.midrise else "")
        return f"{self.name or 'fixed'}<{kind}{self.bits}, 2^-{self.frac}>"


def max_abs_format(x, bits: int = 16, name: str = "max-abs") -> FixedPoint:
    """Dynamic max-abs format: the finest power-of-2 scale at which no element saturates.

    ``frac`` is the largest with ``round_half_up(max|x| * 2**frac) <= 2**(bits-1) - 1``, that is
    ``max|x| < (2**(bits-1) - 1/2) * 2**-frac``: every element rounds to its nearest code (at most
    half an LSB off) and none is clipped by ``quantize_code``'s saturation. One step finer, max |x|
    would round past the largest code. That includes the tie, max |x| exactly half an LSB above the
    largest code: 7.5 in 4 bits rounds (half up) to 8 at frac 0, so it gets frac -1, although 7,
    the clipped code at frac 0, is also half an LSB off. The rule reads max |x| only, so the range
    is the same for x and -x. An all-zero tensor gets ``frac = bits - 1`` (range [-1, 1)).
    """
    x = np.asarray(x, dtype=np.float64)
    if x.size and not np.isfinite(x).all():
        raise ValueError(f"{name}: cannot choose a scale for non-finite values")
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    if peak == 0.0:
        return FixedPoint(bits, bits - 1, name=name)
    # floor(log2(peak)) + 1 is the smallest e with peak < 2**e; then frac = bits - 1 - e.
    exponent = math.frexp(peak)[1]
    frac = bits - 1 - exponent
    # A peak at or above the largest code + 1/2 LSB (2**e - tiny, or exactly that tie) rounds up to
    # code 2**(bits-1) and would saturate by one code: widen once (then it is below half the range).
    if round_half_up(math.ldexp(peak, frac)) > (1 << (bits - 1)) - 1:
        frac -= 1
    return FixedPoint(bits, frac, name=name)


@dataclass
class AutoScale:
    """On-the-fly power-of-2 scale selection of the TT paper (section 3.3).

    The tensor is stored as ``bits``-wide codes of scale ``2**-frac``. Its *unit* is the word read
    as a signed fixed-point number with ``headroom`` integer bits (``Q<headroom>.<bits-1-headroom>``):
    ``unit = 2**(bits - 1 - headroom - frac)``, so full scale is ``2**headroom`` units. In units the
    mean |x| must stay in ``target`` = [0.1, 0.3]. After each observation the exponent moves by
    single power-of-2 steps until the mean is back in the band, so the scale follows the data with
    a margin of ``2**headroom / target`` against overflow. Shared across the samples and neurons
    of one tensor.
    """

    bits: int = 16
    frac: int = 15
    target: tuple[float, float] = (0.1, 0.3)
    name: str = ""
    headroom: int = 0

    def __post_init__(self):
        lo, hi = self.target
        if not (0 < lo < hi <= 1) or hi < 2 * lo:
            # hi >= 2*lo guarantees that a one-step move can land inside the band.
            raise ValueError(f"AutoScale {self.name}: target band {self.target} must satisfy "
                             "0 < lo, 2*lo <= hi <= 1")
        if not 0 <= self.headroom < self.bits:
            raise ValueError(f"AutoScale {self.name}: headroom {self.headroom} must be in [0, {self.bits})")

    @property
    def format(self) -> FixedPoint:
        return FixedPoint(self.bits, self.frac, name=self.name)

    def normalized_mean_abs(self, x) -> float:
        """Mean |x| in units of ``2**(bits - 1 - headroom - frac)``."""
        unit = math.ldexp(1.0, self.bits - 1 - self.headroom - self.frac)
        return float(np.mean(np.abs(x))) / unit if np.size(x) else 0.0

    def observe(self, x) -> int:
        """Update the exponent from a tensor of real values; returns the new ``frac``.

        Moves as many single steps as needed to bring the mean into the band (a zero tensor leaves
        the scale alone).
        """
        x = np.asarray(x, dtype=np.float64)
        if not np.isfinite(x).all():
            raise ValueError(f"AutoScale {self.name}: non-finite values observed")
        lo, hi = self.target
        mean = self.normalized_mean_abs(x)
        if mean == 0.0:
            return self.frac
        while mean > hi:
            self.frac -= 1
            mean /= 2
        while mean < lo:
            self.frac += 1
            mean *= 2
        return self.frac


# --------------------------------------------------------------------------- int8 real quantized graphs

INT8 = FixedPoint(8, 0, name="int8")
INT32 = FixedPoint(32, 0, name="int32")

#: Width of the fixed-point requantization multiplier: it fits a signed 16-bit register. (On a
#: 32-bit MicroPython port ``acc * multiplier`` beyond 2**30 becomes a big int: exact, but slower.)
REQUANT_MULTIPLIER_BITS = 15


@dataclass(frozen=True)
class RequantScale:
    """A positive requantization scale ``s = multiplier * 2**-shift`` (tiny-training eq. 1).

    ``multiplier`` is normalized into ``[2**(bits-1), 2**bits)`` so it keeps ``bits`` significant
    bits. :meth:`from_float` picks the nearest such scale to a float.
    """

    multiplier: int
    shift: int
    bits: int = REQUANT_MULTIPLIER_BITS

    def __post_init__(self):
        if not 2 <= self.bits <= 31:
            raise ValueError(f"RequantScale: bits must be in [2, 31], got {self.bits}")
        if not (1 << (self.bits - 1)) <= self.multiplier < (1 << self.bits):
            raise ValueError(f"RequantScale: multiplier {self.multiplier} is not normalized to "
                             f"[2^{self.bits - 1}, 2^{self.bits})")
        if not 1 <= self.shift <= 62:
            raise ValueError(f"RequantScale: shift must be in [1, 62], got {self.shift} "
                             "(scale out of the range eq. 1 uses)")

    @classmethod
    def from_float(cls, scale: float, bits: int = REQUANT_MULTIPLIER_BITS) -> "RequantScale":
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"RequantScale: scale must be a positive finite number, got {scale}")
        mantissa, exponent = math.frexp(scale)          # scale = mantissa * 2**exponent, m in [0.5, 1)
        multiplier = int(round_half_up(math.ldexp(mantissa, bits)))
        shift = bits - exponent
        if multiplier == 1 << bits:                     # mantissa rounded up to 1.0
            multiplier >>= 1
            shift -= 1
        return cls(multiplier, shift, bits)

    def __float__(self) -> float:
        return math.ldexp(float(self.multiplier), -self.shift)


def requantize_fixed(acc, scale, out: FixedPoint = INT8):
    """Eq. 1 in integers: ``sat(round(acc * multiplier * 2**-shift))``, ties toward +inf.

    ``scale`` is one :class:`RequantScale` (per tensor) or a sequence of them, one per output
    channel along the last axis of ``acc`` (per channel).
    """
    scales = [scale] if isinstance(scale, RequantScale) else list(scale)
    multiplier = np.array([s.multiplier for s in scales], dtype=CODE_DTYPE)
    shift = np.array([s.shift for s in scales], dtype=CODE_DTYPE)
    if isinstance(scale, RequantScale):
        multiplier, shift = multiplier[0], shift[0]
    acc = np.asarray(acc, dtype=CODE_DTYPE)
    limit = _INT_LIMIT >> max(s.bits for s in scales)
    if acc.size and int(np.max(np.abs(acc))) >= limit:
        raise ValueError(f"requantize_fixed: accumulators reach 2**{limit.bit_length() - 1}; "
                         "acc * multiplier would overflow int64")
    return out.saturate(shift_round(acc * multiplier, shift))


def requantize_float(acc, scale, out: FixedPoint = INT8):
    """Eq. 1 with a float scale: ``sat(floor(acc * s + 1/2))`` in float64.

    ``scale`` is a float or an array of per-channel floats (last axis). With
    ``s = float(RequantScale)`` this equals :func:`requantize_fixed` exactly.
    """
    return out.saturate(round_half_up(np.asarray(acc, dtype=np.float64) * np.asarray(scale, dtype=np.float64)))


# --------------------------------------------------------------------------- most significant bits

def msb_code(codes, bits: int, keep: int):
    """The top ``keep`` bits of ``bits``-wide signed codes, rounded: ``saturate(round(c / 2**s))``
    with ``s = bits - keep``, i.e. the add-half-then-shift of :func:`shift_round`, saturated to
    ``keep`` bits (the largest codes would round up out of range).

    The E2-Train PSG predictor multiplies these codes; their scale is ``2**s`` times the full
    code's LSB. Rounded, not truncated: a two's complement truncation (floor) turns every small
    negative value into -1 LSB, and summed over a batch that bias outweighs the predictor's signal
    (a 5-conv net on FashionMNIST: 73.6 % test accuracy with floor, 86.9 % rounded, 86.7 % SGD).
    The paper's error bound (appendix A) also assumes zero-mean quantization noise.
    """
    if not 1 <= keep <= bits:
        raise ValueError(f"msb_code: keep must be in [1, {bits}], got {keep}")
    return saturate(shift_round(np.asarray(codes, dtype=CODE_DTYPE), bits - keep), keep)


# --------------------------------------------------------------------------- the named formats

# LRT hardware quantization model (LRT paper, appendix D).
LRT_WEIGHT = FixedPoint.from_range(8, -1, 1, name="lrt.weight")
LRT_BIAS = FixedPoint.from_range(16, -8, 8, name="lrt.bias")
LRT_ACCUMULATOR = FixedPoint.from_range(16, -8, 8, name="lrt.accumulator")
LRT_ACTIVATION = FixedPoint.from_range(8, 0, 2, name="lrt.activation")
LRT_GRADIENT = FixedPoint.from_range(8, -1, 1, name="lrt.gradient")
#: L and R are 16-bit with a per-matrix power-of-2 range from :func:`max_abs_format`.
LRT_FACTOR_BITS = 16


def lrt_weight_format(bits: int) -> FixedPoint:
    """Weights of ``bits`` bits in [-1, 1] (mid-rise at 1 and 2 bits), for bit-width studies."""
    return FixedPoint.from_range(bits, -1, 1, name=f"lrt.weight{bits}")


# ---- LRT PE (rtl/pe_lrt.py; golden model insitu.lrt.pe_ops): the per-sample vector work of SKS
# (MGS projections, new basis vector, rotation) and the rank-r weight update, in integers.
#: Basis entries of Q_L, Q_R and entries of the q x r rotations M: Q1.14, range [-2, 2). Orthonormal
#: columns and columns of orthogonal matrices have |entries| <= 1, so one integer bit is headroom.
LRT_BASIS = FixedPoint(16, 14, name="lrt.basis")
#: Vector words of the PE: the streamed sample x, the residual held on chip, the projections
#: c = round(Q^T x) (in x's own scale, since Q is Q1.14) and the update's s codes.
LRT_PE_WORD_BITS = 16
#: LRT_RECIP: the unsigned reciprocal code of the residual norm that LRT_APPEND multiplies by
#: (new column = round(residual * recip * 2**-SHIFT), saturated to LRT_BASIS).
LRT_RECIP_BITS = 16
#: Per-cell write counters (saturating) and the LRT_WRITES_TOTAL register (saturating).
LRT_WRITE_COUNT_BITS = 16
LRT_WRITES_TOTAL_BITS = 32
#: LRT_NORM2 (LO/HI): the exact squared residual norm.
LRT_NORM2_BITS = 64
#: LRT_UPDATE's weight step ``round(sum, SHIFT)`` may be held saturated to one bit more than a
#: weight: with |W| <= 2**(b-1), saturate(W - d, b) is the same for every d beyond that range.
LRT_PE_DELTA_BITS = LRT_WEIGHT.bits + 1


# TT training on FPGA (TT paper, sections 3.2-3.3 and 4).
TT_FACTOR_BITS = 4
TT_ACTIVATION_BITS = 8
TT_BIAS_BITS = 8
#: The PEs carry 16-bit activations-or-gradients (forward uses the 8 LSBs).
TT_PE_DATA_BITS = 16
TT_MEAN_ABS_TARGET = (0.1, 0.3)
#: Integer bits of the unit in which AutoScale keeps mean |x| in the target band: a 16-bit PE word
#: is read as Q4.11 and an 8-bit activation as Q1.6. Intermediate TT contractions and gradients are
#: heavy-tailed (the loss gradient of a batch is a few large entries among many small ones); with
#: full scale as the unit (headroom 0), 0.3-1.5 % of them saturate and training diverges (measured,
#: docs/tt.md). Headroom 4 leaves 53-160x over the mean and still 205-614 LSBs at the mean.
TT_PE_HEADROOM_BITS = 4
TT_ACTIVATION_HEADROOM_BITS = 1


def tt_factor_format(frac: int) -> FixedPoint:
    """A 4-bit TT factor at its fixed power-of-2 scale ``2**-frac``."""
    return FixedPoint(TT_FACTOR_BITS, frac, name="tt.factor")


#: Where the 4-bit factor grid's rounding edge ``(qmax + 1/2) * LSB`` sits, in standard deviations
#: of the initial cores (near the MSE-optimal clipping of a 4-bit uniform quantizer for a Gaussian).
TT_FACTOR_CLIP_STDS = 2.5


def tt_factor_frac(std: float) -> int:
    """The fixed scale of 4-bit factors drawn with standard deviation ``std``: the finest power of
    2 whose rounding edge reaches :data:`TT_FACTOR_CLIP_STDS` standard deviations."""
    qmax = code_range(TT_FACTOR_BITS)[1]
    return int(math.floor(math.log2((qmax + 0.5) / (TT_FACTOR_CLIP_STDS * std))))


def tt_autoscale(kind: str, name: str = "", frac: int | None = None) -> "AutoScale":
    """The scale of a TT tensor: ``kind`` "pe" (a 16-bit PE word, Q4.11 unit: intermediates and
    gradients) or "activation" (an 8-bit layer input, Q1.6 unit). Starts at the finest scale
    (``frac = bits - 1``) unless ``frac`` is given; :meth:`AutoScale.observe` then fits it."""
    try:
        bits, headroom = {"pe": (TT_PE_DATA_BITS, TT_PE_HEADROOM_BITS),
                          "activation": (TT_ACTIVATION_BITS, TT_ACTIVATION_HEADROOM_BITS)}[kind]
    except KeyError:
        raise ValueError(f"tt_autoscale: kind must be 'pe' or 'activation', got {kind!r}") from None
    return AutoScale(bits, bits - 1 if frac is None else frac, TT_MEAN_ABS_TARGET, name, headroom)


#: TT biases are parameters with a fixed scale: 8 bits, Q1.6 (range [-2, 2), step 1/64).
TT_BIAS = FixedPoint(TT_BIAS_BITS, TT_BIAS_BITS - 2, name="tt.bias")


def tt_pe_format(frac: int) -> FixedPoint:
    """A 16-bit PE operand (activation or gradient) at scale ``2**-frac`` (from :class:`AutoScale`)."""
    return FixedPoint(TT_PE_DATA_BITS, frac, name="tt.pe-data")


# E2-Train predictive sign gradient (PSG, section 3.3 and 4.4): 8-bit activations and weights,
# 16-bit gradients, and a predictor on their most significant bits (4 of x, 10 of g_y).
PSG_ACTIVATION_BITS = 8
PSG_WEIGHT_BITS = 8
PSG_GRADIENT_BITS = 16
#: A PSG layer's output (BatchNorm's input, kept for its backward): the PE's 16-bit word.
PSG_OUTPUT_BITS = 16
PSG_ACTIVATION_MSB_BITS = 4
PSG_GRADIENT_MSB_BITS = 10


def psg_weight_gradient(dy_codes, x_codes):
    """The weight gradient of one layer in integers, full and predicted (eq. 4 of the appendix).

    ``dy_codes`` ``(K, n_out)``: 16-bit output-gradient codes; ``x_codes`` ``(K, n_in)``: 8-bit
    input codes, with K running over the batch (and output pixels). Returns ``(g_full, g_msb)``,
    both int64 ``(n_out, n_in)``: ``g_full = dy^T x`` and ``g_msb = msb10(dy)^T msb4(x)``
    (:func:`msb_code`: rounded, saturated), the predictor; its LSB is ``2**(6 + 4)`` times g_full's. Computed in float64, exact while every
    sum stays below 2**53 (checked).
    """
    dy = np.asarray(dy_codes, dtype=CODE_DTYPE)
    x = np.asarray(x_codes, dtype=CODE_DTYPE)
    if dy.ndim != 2 or x.ndim != 2 or dy.shape[0] != x.shape[0]:
        raise ValueError(f"psg_weight_gradient: need dy (K, n_out) and x (K, n_in), got "
                         f"{dy.shape} and {x.shape}")
    _check_codes(dy, PSG_GRADIENT_BITS, "dy")
    _check_codes(x, PSG_ACTIVATION_BITS, "x")
    # |product| <= 2**15 * 2**7 = 2**22, so K < 2**30 keeps float64 sums exact.
    if dy.shape[0] >= 1 << 30:
        raise ValueError("psg_weight_gradient: K >= 2**30 terms could leave float64's exact range")
    dy_msb = msb_code(dy, PSG_GRADIENT_BITS, PSG_GRADIENT_MSB_BITS)
    x_msb = msb_code(x, PSG_ACTIVATION_BITS, PSG_ACTIVATION_MSB_BITS)
    g_full = (dy.T.astype(np.float64) @ x.astype(np.float64)).astype(CODE_DTYPE)
    g_msb = (dy_msb.T.astype(np.float64) @ x_msb.astype(np.float64)).astype(CODE_DTYPE)
    return g_full, g_msb


def psg_threshold(g_msb, beta: float) -> int:
    """The adaptive threshold of one layer as a predictor code: ``max(1, ceil(beta * max|g_msb|))``.

    At least 1, so a zero predictor never decides a sign (an all-zero layer falls back to the full
    gradient everywhere). ``beta`` must lie in (0, 1).
    """
    if not 0.0 < beta < 1.0:
        raise ValueError(f"PSG beta must be in (0, 1), got {beta!r}")
    g = np.asarray(g_msb, dtype=CODE_DTYPE)
    peak = int(np.max(np.abs(g))) if g.size else 0
    return max(1, math.ceil(beta * peak))


def psg_sign(g_full, g_msb, tau: int):
    """Eq. 2: ``sgn(g_msb)`` where ``|g_msb| >= tau``, else ``sgn(g_full)``.

    Returns ``(sign, predicted)``: int8 signs in {-1, 0, +1} and the boolean mask of entries the
    predictor decided. This is the rule the PE3 sign path (rtl/pe3.py) computes too.
    """
    if int(tau) < 1:
        raise ValueError(f"psg_sign: tau must be >= 1 (see psg_threshold), got {tau}")
    g_full = np.asarray(g_full, dtype=CODE_DTYPE)
    g_msb = np.asarray(g_msb, dtype=CODE_DTYPE)
    predicted = np.abs(g_msb) >= int(tau)
    sign = np.where(predicted, np.sign(g_msb), np.sign(g_full)).astype(np.int8)
    return sign, predicted


def _check_codes(codes, bits: int, name: str) -> None:
    lo, hi = code_range(bits)
    if codes.size and (codes.min() < lo or codes.max() > hi):
        raise ValueError(f"{name} codes must be {bits}-bit signed, in [{lo}, {hi}]; got "
                         f"[{codes.min()}, {codes.max()}]")

#: The fixed formats by name, for reports and `insitu` introspection.
FORMATS = {f.name: f for f in (LRT_WEIGHT, LRT_BIAS, LRT_ACCUMULATOR, LRT_ACTIVATION, LRT_GRADIENT, LRT_BASIS,
                               TT_BIAS, INT8, INT32)}
