"""`insitu deploy`: a bundle that trains on an FPGA board under PYNQ, optionally copied and run."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from insitu.cli.options import option
from insitu.cli.output import console, emit_json
from insitu.errors import UsageError
from insitu.io import check_writable
from insitu.fpga.deploy import DEFAULT_REMOTE_DIR, OVERLAY_SEARCH_DIR


@click.command("deploy")
@click.option("--board", required=True, help="The FPGA board: ultra96v2 or zedboard (or a -sim twin).")
@option("--out-dir", "out_dir", aliases=("--out",), type=click.Path(file_okay=False), required=True,
        help="Bundle folder (created; an earlier bundle there is replaced).")
@option("--bitstream", "bit", aliases=("--bit",), type=click.Path(exists=True, dir_okay=False),
        help=f"Bitstream; its .hwh must sit beside it or come with --hwh "
                   f"(default: {OVERLAY_SEARCH_DIR}/insitu_<board>.bit).")
@click.option("--hwh", type=click.Path(exists=True, dir_okay=False),
              help="Hardware handoff file of the bitstream.")
@click.option("--wheel", type=click.Path(exists=True, dir_okay=False),
              help="Ship this insitu wheel instead of building one from the source tree.")
@click.option("--host", help="Copy the bundle to this host (name, address or ~/.ssh/config alias) "
                             "and run it there.")
@click.option("--user", help="Log in as this user (default: your SSH configuration's).")
@click.option("--remote-dir", default=None,
              help=f"Bundle folder on the host [default: {DEFAULT_REMOTE_DIR}, in the home directory].")
@click.option("--dry-run", is_flag=True, help="With --host: print the ssh/scp commands, run nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest, path and commands as JSON.")
@click.argument("train_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- TRAIN_ARGS...]")
def command(board, out_dir, bit, hwh, wheel, host, user, remote_dir, dry_run, as_json, train_args):
    """Make a bundle that trains on a board running PYNQ, and optionally run it there over SSH.

    The bundle holds the overlay (insitu_<board>.bit/.hwh), this insitu as a wheel with the
    pure-Python wheels PYNQ 3.x images lack, run.sh and a manifest with checksums. On the board,
    as root, `bash run.sh` installs them offline into the PYNQ Python (pip checks the image's
    versions) and runs `insitu train --board <board> --bitstream ...` with TRAIN_ARGS (--algo tt
    unless they name one), writing result.json beside it. TRAIN_ARGS are checked here first, as
    the board would check them. Without an overlay the bundle is still made, and run.sh says
    how to get one. A twin board (ultra96v2-sim, zedboard-sim) gets the twin overlay: a rehearsal
    on the board-image twin (docs/fpga.md).

    With --host, the bundle is copied with rsync (or scp -r) and started with ssh, using your own
    SSH keys and configuration: no password is asked for or stored, host keys are checked.

    \b
    Examples:
      insitu deploy --board ultra96v2 --out-dir bundle -- --algo tt --samples 6000 --json
      insitu deploy --board zedboard-sim --out-dir twin-bundle -- --model tiny --samples 64
      insitu deploy --board ultra96v2 --out-dir bundle --bitstream my.bit --hwh my.hwh
      insitu deploy --board ultra96v2 --out-dir bundle --host pynq --user root --dry-run
    """
    from insitu.fpga import deploy

    if not host and (user or remote_dir or dry_run):
        raise UsageError("--user, --remote-dir and --dry-run go with --host")
    remote_dir = remote_dir or DEFAULT_REMOTE_DIR
    deploy.check_board(board)
    train_args = deploy.check_train_args(train_args)
    _check_train_args(board, train_args)
    if host:                                   # refuse a bad host before minutes of building
        deploy.ssh_commands(host, user, remote_dir, out_dir, rsync=True)
    _check_out_dir(deploy, out_dir)

    def progress(msg):
        if not as_json:
            console.print(msg)

    manifest = deploy.build_bundle(out_dir, board, bit=bit, hwh=hwh, wheel=wheel,
                                   train_args=train_args, progress=progress)
    commands = deploy.ssh_commands(host, user, remote_dir, out_dir) if host else []
    ran = False
    if host and not dry_run:
        progress(f"copying the bundle to {host}:{remote_dir} and running it there")
        deploy.run_commands(commands, host)
        ran = True

    if as_json:
        payload = {"path": str(Path(out_dir).resolve()), **manifest}
        if host:
            payload.update(host=host, remote_dir=remote_dir, commands=commands, ran=ran)
        emit_json(payload)
        return
    click.echo(str(out_dir))
    if dry_run:
        for cmd in commands:
            click.echo(shlex.join(cmd))
    for name in manifest["files"]:
        console.print(f"  {name}")
    if manifest["overlay_hint"]:
        console.print(f"[yellow]warning:[/] {manifest['overlay_hint']}")
    if not host:
        console.print(f"copy {out_dir} to the board and run `bash run.sh` there, or deploy again "
                      "with --host")


def _check_out_dir(deploy, out_dir) -> None:
    """The bundle folder can be made and written, before the wheel is built; nothing is created
    (a refused deploy leaves no folder)."""
    try:
        deploy.check_out_dir(out_dir)
    except UsageError as exc:                  # the library says --out, the folder's old spelling
        message = str(exc)
        raise UsageError("--out-dir " + message[len("--out "):] if message.startswith("--out ")
                         else message) from None
    target = Path(out_dir)
    existing = target if target.is_dir() else next((p for p in target.parents if p.exists()), Path("."))
    try:
        check_writable(existing / ".insitu-deploy-probe", "--out-dir")
    except UsageError:
        raise UsageError(f"cannot write --out-dir {out_dir}: {existing} is not a writable folder") from None


def _check_train_args(board: str, args) -> None:
    """Check TRAIN_ARGS with `insitu train`'s own options and checks, as the board will (the wheel
    carries this same command), so that a typo or an option the board refuses fails now."""
    from insitu.cli.train import checked_config, command as train_command

    if {"-h", "--help"} & set(args):
        raise UsageError("--help is not a training argument; see `insitu train --help`")
    try:
        # The board first (an algorithm that does not run there says so), then with the
        # --bitstream that run.sh adds.
        for bundle_args in (["--board", board], ["--board", board, "--bitstream", "insitu_board.bit"]):
            with train_command.make_context("insitu train", [*args, *bundle_args]) as ctx:
                checked_config(ctx)
    except click.ClickException as exc:
        raise UsageError(f"arguments after -- (for insitu train on {board}): "
                         f"{exc.format_message()}") from None
