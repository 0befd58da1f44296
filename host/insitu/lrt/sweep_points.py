"""The LRT experiments a parameter sweep (`insitu sweep`, :mod:`insitu.measure.sweep`) can run by
name: ``lrt.adapt``, the LRT paper's adaptation experiment (figure 2), one scheme and
configuration per point. Importing this module registers them.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

from insitu.checks import check_int
from insitu.errors import UsageError
from insitu.lrt.adapt import check_adapt, run_adapt
from insitu.lrt.online import ENVS, OnlineData
from insitu.lrt.schemes import SCHEMES, LRTConfig
from insitu.measure.sweep import Experiment, register

_ADAPT_EXCLUDED = ("seed", "config", "counts_out", "checkpoint", "checkpoint_every", "advance")


def _lrt_config_fields() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(LRTConfig))


def _adapt_parameters() -> tuple[str, ...]:
    names = [p for p in inspect.signature(run_adapt).parameters if p not in _ADAPT_EXCLUDED]
    return tuple(names) + _lrt_config_fields()


def _adapt_split(params: dict):
    """``params`` as ``run_adapt`` keyword arguments and an LRTConfig (0 means None, as on the
    command line, for kappa_th and factor_bits: TOML has no null)."""
    fields = _lrt_config_fields()
    config = {k: v for k, v in params.items() if k in fields}
    for name in ("kappa_th", "factor_bits"):
        if config.get(name, 1) == 0:
            config[name] = None
    return {k: v for k, v in params.items() if k not in fields}, LRTConfig(**config)


def lrt_adapt(seed: int = 0, **params) -> dict:
    """One run of :func:`insitu.lrt.adapt.run_adapt`, in this process."""
    kwargs, config = _adapt_split(params)
    return run_adapt(seed=seed, config=config, **kwargs)


@functools.lru_cache(maxsize=4)
def _online_data(dataset: str, data_dir):
    return OnlineData(dataset, data_dir)


def _validate_adapt(params: dict) -> None:
    if params["env"] not in ENVS:
        raise UsageError(f"env must be one of {', '.join(ENVS)}; got {params['env']!r}")
    if params["scheme"] not in SCHEMES:
        raise UsageError(f"scheme must be one of {', '.join(SCHEMES)}; got {params['scheme']!r}")
    for name in ("samples", "offline_samples", "segment", "pretrain_epochs", "curve_points"):
        low = 0 if name == "offline_samples" else 1
        check_int(name, params.get(name, low), low=low)
    kwargs, config = _adapt_split(params)
    check_adapt(kwargs.get("arch", "cnn"),
                _online_data(kwargs.get("dataset", "fashion-mnist"), kwargs.get("data_dir")), config)


_ADAPT_METRICS = ("online_accuracy", "online_accuracy_mean", "pretrained_validation_accuracy",
                  "max_writes_per_cell", "total_writes", "max_update_ops_per_cell", "samples",
                  "seconds", "nvm", "layers", "lrt")

ADAPT = register(Experiment(
    "lrt.adapt", "insitu.lrt.sweep_points:lrt_adapt", parameters=_adapt_parameters,
    required=("env", "scheme", "samples"), paths=("data_dir", "cache_dir"),
    key_ignore=("cache_dir",), metrics=_ADAPT_METRICS, validate=_validate_adapt))
