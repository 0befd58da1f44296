"""Generate-time parameters of the accelerator, its limits, the stream word format, its MAC units.

Part of the accelerator contract (:mod:`insitu.accel`): the RTL, the golden models, the driver and
the twins import it; it imports none of them.

Run-time sizes live in registers; these bounds fix memory depths and accumulator widths at
generate time. A configuration beyond them is refused by the hardware with an error code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from insitu.numerics import TT_PE_DATA_BITS

#: Lanes along ``c`` of PE1/PE2 (and along ``i_d`` of PE3): the TT paper's 16-way parallelism.
C_LANES = 16


@dataclass(frozen=True)
class PELimits:
    """What the TT PEs accept: generate-time bounds of the RTL (run-time sizes live in registers).

    ``size_max`` bounds each of a, b, c, d (16-bit size registers); ``factor_words`` is the depth of
    the on-chip factor buffer that holds G (b*d*c words for PE1, b*d for PE2, the cached X row
    block for PE3). The lane count along ``c`` is fixed by the design (:data:`C_LANES`).
    """

    size_max: int = (1 << 16) - 1
    factor_words: int = 4096

#: Bits of one word on the AXI streams: a 16-bit PE operand (activation or gradient), a 4-bit TT
#: factor code sign-extended, or an LRT code.
WORD_BITS = TT_PE_DATA_BITS
#: Words per AXI-Stream beat: 128-bit streams, the width of Ultra96-V2's HP ports.
STREAM_WORDS = 8
STREAM_BITS = WORD_BITS * STREAM_WORDS
#: Bytes of one stream beat: what the DMA moves per transfer unit, and the DRAM per beat.
BEAT_BYTES = STREAM_BITS // 8
#: Bits of the size registers (SIZE_A..SIZE_D): the TT schedule's ``PELimits.size_max``.
SIZE_BITS = 16


@dataclass(frozen=True)
class AcceleratorParams:
    """Bounds the RTL is generated for (defaults: the FashionMNIST TT network of the TT paper).

    * ``factor_words``: depth in words of the PE1/PE2 factor buffer (4-bit codes);
    * ``pe1_row_entries``: PE1 tile depth: ``b * c / 16`` entries of 16 words per row (8 rows).
      The network needs 16; PE1 reads 8 rows x 256 bits per cycle, so a shallow tile maps to
      LUT RAM, while 64 took 33 RAMB36 for their width alone (Yosys, xczu3eg);
    * ``pe2_b_max``: PE2's largest ``b`` (its tile is ``b`` entries of 16 words; the network's
      second layer needs 512);
    * ``pe3_b_max``: PE3's largest batch ``b`` (its X block is ``b`` entries of 16 words);
    * ``pe3_batch_lanes``: batch entries PE3 multiplies per cycle (1 or 2): 2 doubles its
      multipliers (16 lanes x 2 entries) and halves its MAC cycles, for the parts with the DSPs;
    * ``shift_min``/``shift_max``: the output rescaling shifts the PEs accept (negative: left);
    * ``lrt_rows_max``, ``lrt_cols_max``: LRT basis memories (rows x q columns, both sides);
    * ``lrt_cells_max``: LRT weight memory cells (m * n).
    """

    factor_words: int = 4096
    pe1_row_entries: int = 16
    pe2_b_max: int = 512
    pe3_b_max: int = 256
    pe3_batch_lanes: int = 1
    shift_min: int = -16
    shift_max: int = 63
    lrt_rows_max: int = 256
    lrt_cols_max: int = 8
    lrt_cells_max: int = 16384

    #: PE1 rows computed at once (8-way on a) and PE2 outputs (8-way on d).
    pe_rows: int = 8
    #: Lanes along c of PE1/PE2 and along i_d of PE3.
    c_lanes: int = C_LANES

    def __post_init__(self):
        for name, value in asdict(self).items():
            if name in ("shift_min", "shift_max"):
                continue
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"AcceleratorParams.{name} must be an integer >= 1, got {value!r}")
        if self.factor_words % (self.c_lanes * self.pe_rows):
            raise ValueError(f"AcceleratorParams.factor_words ({self.factor_words}) must be a multiple "
                             f"of {self.c_lanes * self.pe_rows}")
        if self.pe3_batch_lanes not in (1, 2):
            raise ValueError(f"AcceleratorParams.pe3_batch_lanes must be 1 or 2, got {self.pe3_batch_lanes!r}")
        if not self.shift_min <= 0 <= self.shift_max:
            raise ValueError("AcceleratorParams: need shift_min <= 0 <= shift_max")

    @property
    def limits(self) -> PELimits:
        """The TT schedule's view of these bounds."""
        return PELimits(size_max=(1 << SIZE_BITS) - 1, factor_words=self.factor_words)


DEFAULT_PARAMS = AcceleratorParams()

#: The accelerator as a Vivado IP: its top-level Verilog module and VLNV (the PYNQ driver binds
#: its DefaultIP subclass to this VLNV).
TOP_MODULE = "insitu_accel"
IP_VENDOR, IP_LIBRARY, IP_VERSION = "insitu.dev", "insitu", "1.0"
IP_VLNV = f"{IP_VENDOR}:{IP_LIBRARY}:{TOP_MODULE}:{IP_VERSION}"
#: A board-independent 100 MHz reference, kept only for the timing estimate's count of endpoints
#: over 10 ns (``insitu.rtl.timing``: ``clock_ns``, ``over_clock_endpoints``). No figure, block
#: design, constraint or twin uses it: each board's design runs at its ``[fpga] pl_clock_hz``
#: (:func:`insitu.boards.pl_clock_hz`).
CLOCK_HZ = 100_000_000


def mac_units(kind: str, params: AcceleratorParams = DEFAULT_PARAMS) -> int:
    """Multipliers of a TT PE kind in the design generated with ``params``: 8 rows x 16 lanes
    (PE1, PE2); 16 lanes x ``pe3_batch_lanes`` batch entries (PE3 and its PSG mode, whose
    predictor's narrow multipliers are not counted)."""
    if kind in ("PE1", "PE2"):
        return params.pe_rows * params.c_lanes
    if kind in ("PE3", "PE3_PSG"):
        return params.c_lanes * params.pe3_batch_lanes
    raise KeyError(kind)


#: :func:`mac_units` of each TT PE kind in the default design (:data:`DEFAULT_PARAMS`): 8 rows x
#: 16 lanes (PE1, PE2), 16 lanes (PE3 and its PSG mode).
MAC_UNITS = {kind: mac_units(kind) for kind in ("PE1", "PE2", "PE3", "PE3_PSG")}
