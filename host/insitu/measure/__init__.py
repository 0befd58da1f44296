"""Measurement: power and energy from instruments (`insitu power`), weight-write reports
(`insitu writes`), and parameter sweeps (`insitu sweep`)."""
