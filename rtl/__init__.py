"""insitu.rtl: Amaranth 0.5 hardware (processing elements, AXI wrappers, top level)."""
