"""The accelerator contract: what the RTL, the golden models, the driver and the twins agree on.

Pure Python, importing nothing of insitu but :mod:`insitu.numerics` and :mod:`insitu.errors`:

* :mod:`~insitu.accel.params`: generate-time parameters and limits, the stream word format, the
  MAC units of each PE, the IP's name (VLNV) and clock;
* :mod:`~insitu.accel.regmap`: the AXI-Lite register map (ops, error codes, registers, VERSION)
  and which op runs on which PE;
* :mod:`~insitu.accel.stream`: words and 128-bit beats of the AXI streams;
* :mod:`~insitu.accel.ip`: bus interface, port and block-design cell names (what a PYNQ overlay
  exposes and the .hwh describes).
"""
