"""The FPGA path: the PYNQ host driver of the accelerator and the simulated boards that run it.

The same driver code runs on an Ultra96-V2 or ZedBoard under a PYNQ image and here, against a
simulated twin (a ``pynq.Device`` whose registers and DMA buffers are served by the RTL in
simulation, or by the bit-exact functional model for long runs).
"""

import warnings

# pynq 4 imports pkg_resources (through pynqutils), which warns on every run of the CLI; the
# warning is about pynq's packaging, nothing a user of insitu can act on.
warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
