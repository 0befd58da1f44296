"""insitu: a hardware/software co-design flow for training neural networks on edge devices.

Subpackages: ``numerics`` (the one fixed-point spec), ``nn`` (NumPy training core), ``data``
(datasets), ``boards`` (board descriptions and twins), ``rtl`` (Amaranth processing elements),
``cli`` (the ``insitu`` command). See README.md for the map.
"""

__version__ = "0.1.0"
