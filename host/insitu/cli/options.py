"""The options' one vocabulary, and the options every run command shares.

One spelling per concept across subcommands (``--samples``, ``--epochs``, ``--batch-size``,
``--test-samples``, ``--train-size``, ``--bitstream``, ``--out``, ``--dataset``, ``--seeds``,
``--scheme``). Spellings of older releases stay accepted as hidden aliases for a while: help shows
the current name only, and errors name the option the way it is spelled now.
"""

from __future__ import annotations

from pathlib import Path

import click
from click.core import ParameterSource

from insitu.errors import UsageError


class VocabularyOption(click.Option):
    """A click option whose older spellings (``aliases``) are accepted but not shown."""

    def __init__(self, param_decls, aliases: tuple[str, ...] = (), **kwargs):
        super().__init__([*param_decls, *aliases], **kwargs)
        self.aliases = tuple(aliases)
        self.primary = [o for o in self.opts if o not in self.aliases]

    def get_help_record(self, ctx):
        shown, self.opts = self.opts, self.primary
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = shown

    def get_error_hint(self, ctx) -> str:
        return " / ".join(f"'{o}'" for o in self.primary)


def option(*param_decls: str, aliases: tuple[str, ...] = (), **kwargs):
    """``click.option`` with hidden older spellings: ``option("--batch-size", aliases=("--batch",))``."""
    return click.option(*param_decls, cls=VocabularyOption, aliases=aliases, **kwargs)


def flag_name(ctx: click.Context, name: str) -> str:
    """The option of parameter ``name`` as the user types it now (``batch_size`` -> ``--batch-size``)."""
    for param in ctx.command.params:
        if param.name == name and isinstance(param, click.Option):
            primary = getattr(param, "primary", param.opts)
            return max(primary, key=len)
    return "--" + name.replace("_", "-")


# ------------------------------------------------------------------ config files and overrides

#: Parameters that say where and how to report, never part of a run's config.
NOT_CONFIG = frozenset({"config", "run_dir", "overrides", "as_json", "out", "out_dir", "plot"})


def run_options(fn):
    """``--config FILE.toml``, ``KEY=VALUE`` overrides and ``--run-dir DIR`` of a run command
    (apply them with :func:`resolve_config` and :func:`run_folder`)."""
    fn = click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")(fn)
    fn = click.option("--run-dir", type=click.Path(file_okay=True), default=None,
                      help="Write everything of this run into this folder: config.toml (the resolved "
                           "options), result.json, curve.csv, checkpoint.npz, plot.png, the power "
                           "trace. The same options again resume it; another run's folder is "
                           "refused. `insitu runs compare` tabulates folders.")(fn)
    return click.option("--config", "config", type=click.Path(dir_okay=False), default=None,
                        help="A TOML file of options (`lr = 0.01`, `batch-size = 64`), e.g. a run "
                             "folder's config.toml; options on the command line and KEY=VALUE "
                             "arguments override it.")(fn)


def _config_params(ctx: click.Context) -> dict[str, click.Parameter]:
    return {p.name: p for p in ctx.command.params
            if p.name and p.name not in NOT_CONFIG and isinstance(p, click.Option)}


def _param_for(ctx: click.Context, key: str, where: str) -> click.Parameter:
    params = _config_params(ctx)
    name = key.strip().lstrip("-").replace("-", "_")
    for param in params.values():
        spellings = {o.lstrip("-").replace("-", "_") for o in getattr(param, "opts", [])}
        if name == param.name or name in spellings:
            return param
    known = ", ".join(sorted(p.replace("_", "-") for p in params))
    raise UsageError(f"unknown option {key!r} in {where}; the options of "
                     f"`{ctx.command_path}` are: {known}")


def cast_value(ctx: click.Context, param: click.Parameter, value):
    """A value from a config file (TOML) or an override as ``param`` takes it from the command
    line; raises ``click.BadParameter``. A list is a comma-separated value, or the items of a
    repeatable option (where one string ``a=b,c=d`` is two items). A TOML value must have the
    option's type: ``samples = true`` or ``samples = 500.7`` is refused, not read as 1 or 500."""
    if getattr(param, "multiple", False):
        value = value if isinstance(value, list) else [v for v in str(value).split(",") if v]
    elif isinstance(value, list):
        value = ",".join(map(str, value))
    else:
        _check_toml_type(param, value)
    return param.type_cast_value(ctx, value)


def _check_toml_type(param: click.Parameter, value) -> None:
    """Refuse a typed value (TOML's booleans and numbers) that click would coerce silently."""
    kind = param.type
    flag = getattr(param, "is_flag", False) or isinstance(kind, click.types.BoolParamType)
    integer = isinstance(kind, (click.types.IntParamType, click.IntRange))
    number = integer or isinstance(kind, (click.types.FloatParamType, click.FloatRange))
    if isinstance(value, bool) and not flag:
        raise click.BadParameter(f"{str(value).lower()} is not a value of this option (it takes "
                                 f"{'a number' if number else 'a name or a path'})")
    if flag and not isinstance(value, (bool, str)):
        raise click.BadParameter(f"{value!r} is not true or false")
    if integer and isinstance(value, float):
        raise click.BadParameter(f"{value!r} is not a whole number")


def _cast(ctx: click.Context, param: click.Parameter, value, where: str):
    try:
        return cast_value(ctx, param, value)
    except click.BadParameter as exc:
        raise UsageError(f"{flag_name(ctx, param.name or '')} in {where}: {exc.message}") from None


def resolve_config(ctx: click.Context) -> set[str]:
    """Apply ``--config FILE`` and the ``KEY=VALUE`` overrides to ``ctx.params``; return the
    names of the parameters the user set (on the command line, in the file or as overrides).

    The command line wins over the overrides (a note says so when they disagree), and they over
    the file."""
    from insitu.io import tomllib

    given = {name for name in ctx.params if name not in NOT_CONFIG
             and ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)}
    from_file: dict[str, object] = {}
    config = ctx.params.get("config")
    if config:
        try:
            data = tomllib.loads(Path(config).read_text())
        except FileNotFoundError:
            raise UsageError(f"--config {config} does not exist") from None
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise UsageError(f"--config {config} is not a TOML file of options: {exc}") from None
        for key, value in data.items():
            if isinstance(value, dict):
                raise UsageError(f"--config {config}: [{key}] is a table; the file holds "
                                 "`option = value` lines only")
            param = _param_for(ctx, key, f"--config {config}")
            from_file[param.name] = _cast(ctx, param, value, f"--config {config}")
    overrides: dict[str, object] = {}
    for item in ctx.params.get("overrides") or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"unexpected argument {item!r}: give options as --name VALUE or "
                             "name=value (e.g. lr=0.01)")
        param = _param_for(ctx, key, f"{item!r}")
        cast = _cast(ctx, param, value, repr(item))
        if param.name in given and ctx.params[param.name] != cast:
            click.echo(f"note: {flag_name(ctx, param.name)} on the command line overrides {item!r}",
                       err=True)
        overrides[param.name] = cast
    for name, value in {**from_file, **overrides}.items():
        if name not in given:
            ctx.params[name] = value
    # A file's value that is the option's default changes nothing (a saved config lists them all).
    params = _config_params(ctx)
    set_in_file = {n for n, v in from_file.items() if v != params[n].get_default(ctx)}
    return given | set_in_file | set(overrides)


def resolved_config(ctx: click.Context, applies=lambda name: True, resolved: dict | None = None) -> dict:
    """The run's config: the value of every option that ``applies`` (not where outputs go), keyed
    as a --config file takes them; ``resolved``: the values a command chose for options left at
    their default (None), by parameter name, so that a default and the same value asked
    explicitly are one config."""
    values = {**ctx.params, **(resolved or {})}
    return {name.replace("_", "-"): values.get(name) for name in _config_params(ctx) if applies(name)}


def run_folder(ctx: click.Context, command: str, applies=lambda name: True, resolved: dict | None = None):
    """The run's :class:`insitu.runs.RunFolder` when ``--run-dir`` is given (checked, not yet
    written), else None; its config holds the options that ``applies`` (see :func:`resolved_config`)."""
    from insitu.runs import RunFolder

    path = ctx.params.get("run_dir")
    return RunFolder(path, command, resolved_config(ctx, applies, resolved)) if path else None


#: Parameters that name a figure: their suffix is the figure's format (checked with the path).
PLOT_PARAMS = frozenset({"plot"})


def check_outputs(ctx: click.Context, *names: str) -> None:
    """Check that the output files named by these parameters can be written, and that a figure's
    suffix names a format (before any work)."""
    from insitu.io import check_writable

    for name in names:
        if ctx.params.get(name):
            check_writable(ctx.params[name], flag_name(ctx, name), plot=name in PLOT_PARAMS)
