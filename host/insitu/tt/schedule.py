"""The primitive-op schedule of TT-matrix training: every contraction as a PE1, PE2 or PE3 op.

This list is the contract between the algorithm, the processing elements (RTL) and the board
driver: the executors here run training through it op by op, the RTL implements the three kinds,
and the driver streams the same list to the accelerator. Sizes follow the paper's Table 3.

Tensor layouts (all row-major, the way buffers sit in DRAM; no op permutes a big operand):

* a TT core ``G_n`` is ``(R_{n-1}, J_n, I_n, R_n)``; the small factor operand of an op is the
  core with its axes reordered (``Op.factor_axes``), which the processor does once per step;
* forward intermediates are ``(B, i_1..i_n, r_n, j_{n+1}..j_d)``;
* input-gradient intermediates are ``(B, i_1..i_n, r_n, j_{n+1}..j_d)`` as well;
* the full-weight gradient is interleaved, ``(j_1, i_1, ..., j_d, i_d)``, so that the factor
  gradients (eq. 14-19) contract trailing axes (PE1) or a leading axis (PE2) without permutation.

The three kinds (Z: the streamed operand, G: the cached factor operand):

* ``PE1``: ``Z'(a, d) = sum_{b,c} Z(a, b, c) * G(b, d, c)``;
* ``PE2``: ``Z'(a, d, c) = sum_b Z(a, b, c) * G(b, d)``;
* ``PE3``: the full-weight gradient, an outer product accumulated over the ``b`` samples of a
  batch: ``W'(j_1, i_1, .., j_d, i_d) = sum_s dY(s, j) * X(s, i)``; ``a`` counts output rows of
  ``c = I_d`` elements (the 16 multipliers run along ``i_d``).

PE1 and PE2 take 16 lanes along ``c``: a ``c`` that is not a multiple of 16 is zero-padded to
``c_padded`` (as the paper pads the input image to 28 x 32), which changes no result.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass

import numpy as np

from insitu.accel.params import C_LANES, PELimits

PE_KINDS = ("PE1", "PE2", "PE3")
DEFAULT_LIMITS = PELimits()


@dataclass(frozen=True)
class Op:
    """One primitive op. ``src``/``dst`` name buffers; ``core`` (0-based) names the factor operand.

    ``factor_axes`` reorders the core's axes ``(0: r_prev, 1: j, 2: i, 3: r_next)`` into operand
    order; the first ``len_b`` of them form ``b``, the next ``len_d`` form ``d`` and the rest ``c``
    (PE1 only). PE3 has a second buffer operand ``src2`` (the layer input X) instead of a core.
    """

    kind: str
    phase: str
    eq: int | None               # the paper's equation this op instantiates (PE3's is unnumbered)
    src: str
    dst: str
    a: int
    b: int
    c: int
    d: int
    core: int | None = None
    factor_axes: tuple[int, ...] = ()
    len_b: int = 0
    len_d: int = 0
    src2: str | None = None

    @property
    def c_padded(self) -> int:
        if self.kind == "PE3":
            return self.c
        return -(-self.c // C_LANES) * C_LANES

    @property
    def macs(self) -> int:
        """Multiply-accumulates the PE performs, padding included."""
        if self.kind == "PE3":
            return self.a * self.b * self.c
        return self.a * self.b * self.c_padded * self.d

    @property
    def useful_macs(self) -> int:
        """Multiply-accumulates without the zero padding."""
        return self.a * self.b * self.c * (1 if self.kind == "PE3" else self.d)

    @property
    def terms(self) -> int:
        """Products summed into one output element (sets the accumulator width)."""
        return {"PE1": self.b * self.c, "PE2": self.b, "PE3": self.b}[self.kind]

    @property
    def factor_words(self) -> int:
        if self.kind == "PE1":
            return self.b * self.d * self.c_padded
        if self.kind == "PE2":
            return self.b * self.d
        return self.c

    def describe(self) -> dict:
        out = asdict(self)
        out.update(c_padded=self.c_padded, macs=self.macs, factor_words=self.factor_words)
        return out

    def __str__(self) -> str:
        operand = f"G{self.core + 1}" if self.core is not None else self.src2
        eq = "-" if self.eq is None else self.eq
        return (f"{self.kind} eq.{eq:<2} {self.phase:<11} {self.src}*{operand} -> {self.dst} "
                f"a={self.a} b={self.b} c={self.c}{'' if self.c == self.c_padded else f'(+{self.c_padded - self.c})'}"
                f" d={self.d} macs={self.macs}")


def check_op(op: Op, limits: PELimits = DEFAULT_LIMITS) -> None:
    """Raise ValueError naming the op and the size the PEs cannot take."""
    if op.kind not in PE_KINDS:
        raise ValueError(f"op {op.dst!r}: unknown PE kind {op.kind!r}; expected one of {PE_KINDS}")
    for name in ("a", "b", "c", "d"):
        size = getattr(op, name)
        if not is_count(size):
            raise ValueError(f"{op.kind} op {op.dst!r}: size {name}={size!r} must be an integer >= 1")
        if size > limits.size_max:
            raise ValueError(f"{op.kind} op {op.dst!r}: size {name}={size} exceeds the PE's size "
                             f"register (max {limits.size_max})")
    if op.kind == "PE3":
        if op.d != 1:
            raise ValueError(f"PE3 op {op.dst!r}: d must be 1 (an outer product), got {op.d}")
        if op.c % C_LANES:
            raise ValueError(f"PE3 op {op.dst!r}: c = I_d = {op.c} must be a multiple of "
                             f"{C_LANES} (pad the last input mode)")
    if op.factor_words > limits.factor_words:
        raise ValueError(f"{op.kind} op {op.dst!r}: the factor operand needs {op.factor_words} "
                         f"words; the PE buffer holds {limits.factor_words} (factor_words: lower the "
                         "TT ranks or split the mode)")


def _prod(values) -> int:
    return math.prod(values)


def is_count(value, least: int = 1) -> bool:
    """An integer (Python or NumPy, not bool) of at least ``least``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= least


def check_modes(in_modes, out_modes, ranks=None) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Validate TT-matrix modes and ranks; returns them as tuples with ``ranks = (1, R_1.., 1)``.

    ``ranks`` is an int (every internal rank), the ``d - 1`` internal ranks, or all ``d + 1``.
    """
    try:
        in_modes, out_modes = tuple(in_modes), tuple(out_modes)
    except TypeError:
        raise ValueError(f"in_modes and out_modes must be lists of integers, got {in_modes!r} and "
                         f"{out_modes!r}") from None
    if all(is_count(m) for m in in_modes + out_modes):
        in_modes, out_modes = tuple(int(m) for m in in_modes), tuple(int(m) for m in out_modes)
    for what, modes in (("in_modes", in_modes), ("out_modes", out_modes)):
        if not modes or not all(is_count(m) for m in modes):
            raise ValueError(f"{what} must be a non-empty list of integers >= 1, got {list(modes)}")
    if len(in_modes) != len(out_modes):
        raise ValueError(f"in_modes {list(in_modes)} and out_modes {list(out_modes)} must have the "
                         "same number of modes (use 1 for a mode that does not split)")
    d = len(in_modes)
    if ranks is None:
        return in_modes, out_modes, ()
    if np.ndim(ranks) == 0:
        ranks = ranks.item() if isinstance(ranks, np.ndarray) else ranks
        if not is_count(ranks):
            raise ValueError(f"TT ranks must be integers >= 1, got {ranks!r}")
        ranks = (1,) + (int(ranks),) * (d - 1) + (1,)
    ranks = tuple(ranks)
    if len(ranks) == d - 1:
        ranks = (1, *ranks, 1)
    if len(ranks) != d + 1:
        raise ValueError(f"ranks must be an int, {d - 1} internal ranks or {d + 1} ranks "
                         f"(1 at both ends) for {d} modes; got {list(ranks)}")
    if not all(is_count(r) for r in ranks):
        raise ValueError(f"TT ranks must be integers >= 1, got {list(ranks)}")
    ranks = tuple(int(r) for r in ranks)
    if ranks[0] != 1 or ranks[-1] != 1:
        raise ValueError(f"the boundary TT ranks R_0 and R_d must be 1, got {list(ranks)}")
    return in_modes, out_modes, ranks


def forward_ops(in_modes, out_modes, ranks, batch: int) -> list[Op]:
    """Eq. 8-10: ``Y = X W^T`` for a batch; cores are absorbed from the last to the first."""
    I, J, R = check_modes(in_modes, out_modes, ranks)
    d = len(I)
    ops = [Op("PE1", "forward", 8, "x", "fwd.1" if d > 1 else "y",
              a=batch * _prod(I[:-1]), b=R[d], c=I[-1], d=R[d - 1] * J[-1],
              core=d - 1, factor_axes=(3, 0, 1, 2), len_b=1, len_d=2)]
    for n in range(d - 2, -1, -1):            # core n (0-based) absorbs i_n and emits r_{n-1}, j_n
        step = d - 1 - n
        ops.append(Op("PE2", "forward", 9 if n > 0 else 10, f"fwd.{step}",
                      f"fwd.{step + 1}" if n > 0 else "y",
                      a=batch * _prod(I[:n]), b=I[n] * R[n + 1], c=_prod(J[n + 1:]), d=R[n] * J[n],
                      core=n, factor_axes=(2, 3, 0, 1), len_b=2, len_d=2))
    return ops


def input_grad_ops(in_modes, out_modes, ranks, batch: int) -> list[Op]:
    """Eq. 11-13: ``dX = dY W``; cores are absorbed from the first to the last."""
    I, J, R = check_modes(in_modes, out_modes, ranks)
    d = len(I)
    ops = []
    for n in range(d - 1):
        ops.append(Op("PE2", "input-grad", 11 if n == 0 else 12, "dy" if n == 0 else f"bwd.{n}",
                      f"bwd.{n + 1}", a=batch * _prod(I[:n]), b=R[n] * J[n], c=_prod(J[n + 1:]),
                      d=I[n] * R[n + 1], core=n, factor_axes=(0, 1, 2, 3), len_b=2, len_d=2))
    ops.append(Op("PE1", "input-grad", 13, "dy" if d == 1 else f"bwd.{d - 1}", "dx",
                  a=batch * _prod(I[:-1]), b=R[d - 1], c=J[-1], d=I[-1] * R[d],
                  core=d - 1, factor_axes=(0, 2, 3, 1), len_b=1, len_d=2))
    return ops


def weight_grad_op(in_modes, out_modes, batch: int) -> Op:
    """The full-weight gradient, interleaved ``(j_1, i_1, .., j_d, i_d)``, on PE3."""
    I, J, _ = check_modes(in_modes, out_modes)
    return Op("PE3", "weight-grad", None, "dy", "dw", a=_prod(J) * _prod(I[:-1]), b=batch, c=I[-1],
              d=1, src2="x")


def factor_grad_ops(in_modes, out_modes, ranks) -> list[Op]:
    """Eq. 14-19: the gradient of every core from the full-weight gradient ``dw``.

    A right sweep (PE1) contracts ``dw`` with ``G_d, .., G_2`` and keeps each partial ``P_n``
    ``(j_1 i_1 .. j_n i_n, r_n)``; the gradient of core n is ``P_n`` swept from the left (PE2) by
    ``G_1, .., G_{n-1}``. ``P_1`` is already the gradient of ``G_1``. Partials are shared as in the paper.
    """
    I, J, R = check_modes(in_modes, out_modes, ranks)
    d = len(I)
    JI = [J[n] * I[n] for n in range(d)]
    partial = {d - 1: "dw"}                   # P_n for 0-based core n
    ops = []
    for n in range(d - 1, 0, -1):             # contract core n, produce P_{n-1}
        dst = "dg.1" if n == 1 else f"p.{n}"
        ops.append(Op("PE1", "factor-grad", 14 if n == d - 1 else (16 if n == 1 else 15), partial[n],
                      dst, a=_prod(JI[:n]), b=1, c=JI[n] * R[n + 1], d=R[n],
                      core=n, factor_axes=(0, 1, 2, 3), len_b=0, len_d=1))
        partial[n - 1] = dst
    for n in range(1, d):                     # gradient of core n from P_n, swept by cores 0..n-1
        src = partial[n]
        for k in range(n):
            dst = f"dg.{n + 1}" if k == n - 1 else f"l.{n + 1}.{k + 1}"
            eq = 17 if n == 1 else (18 if k == 0 else 19)     # 18: by G_1; 19: by a later core
            ops.append(Op("PE2", "factor-grad", eq, src, dst, a=1, b=R[k] * JI[k],
                          c=_prod(JI[k + 1:n + 1]) * R[n + 1], d=R[k + 1],
                          core=k, factor_axes=(0, 1, 2, 3), len_b=3, len_d=1))
            src = dst
    return ops


def grad_buffer(n: int, d: int) -> str:
    """The buffer that holds the gradient of core ``n`` (0-based) after :func:`factor_grad_ops`."""
    return "dw" if d == 1 else f"dg.{n + 1}"


def check_batch(batch) -> int:
    if not is_count(batch):
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    return int(batch)


def layer_schedule(in_modes, out_modes, ranks, batch: int, *, input_grad: bool = True,
                   limits: PELimits = DEFAULT_LIMITS) -> list[Op]:
    """Every op of one training step of a TT layer on a batch, in execution order.

    Forward, then (when ``input_grad``: the layer is not the first) the input gradient, then the
    full-weight gradient on PE3 and the factor gradients. Each op is checked against ``limits``.
    """
    batch = check_batch(batch)
    ops = forward_ops(in_modes, out_modes, ranks, batch)
    if input_grad:
        ops += input_grad_ops(in_modes, out_modes, ranks, batch)
    ops.append(weight_grad_op(in_modes, out_modes, batch))
    ops += factor_grad_ops(in_modes, out_modes, ranks)
    for op in ops:
        check_op(op, limits)
    return ops


def macs_by_kind(ops) -> dict[str, int]:
    """MACs per PE kind (padding included), e.g. for the benchmark's per-sample table."""
    totals = {kind: 0 for kind in PE_KINDS}
    for op in ops:
        totals[op.kind] += op.macs
    return totals
