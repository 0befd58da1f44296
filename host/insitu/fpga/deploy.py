"""Deploying to an FPGA board that runs a PYNQ image: a self-contained bundle, copied over SSH.

A bundle is one folder::

    insitu_<board>.bit, insitu_<board>.hwh   the overlay (the pair pynq.Overlay loads), if any
    wheels/insitu-<version>-py3-none-any.whl  this insitu, built offline
    run.sh                                    on the board: install the wheel, train
    manifest.json                             board, files with sha256, versions, train arguments

``run.sh`` installs the wheel with ``pip install --no-deps`` into the board's PYNQ Python (it
sources ``/etc/profile.d/pynq_venv.sh`` where the image has it, as PYNQ 3.x images do) and runs
``insitu train --board <board> --bitstream <bundle>/insitu_<board>.bit`` with the bundle's train
arguments, writing the result to ``result.json`` beside it.

Copying and starting it (``--host``) uses the user's own ssh/scp/rsync and SSH configuration:
keys and host aliases come from ``~/.ssh``; nothing here stores or passes a password, host keys
are checked as usual, and ``BatchMode=yes`` makes a missing key fail instead of prompting.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from insitu.errors import InsituError, UsageError

from .hwh import check_hwh

#: ``format`` of manifest.json; an existing folder holding it may be replaced by a new bundle.
BUNDLE_FORMAT = "insitu-deploy-bundle"
BUNDLE_FORMAT_VERSION = 1
#: Where ``insitu rtl generate --out-dir build/rtl`` and its Vivado script leave the overlay.
OVERLAY_SEARCH_DIR = Path("build") / "rtl"
#: How every Xilinx .bit begins: a 9-byte field of 0x0ff0 words, then a field count of 1.
BIT_MAGIC = bytes.fromhex("0009" "0ff00ff00ff00ff000" "0001")
#: The .bit header's text fields, by key, before the configuration data (key ``e``).
BIT_FIELDS = {b"a": "design", b"b": "part", b"c": "date", b"d": "time"}
#: Relative to the login's home directory on the board.
DEFAULT_REMOTE_DIR = "insitu-bundle"
#: Fail rather than prompt (no key), and fail fast (no route). Host keys stay checked.
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10")
#: Options of `insitu train` that the bundle sets itself.
RESERVED_TRAIN_OPTIONS = ("--board", "--bitstream", "--out")
# What the source copy for the wheel leaves out (as the packaging test does: an in-tree build
# would leave build/ behind, and setuptools packs a stale build/lib into later wheels).
_SOURCE_IGNORE = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                  ".hypothesis", "sim_build", "out", ".*.tmp", ".*.old")


def deploy_boards() -> list[str]:
    """The boards a bundle can be made for: real FPGA SoC boards (not twins, not the MCU)."""
    from insitu.boards import load_boards

    return [b.name for b in load_boards().values() if b.kind == "fpga-soc" and not b.is_twin]


def check_board(name: str) -> str:
    boards = deploy_boards()
    if name not in boards:
        twin = name.removesuffix("-sim") in boards and name.endswith("-sim")
        raise UsageError(f"deploy needs a real FPGA board running PYNQ, not {name!r}; boards: "
                         f"{', '.join(boards)}" + (f" (a twin runs here: insitu train --board {name})"
                                                   if twin else ""))
    return name


def check_train_args(args) -> list[str]:
    for arg in args:
        if arg.split("=", 1)[0] in RESERVED_TRAIN_OPTIONS:
            raise UsageError(f"{arg.split('=', 1)[0]} is set by the bundle itself; remove it from "
                             "the arguments after --")
    return list(args)


# ---------------------------------------------------------------------------------------------
# Parts of the bundle


def overlay_hint(board: str, search_dir: Path = OVERLAY_SEARCH_DIR) -> str:
    from insitu.accel.ip import bitstream_name

    name = bitstream_name(board)
    return (f"no overlay for {board}: {search_dir / name}.bit/.hwh not found and no --bitstream/--hwh "
            f"given. Get one with `insitu rtl generate --out-dir {search_dir}`, then, in {search_dir}, "
            f"`vivado -mode batch -source build_{board}.tcl`, and deploy again")


def find_overlay(board: str, bit=None, hwh=None,
                 search_dir: Path = OVERLAY_SEARCH_DIR) -> tuple[Path, Path] | None:
    """The (.bit, .hwh) pair to ship: the given files, the partner beside a given one, or the
    pair in ``search_dir``; ``None`` when there is none at all. Half a pair is a usage error:
    ``pynq.Overlay`` loads the .hwh that sits beside the .bit."""
    from insitu.accel.ip import bitstream_name

    if bit is None and hwh is None:
        bit = search_dir / f"{bitstream_name(board)}.bit"
        hwh = bit.with_suffix(".hwh")
        if not bit.exists() and not hwh.exists():
            return None
    bit = Path(bit) if bit is not None else Path(hwh).with_suffix(".bit")
    hwh = Path(hwh) if hwh is not None else bit.with_suffix(".hwh")
    if bit.suffix != ".bit" or hwh.suffix != ".hwh":
        raise UsageError(f"the overlay is a .bit and a .hwh file; got {bit} and {hwh}")
    for have, need, option in ((bit, hwh, "--hwh"), (hwh, bit, "--bitstream")):
        if have.is_file() and not need.is_file():
            raise UsageError(f"{have} has no {need.suffix} beside it ({need} is missing): "
                             f"pynq.Overlay needs both side by side; pass {option} FILE")
    if not bit.is_file():
        raise UsageError(f"overlay files {bit} and {hwh} do not exist")
    return bit, hwh


def check_bitstream(path) -> dict[str, str]:
    """The header fields (design, part, date, time) of a Vivado .bit; a UsageError naming
    ``path`` when it is not one (a twin overlay, a text file, a copy cut short)."""
    path = Path(path)
    with path.open("rb") as fh:
        head = fh.read(4096)
    size = path.stat().st_size
    if not head.startswith(BIT_MAGIC):
        what = ("a simulated board's twin overlay, which runs only on a -sim board"
                if head.lstrip().startswith(b"{") else f"{size} bytes that are not a Vivado .bit")
        raise UsageError(f"{path} has no Xilinx bitstream header: it is {what}; give the .bit "
                         "that Vivado's write_bitstream made for the board")
    fields, pos = {}, len(BIT_MAGIC)
    while head[pos:pos + 1] in BIT_FIELDS:
        length = int.from_bytes(head[pos + 1:pos + 3], "big")
        text = head[pos + 3:pos + 3 + length].rstrip(b"\0")
        fields[BIT_FIELDS[head[pos:pos + 1]]] = text.decode("ascii", "replace")
        pos += 3 + length
    if head[pos:pos + 1] != b"e" or len(fields) != len(BIT_FIELDS):
        raise UsageError(f"{path}: its Xilinx bitstream header is damaged (it has the fields "
                         f"{', '.join(fields) or 'none'}, then no configuration data)")
    data = int.from_bytes(head[pos + 1:pos + 5], "big")
    if size != pos + 5 + data:
        raise UsageError(f"{path} is not whole: its header announces {data} bytes of configuration "
                         f"data, the file holds {size - pos - 5}")
    return fields


def check_overlay(board: str, bit: Path, hwh: Path) -> None:
    """Refuse an overlay that cannot run this insitu on ``board`` before building anything."""
    check_bitstream(bit)
    check_hwh(hwh, board)


def project_root() -> Path | None:
    """The source tree insitu runs from (editable install or checkout), or None for a wheel."""
    import insitu

    root = Path(insitu.__file__).resolve().parents[2]      # host/insitu/__init__.py
    pyproject = root / "pyproject.toml"
    if (root / "host" / "insitu" / "__init__.py").is_file() and pyproject.is_file() \
            and re.search(r'^name\s*=\s*"insitu"', pyproject.read_text(), re.MULTILINE):
        return root
    return None


def check_wheel(path) -> Path:
    path = Path(path)
    if not re.fullmatch(r"insitu-[^-]+-.+\.whl", path.name) or not path.is_file():
        raise UsageError(f"--wheel {path}: not an insitu wheel file (insitu-VERSION-...whl)")
    return path


def build_wheel(root: Path, dest: Path) -> Path:
    """Build insitu's wheel offline from a clean copy of ``root`` into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="insitu-wheel-") as tmp:
        source = Path(tmp) / "src"
        shutil.copytree(root, source, ignore=shutil.ignore_patterns(*_SOURCE_IGNORE))
        build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                                "--no-build-isolation", "-q", "-w", str(dest), str(source)],
                               capture_output=True, text=True)
    wheels = sorted(dest.glob("insitu-*.whl"))
    if build.returncode != 0 or len(wheels) != 1:
        tail = "\n".join((build.stderr or build.stdout).strip().splitlines()[-5:])
        raise InsituError(f"building the insitu wheel from {root} failed (it needs setuptools>=77 "
                          f"and wheel installed, no network); or pass --wheel FILE:\n{tail}")
    return wheels[0]


_RUN_SH = r"""#!/usr/bin/env bash
# insitu bundle for @BOARD@, made by `insitu deploy` at @CREATED@.
# On the board (PYNQ image), usually as root:  bash run.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

# PYNQ 3.x images keep pynq in a virtual environment that this profile script activates; older
# images install it system-wide.
if [ -f /etc/profile.d/pynq_venv.sh ]; then
    set +u
    source /etc/profile.d/pynq_venv.sh
    set -u
fi

if [ "@HAVE_OVERLAY@" != yes ]; then
    echo "insitu: this bundle has no overlay; on the computer that made it: "@HINT@ >&2
    exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "insitu: warning: not root; pynq needs root to load an overlay (sudo bash $here/run.sh)" >&2
fi

# A bundle that arrived incomplete or altered is refused before anything is installed.
python3 - <<'EOF'
import hashlib, json, sys
files = json.load(open("manifest.json"))["files"]
bad = [name for name, meta in files.items()
       if hashlib.sha256(open(name, "rb").read()).hexdigest() != meta["sha256"]]
if bad:
    sys.exit("insitu: files changed since the bundle was made: " + " ".join(bad))
EOF

python3 -m pip install --no-deps --no-index --force-reinstall --quiet "wheels/@WHEEL@"
# --no-deps: warn about what the board's Python lacks instead of fetching it.
python3 - <<'EOF'
import importlib.metadata as md, re, sys
missing = []
for req in md.requires("insitu") or []:
    if "extra ==" not in req:
        name = re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0]
        try:
            md.version(name)
        except md.PackageNotFoundError:
            missing.append(name)
if missing:
    print("insitu: warning: not installed on this board: " + " ".join(missing), file=sys.stderr)
EOF

rm -f result.json
python3 -m insitu train --board @BOARD@ --bitstream "$here/@BIT@" --out "$here/result.json" @ARGS@
echo "insitu: result in $here/result.json" >&2
"""


def run_script(board: str, wheel: str, overlay: bool, train_args, created: str, hint: str) -> str:
    from insitu.accel.ip import bitstream_name

    values = {"BOARD": board, "CREATED": created, "HAVE_OVERLAY": "yes" if overlay else "no",
              "HINT": shlex.quote(hint), "WHEEL": wheel, "BIT": f"{bitstream_name(board)}.bit",
              "ARGS": shlex.join(train_args)}
    text = _RUN_SH
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    return text


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(folder: Path) -> dict | None:
    """The manifest of the bundle in ``folder``, or None if it is not one."""
    try:
        manifest = json.loads((Path(folder) / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == BUNDLE_FORMAT else None


def check_out_dir(out: Path) -> Path:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out-dir {out} is an existing file; give a folder")
    if out.is_dir() and any(out.iterdir()) and read_manifest(out) is None:
        raise UsageError(f"--out-dir {out} is a folder that is neither empty nor an insitu bundle; "
                         "choose a new or empty folder")
    return out


# ---------------------------------------------------------------------------------------------
# The bundle


def build_bundle(out, board: str, bit=None, hwh=None, wheel=None, train_args=(),
                 search_dir: Path = OVERLAY_SEARCH_DIR, progress=lambda msg: None) -> dict:
    """Write the bundle into ``out`` (replacing an earlier bundle there) and return its manifest.

    Everything is written into a temporary folder beside ``out`` and renamed into place at the
    end, so a failure leaves the earlier bundle, or nothing, never half a bundle.
    """
    from insitu import __version__
    from insitu.accel import regmap
    from insitu.accel.ip import bitstream_name

    check_board(board)
    train_args = check_train_args(train_args)
    out = check_out_dir(Path(out))
    overlay = find_overlay(board, bit, hwh, search_dir)
    if overlay:
        check_overlay(board, *overlay)
    root = None
    if wheel is not None:
        wheel = check_wheel(wheel)
    else:
        root = project_root()
        if root is None:
            raise UsageError("insitu runs from an installed wheel without its source tree, so "
                             "deploy cannot build the wheel for the board: pass --wheel FILE "
                             "(an insitu-*.whl of this version)")
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    hint = None if overlay else overlay_hint(board, search_dir)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)               # mkdtemp makes it private
        if wheel is not None:
            (tmp / "wheels").mkdir()
            built = Path(shutil.copy2(wheel, tmp / "wheels" / wheel.name))
        else:
            progress(f"building the insitu wheel from {root}")
            built = build_wheel(root, tmp / "wheels")
        names = [f"wheels/{built.name}"]
        if overlay:
            for src, suffix in zip(overlay, (".bit", ".hwh")):
                shutil.copy2(src, tmp / f"{bitstream_name(board)}{suffix}")
                names.append(f"{bitstream_name(board)}{suffix}")
        script = tmp / "run.sh"
        script.write_text(run_script(board, built.name, overlay is not None, train_args, created,
                                     hint or ""))
        script.chmod(0o755)
        names.insert(0, "run.sh")
        manifest = {
            "format": BUNDLE_FORMAT, "format_version": BUNDLE_FORMAT_VERSION, "board": board,
            "created": created,
            "versions": {"insitu": __version__, "regmap": regmap.VERSION,
                         "regmap_hex": f"{regmap.VERSION:#010x}"},
            "train_args": train_args,
            "files": {n: {"sha256": _sha256(tmp / n), "bytes": (tmp / n).stat().st_size} for n in names},
            "overlay": ({"bit": f"{bitstream_name(board)}.bit", "hwh": f"{bitstream_name(board)}.hwh",
                         "from": [str(Path(p).resolve()) for p in overlay]} if overlay else None),
            "overlay_hint": hint,
            "wheel": names[1],
            "run": "bash run.sh",
        }
        from insitu.io import atomic_write_json

        atomic_write_json(tmp / "manifest.json", manifest)
        _publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _publish(tmp: Path, out: Path) -> None:
    """Rename the finished bundle onto ``out``; an earlier bundle there is moved aside first
    (a folder cannot be renamed over a non-empty one) and put back if the rename fails."""
    if not out.exists():
        os.rename(tmp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    os.rename(out, old / "bundle")
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old / "bundle", out)
        raise
    finally:
        if out.exists():
            shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Copy and run over SSH

_HOST = re.compile(r"[A-Za-z0-9_.%-]+")       # a name, an address or an ~/.ssh/config alias
_USER = re.compile(r"[A-Za-z0-9_.-]+")
_REMOTE = re.compile(r"[A-Za-z0-9_./-]+")


def _check_remote(host: str, user: str | None, remote_dir: str) -> str:
    # Leading dashes would turn a value into an ssh option; shell characters would reach the
    # board's shell and scp's remote path, so only plain names pass.
    if not _HOST.fullmatch(host) or host.startswith("-"):
        raise UsageError(f"--host {host!r}: give a host name, an address or an ~/.ssh/config alias")
    if user is not None and (not _USER.fullmatch(user) or user.startswith("-")):
        raise UsageError(f"--user {user!r}: not a user name")
    remote = remote_dir.removeprefix("~/")     # ssh, scp and rsync start in the home directory
    if not remote or not _REMOTE.fullmatch(remote) or remote.startswith("-"):
        raise UsageError(f"--remote-dir {remote_dir!r}: use letters, digits and _ . / - only "
                         "(relative paths are in the login's home directory)")
    return remote.rstrip("/") or "/"


def ssh_commands(host: str, user: str | None, remote_dir: str, bundle_dir,
                 rsync: bool | None = None) -> list[list[str]]:
    """The command lines that copy the bundle to ``host`` and run it there, in order:
    create the remote folder, copy (rsync when present here, else scp -r), run ``run.sh``."""
    remote = _check_remote(host, user, remote_dir)
    target = f"{user}@{host}" if user else host
    bundle = Path(bundle_dir)
    if rsync is None:
        rsync = shutil.which("rsync") is not None
    commands = [["ssh", *SSH_OPTIONS, target, f"mkdir -p -- {shlex.quote(remote)}"]]
    if rsync:
        commands.append(["rsync", "-a", "-e", shlex.join(["ssh", *SSH_OPTIONS]),
                         f"{bundle}/", f"{target}:{remote}/"])
    else:
        # Each entry into the existing folder: `scp -r bundle host:dir` would nest the folder
        # inside dir when dir exists already.
        entries = sorted(str(p) for p in bundle.iterdir())
        commands.append(["scp", "-r", *SSH_OPTIONS, *entries, f"{target}:{remote}/"])
    commands.append(["ssh", *SSH_OPTIONS, target, f"bash {shlex.quote(remote)}/run.sh"])
    return commands


def run_commands(commands: list[list[str]], host: str) -> None:
    """Run the commands of :func:`ssh_commands`; the last one's output (the training on the
    board) goes to stderr as it comes, leaving stdout to --json."""
    for i, cmd in enumerate(commands):
        last = i == len(commands) - 1
        out_fd = None
        if last:
            try:
                out_fd = sys.stderr.fileno()
            except (AttributeError, OSError, ValueError):
                out_fd = None
        try:
            proc = subprocess.run(cmd, stdout=out_fd if out_fd is not None else subprocess.PIPE,
                                  stderr=None if out_fd is not None else subprocess.PIPE, text=True)
        except FileNotFoundError:
            raise InsituError(f"{cmd[0]} is not installed here: deploy uses the OpenSSH client "
                              "(apt-get install openssh-client)") from None
        said = "\n".join(((proc.stderr or "") + (proc.stdout or "")).strip().splitlines()[-3:])
        if out_fd is None and proc.stdout and last:
            sys.stderr.write(proc.stdout)
        if proc.returncode == 0:
            continue
        if proc.returncode == 255:           # ssh's (and rsync's over ssh) "no connection"
            raise UsageError(f"cannot reach {host} over SSH ({said or 'ssh exited 255'}); check the "
                             f"host name, that it is up, and that your key is accepted there "
                             f"(ssh {host} true)")
        if last:
            raise InsituError(f"the run on {host} failed (exit {proc.returncode}); its output is above")
        raise InsituError(f"`{shlex.join(cmd[:1])} ...` to {host} failed (exit {proc.returncode}): {said}")
