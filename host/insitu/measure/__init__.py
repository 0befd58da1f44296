"""Measurement: power meters and recordings with phases (`insitu power`), the energy models
(integral of a trace, per-operation estimate), and parameter sweeps (`insitu sweep`). A low
layer: it imports no method and no platform; they import it."""
