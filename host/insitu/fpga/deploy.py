"""Deploying to an FPGA board that runs a PYNQ image: a self-contained bundle, copied over SSH.

A bundle is one folder::

    insitu_<board>.bit, insitu_<board>.hwh   the overlay (the pair pynq.Overlay loads), if any
    wheels/insitu-<version>-py3-none-any.whl  this insitu, built offline
    wheels/*.whl                              the pure-Python packages PYNQ 3.x images lack
    run.sh                                    on the board: check, install the wheels, train
    manifest.json                             board, files with sha256, versions, train arguments

``run.sh`` runs as root (pynq needs it), sources the image's XRT and PYNQ venv profile scripts
(``ssh host bash run.sh`` reads no profile.d), installs insitu into the board's PYNQ Python with
``pip install --no-index --find-links wheels`` (pip checks the versions the image has against
insitu's floors and takes only what is missing from the bundle) and runs ``insitu train --board
<board> --bitstream <bundle>/insitu_<board>.bit`` with the bundle's train arguments, writing the
result to ``result.json`` beside it. The train arguments are checked here, as ``insitu train``
on the board would check them, before anything is built.

A bundle for a twin board (``--board ultra96v2-sim``) is the same, with the twin overlay that
``insitu train`` writes: it rehearses a deployment on the board-image twin (docs/fpga.md).

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
#: Options of `insitu train` that the bundle sets itself; `--config` names a file the bundle lacks.
RESERVED_TRAIN_OPTIONS = ("--board", "--bitstream", "--out", "--config")
#: What the bundle trains when its train arguments name no algorithm (sgd does not run on the PL).
DEFAULT_BOARD_ALGO = "tt"
#: The pure-Python packages that insitu's board path needs and the PYNQ 3.x images lack (or have
#: too old: jammy's Pygments 2.11 is below rich's floor), pinned as scripts/constraints.txt pins
#: them (a unit test keeps the two equal). pip on the board installs only those it needs.
BOARD_WHEELS = ("rich==15.0.0", "markdown-it-py==4.3.0", "mdurl==0.1.2", "pygments==2.21.0",
                "tomli==2.4.1", "tomli-w==1.2.0", "threadpoolctl==3.8.0")
#: The oldest Python of the boards' images (PYNQ 3.x: Ubuntu 22.04's 3.10).
BOARD_PYTHON = "3.10"
# What the source copy for the wheel leaves out (as the packaging test does: an in-tree build
# would leave build/ behind, and setuptools packs a stale build/lib into later wheels).
_SOURCE_IGNORE = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                  ".hypothesis", "sim_build", "out", ".*.tmp", ".*.old")


def deploy_boards(twins: bool = False) -> list[str]:
    """The boards a bundle can be made for: the FPGA SoC boards (and, with ``twins``, their
    simulated twins, for a rehearsal on the board-image twin)."""
    from insitu.boards import load_boards

    return [b.name for b in load_boards().values()
            if b.kind == "fpga-soc" and (twins or not b.is_twin)]


def check_board(name: str) -> str:
    if name not in deploy_boards(twins=True):
        raise UsageError(f"deploy needs an FPGA board running PYNQ, not {name!r}; boards: "
                         f"{', '.join(deploy_boards())} (or their twins, "
                         f"{', '.join(b + '-sim' for b in deploy_boards())})")
    return name


def is_twin_board(name: str) -> bool:
    return name not in deploy_boards()


def overlay_name(board: str) -> str:
    """insitu_<board>: a twin's overlay is its real board's block design."""
    from insitu.accel.ip import bitstream_name

    return bitstream_name(board.removesuffix("-sim") if is_twin_board(board) else board)


def check_train_args(args) -> list[str]:
    """The train arguments with the bundle's default algorithm; the reserved options refused
    (what the board itself refuses is checked by the CLI with `insitu train`'s own checks)."""
    for arg in args:
        if arg.split("=", 1)[0] in RESERVED_TRAIN_OPTIONS:
            option = arg.split("=", 1)[0]
            why = ("the file is not in the bundle; give its options as arguments" if option == "--config"
                   else "it is set by the bundle itself")
            raise UsageError(f"{option} cannot be a bundle's train argument: {why}; remove it from "
                             "the arguments after --")
    args = list(args)
    if not any(a == "--algo" or a.startswith("--algo=") for a in args):
        args = ["--algo", DEFAULT_BOARD_ALGO, *args]
    return args


def bundled_dataset(train_args: list[str]) -> tuple[list[str], str | None, str | None]:
    """The train arguments with a ``--dataset`` of the user's files pointing into the bundle's
    ``data/`` folder, the dataset as given and the name it has there (None, None for a built-in
    dataset, which the board reads from its own disk).

    A ``.npz`` or a ``.csv`` is copied with its options kept. An image folder travels as the
    ``.npz`` it loads as (its split and size applied), because the board images have no Pillow."""
    from insitu.data.files import is_file_spec, parse_spec

    args = list(train_args)
    for i, arg in enumerate(args):
        if arg == "--dataset" and i + 1 < len(args):
            at, value, prefix = i + 1, args[i + 1], ""
        elif arg.startswith("--dataset="):
            at, value, prefix = i, arg.split("=", 1)[1], "--dataset="
        else:
            continue
        if not is_file_spec(value):
            return args, None, None
        spec = parse_spec(value)
        name = spec.path.resolve().name or "dataset"
        if spec.kind == "folder":
            name += ".npz"
            args[at] = f"{prefix}npz:data/{name}"
        else:
            args[at] = prefix + ",".join([f"{spec.kind}:data/{name}", *value.split(",")[1:]])
        return args, value, name
    return args, None, None


# ---------------------------------------------------------------------------------------------
# Parts of the bundle


def bundle_dataset(spec_text: str, target: Path) -> None:
    """The user's dataset ``spec_text`` written to ``target`` (see :func:`bundled_dataset`)."""
    from insitu.data import load_dataset
    from insitu.data.files import parse_spec, write_npz

    spec = parse_spec(spec_text)
    if spec.kind == "folder":
        write_npz(load_dataset(spec_text), target)
    else:
        shutil.copy2(spec.path, target)


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
    if bit is None:
        assert hwh is not None                  # (neither given: bit was set above)
        bit = Path(hwh).with_suffix(".bit")
    else:
        bit = Path(bit)
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


def _cached_board_wheels(folder: Path) -> dict[str, Path]:
    """The wheels of :data:`BOARD_WHEELS` already in ``folder``, by pin."""
    found = {}
    for pin in BOARD_WHEELS:
        name, version = pin.split("==")
        stem = re.sub(r"[-_.]+", "_", name).lower()
        hits = [w for w in folder.glob("*.whl")
                if w.name.lower().startswith(f"{stem}-{version}-") and w.name.endswith("-none-any.whl")]
        if hits:
            found[pin] = hits[0]
    return found


def board_wheels(progress=lambda msg: None) -> list[Path]:
    """The wheels of :data:`BOARD_WHEELS`, pure Python for the boards' Python; downloaded from
    PyPI once into insitu's cache (``board-wheels``), then taken from there offline."""
    from insitu.resources import cache_dir

    folder = cache_dir("board-wheels")
    found = _cached_board_wheels(folder) if folder.is_dir() else {}
    missing = [pin for pin in BOARD_WHEELS if pin not in found]
    if missing:
        progress(f"downloading the pure-Python wheels a PYNQ image lacks into {folder} (once): "
                 + " ".join(missing))
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            fetch = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                 "--python-version", BOARD_PYTHON, "--implementation", "py", "--platform", "any",
                 "--dest", tmp, *missing], capture_output=True, text=True)
            if fetch.returncode != 0:
                tail = "\n".join(fetch.stderr.strip().splitlines()[-3:])
                raise InsituError(f"cannot download the wheels the board needs ({' '.join(missing)}) "
                                  f"from PyPI into {folder}: copy them there from a machine with "
                                  f"network access (pip download --no-deps PACKAGE==VERSION), then "
                                  f"deploy again:\n{tail}")
            for wheel in Path(tmp).glob("*.whl"):
                os.replace(wheel, folder / wheel.name)      # whole files only: a rename
        found = _cached_board_wheels(folder)
        still = [pin for pin in BOARD_WHEELS if pin not in found]
        if still:
            raise InsituError(f"pip downloaded no pure-Python wheel of {' '.join(still)} into {folder}")
    return [found[pin] for pin in BOARD_WHEELS]


_RUN_SH = r"""#!/usr/bin/env bash
# insitu bundle for @BOARD@, made by `insitu deploy` at @CREATED@.
# On the board (PYNQ image), as root:  sudo bash run.sh   (or ssh root@board bash run.sh)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
say() { echo "insitu: $*" >&2; }

if [ "@HAVE_OVERLAY@" != yes ]; then
    say "this bundle has no overlay; on the computer that made it: "@HINT@
    exit 1
fi
# pynq maps the PL's registers through /dev/mem and loads bitstreams: only root may.
if [ "$(id -u)" -ne 0 ]; then
    say "run.sh must run as root (pynq maps the PL through /dev/mem): sudo bash $here/run.sh"
    exit 1
fi

# What a login shell would have read: XRT's environment (pynq finds the board's device only
# where XILINX_XRT is set) and the venv that PYNQ 3.x images keep pynq in. Older images (v2.x)
# have neither and install pynq system-wide.
set +u
for profile in /etc/profile.d/xrt_setup.sh /etc/profile.d/pynq_venv.sh; do
    if [ -f "$profile" ]; then source "$profile" >/dev/null; fi
done
set -u
if [ "@TWIN@" != yes ] && [ -z "${XILINX_XRT:-}" ] && [ -d /opt/xilinx/xrt ]; then
    say "warning: XILINX_XRT is not set and /etc/profile.d/xrt_setup.sh is missing; pynq may find no board"
fi

if ! python3 -c 'import sys; sys.exit(sys.version_info < (@PY_MAJOR@, @PY_MINOR@))'; then
    say "insitu needs Python @PY_MAJOR@.@PY_MINOR@ or newer; this image's python3 is $(python3 --version 2>&1)"
    exit 1
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

# pip checks the versions the image has against insitu's requirements and installs, from the
# bundle only (--no-index: the board may be offline), what is missing or too old.
if ! log="$(python3 -m pip install --disable-pip-version-check --no-index --find-links wheels \
        "wheels/@WHEEL@" 2>&1)"; then
    echo "$log" | tail -n 5 >&2
    say "the board's Python cannot satisfy insitu's requirements (above): install what pip names" \
        "with the image's package manager (apt-get install python3-NAME), or put its wheel into $here/wheels"
    exit 1
fi
# The same version may be installed from an earlier bundle: this bundle's code replaces it.
python3 -m pip install --disable-pip-version-check --no-deps --no-index --force-reinstall --quiet \
    "wheels/@WHEEL@"

rm -f result.json
python3 -m insitu train --board @BOARD@ --bitstream "$here/@BIT@" --out "$here/result.json" @ARGS@
say "result in $here/result.json"
"""


def run_script(board: str, wheel: str, overlay: bool, train_args, created: str, hint: str) -> str:
    major, minor = BOARD_PYTHON.split(".")
    values = {"BOARD": board, "CREATED": created, "HAVE_OVERLAY": "yes" if overlay else "no",
              "HINT": shlex.quote(hint), "WHEEL": wheel, "BIT": f"{overlay_name(board)}.bit",
              "ARGS": shlex.join(train_args), "TWIN": "yes" if is_twin_board(board) else "no",
              "PY_MAJOR": major, "PY_MINOR": minor}
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

    check_board(board)
    train_args, dataset, data_name = bundled_dataset(check_train_args(train_args))
    if dataset is not None:             # a bad file is refused before the wheel is built
        from insitu.data import load_dataset

        load_dataset(dataset)
    out = check_out_dir(Path(out))
    twin = is_twin_board(board)
    if twin:
        if bit is not None or hwh is not None:
            raise UsageError(f"a bundle for the twin {board} carries the twin overlay that insitu "
                             "writes for it: leave out --bitstream and --hwh")
        overlay = None
    else:
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
    hint = None if overlay or twin else overlay_hint(board, search_dir)
    extra_wheels = board_wheels(progress)

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
            assert root is not None             # no --wheel: project_root() found it above
            progress(f"building the insitu wheel from {root}")
            built = build_wheel(root, tmp / "wheels")
        names = [f"wheels/{built.name}"]
        for extra in extra_wheels:
            shutil.copy2(extra, tmp / "wheels" / extra.name)
            names.append(f"wheels/{extra.name}")
        name = overlay_name(board)
        if twin:
            from .twin import write_twin_overlay

            write_twin_overlay(board.removesuffix("-sim"), tmp)
            names += [f"{name}.bit", f"{name}.hwh"]
        elif overlay:
            for src, suffix in zip(overlay, (".bit", ".hwh")):
                shutil.copy2(src, tmp / f"{name}{suffix}")
                names.append(f"{name}{suffix}")
        if dataset is not None:         # the user's files travel with the bundle
            assert data_name is not None        # bundled_dataset gives both or neither
            progress(f"writing {dataset} into the bundle's data/{data_name}")
            (tmp / "data").mkdir()
            bundle_dataset(dataset, tmp / "data" / data_name)
        script = tmp / "run.sh"
        script.write_text(run_script(board, built.name, overlay is not None or twin, train_args,
                                     created, hint or ""))
        script.chmod(0o755)
        names.insert(0, "run.sh")
        manifest = {
            "format": BUNDLE_FORMAT, "format_version": BUNDLE_FORMAT_VERSION, "board": board,
            "created": created,
            "versions": {"insitu": __version__, "regmap": regmap.VERSION,
                         "regmap_hex": f"{regmap.VERSION:#010x}"},
            "train_args": train_args,
            "files": {n: {"sha256": _sha256(tmp / n), "bytes": (tmp / n).stat().st_size} for n in names},
            "overlay": ({"bit": f"{name}.bit", "hwh": f"{name}.hwh", "from": "the twin overlay"} if twin
                        else {"bit": f"{name}.bit", "hwh": f"{name}.hwh",
                              "from": [str(Path(p).resolve()) for p in overlay]} if overlay
                        else None),
            "overlay_hint": hint,
            "dataset": None if dataset is None else {"from": dataset, "to": f"data/{data_name}"},
            "wheel": names[1],
            "board_wheels": [f"wheels/{w.name}" for w in extra_wheels],
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
