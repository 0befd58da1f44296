"""The options' one vocabulary, and the options every run command shares.

One spelling per concept across subcommands (``--samples``, ``--epochs``, ``--batch-size``,
``--test-samples``, ``--train-size``, ``--bitstream``, ``--out``, ``--dataset``, ``--seeds``,
``--scheme``). Spellings of older releases stay accepted as hidden aliases for a while: help shows
the current name only, and errors name the option the way it is spelled now.
"""

from __future__ import annotations

import click


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
