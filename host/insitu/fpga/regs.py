"""Named access to the accelerator's registers, generated from the register-map spec.

Every name, offset, width and signedness comes from :data:`insitu.accel.regmap.REGISTERS`; nothing
here restates an address. ``mmio`` is anything with ``read(offset) -> int`` and
``write(offset, value)``: a ``pynq.MMIO`` on a board or a twin, a ``DefaultIP`` too.
"""

from __future__ import annotations

from dataclasses import replace

from insitu.accel.params import DEFAULT_PARAMS, AcceleratorParams
from insitu.accel.regmap import REGISTERS, ErrorCode, Register, register

_BY_NAME = {r.name: r for r in REGISTERS}


def encode(reg: Register, value: int) -> int:
    """A register value -> the 32-bit word written on the bus (two's complement when signed)."""
    value = int(value)
    lo = -(1 << (reg.width - 1)) if reg.signed else 0
    hi = (1 << (reg.width - 1)) - 1 if reg.signed else (1 << reg.width) - 1
    if not lo <= value <= hi:
        raise ValueError(f"register {reg.name}: {value} does not fit its {reg.width} "
                         f"{'signed ' if reg.signed else ''}bits [{lo}, {hi}]")
    return value & ((1 << reg.width) - 1)


def decode(reg: Register, word: int) -> int:
    """The 32-bit word read from the bus -> the register's value (sign-extended when signed)."""
    value = int(word) & ((1 << reg.width) - 1)
    if reg.signed and value >> (reg.width - 1):
        value -= 1 << reg.width
    return value


def field_mask(register_name: str, field: str) -> int:
    """The bits of one field of a register (e.g. ``field_mask("CTRL", "START")``)."""
    for f in _BY_NAME[register_name].fields:
        if f.name == field:
            return ((1 << f.width) - 1) << f.lsb
    raise KeyError(f"register {register_name} has no field {field!r}")


#: Bits of the control plane the driver and the twins' models use.
START, ABORT = field_mask("CTRL", "START"), field_mask("CTRL", "ABORT")
BUSY, DONE, ERROR = (field_mask("STATUS", f) for f in ("BUSY", "DONE", "ERROR"))


class Registers:
    """``regs.read("CYCLES")``, ``regs.write("SIZE_A", 64)``, ``regs.dump()``."""

    def __init__(self, mmio):
        self.mmio = mmio

    def read(self, name: str) -> int:
        reg = register(name)
        if reg.access == "wo":
            raise ValueError(f"register {name} is write-only (it reads as 0)")
        return decode(reg, self.mmio.read(reg.offset))

    def write(self, name: str, value: int) -> None:
        reg = register(name)
        if reg.access == "ro":
            raise ValueError(f"register {name} is read-only")
        self.mmio.write(reg.offset, encode(reg, value))

    def configure(self, **values) -> None:
        """Write several configuration registers by name."""
        for name, value in values.items():
            self.write(name, value)

    def field(self, name: str, field: str) -> int:
        mask = field_mask(name, field)
        return (self.read(name) & mask) >> (mask & -mask).bit_length() - 1

    def command(self, field: str) -> None:
        """Pulse one CTRL bit (START, ABORT)."""
        self.mmio.write(_BY_NAME["CTRL"].offset, field_mask("CTRL", field))

    def dump(self) -> dict[str, int]:
        """Every readable register (for error messages)."""
        return {r.name: self.read(r.name) for r in REGISTERS if r.access != "wo"}


def bitstream_params(read, prefix: str = "CAP_") -> AcceleratorParams:
    """The generate-time bounds of the bitstream behind ``read(name)``: its registers named
    ``prefix``... (all CAP_* registers, or e.g. only the LRT PE's ``CAP_LRT_``); the rest (and
    what no register reports: the shift range, PE rows and lanes) is the design's default."""
    return replace(DEFAULT_PARAMS, **{r.param: int(read(r.name)) for r in REGISTERS
                                      if r.param and r.name.startswith(prefix)})


def format_dump(dump: dict[str, int]) -> str:
    """A register dump as one line a user can paste into a bug report."""
    parts = []
    for name, value in dump.items():
        if name == "ERROR_CODE" and value in ErrorCode._value2member_map_:
            parts.append(f"{name}={ErrorCode(value).name}")
        elif name == "STATUS":
            bits = [f.name for f in _BY_NAME[name].fields if value >> f.lsb & 1]
            parts.append(f"{name}={'|'.join(bits) or 'IDLE'}")
        else:
            parts.append(f"{name}={value:#x}" if value > 9 else f"{name}={value}")
    return " ".join(parts)
