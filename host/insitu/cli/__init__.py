"""The ``insitu`` command line.

Every subcommand lives in a module of this package and is registered on :data:`main` below.
Library errors (:class:`insitu.errors.InsituError`) become a one-line message on stderr and their
exit code; commands that report figures take ``--json``.
"""

from __future__ import annotations

import sys

import click

from insitu import __version__
from insitu.errors import InsituError


class _Group(click.Group):
    """A click group that turns insitu's errors into clean messages and exit codes."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except InsituError as exc:
            click.secho(f"error: {exc}", fg="red", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            # A second Ctrl-C, or one outside a training loop (which stops at a step's end).
            click.secho("interrupted", fg="red", err=True)
            sys.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="insitu")
def main():
    """insitu: train neural networks on edge devices (FPGA SoC boards and microcontrollers).

    \b
    Start here:
      insitu doctor                 check the toolchain and say what is missing
      insitu boards                 the boards and their simulated twins
      insitu data info fashion-mnist
      insitu train                  on-device training on a simulated twin (the default board)
      insitu lrt adapt --env shift  low-rank training that spares NVM weight writes
      insitu tt train               tensor-train training with 4-bit factors
      insitu runs compare A B       compare run folders (any command's --run-dir)

    Every command that reports figures takes --json. `insitu COMMAND --help` explains each one.
    """


def _register():
    from insitu.cli import (boards, data, deploy, doctor, e2train, flash, lrt, mcu, power, rtl, runs, sweep,
                            train, tt, writes)

    for module in (boards, data, doctor, train, lrt, tt, rtl, deploy, mcu, flash, power, writes, sweep,
                   e2train, runs):
        main.add_command(module.command)


_register()
