#!/usr/bin/env bash
# Builds a Debian bookworm ARM userland in which the boards' PS-side Python runs under qemu-user:
#
#   armhf  the ZedBoard's Cortex-A9 (32-bit ARM: NumPy's default integer is int32)
#   arm64  the Ultra96-V2's Cortex-A53
#
#   scripts/arm-userland.sh ARCH     # prints the root's path (last line of stdout)
#
# The root is built once into the cache, ${INSITU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/insitu},
# as arm-userland/ARCH (in a temporary folder beside it, renamed when complete); a second run only
# says where it is. A root built by another version of this script is rebuilt.
# It holds Debian's python3 (3.11), python3-numpy, -scipy, -cffi, -distutils, -setuptools and
# -ipython, and in /opt/insitu-site the pure-Python packages of insitu's board path from PyPI
# (pynq 3.0.1 and pynqmetadata 0.1.2 as on the board images; click, rich, ... at the host venv's
# versions). insitu itself is not in it: tests/system/arm_userland.py puts the working tree's
# wheel on PYTHONPATH at run time, so the cached root never holds stale insitu code.
#
# No binfmt_misc and no chroot: `debootstrap --foreign` only downloads and unpacks the base, the
# other packages are unpacked with dpkg-deb and tar (no maintainer script runs; what the
# interpreter needs of them is redone here), and the interpreter runs as
#
#   qemu-arm-static -L ROOT -cpu cortex-a9 ROOT/usr/bin/python3 ...      (arm64: qemu-aarch64-static,
#                                                                         -cpu cortex-a53)
#
# -L makes the loader find the root's libraries; paths the root lacks (the project tree,
# /usr/share/datasets, $HOME, /tmp) are the host's. Needs root (debootstrap) and the network
# (Debian's mirror, PyPI) for the build only.
#
#   INSITU_DEBIAN_MIRROR   the Debian mirror (default: the one apt uses here, /etc/apt/sources*)
#   INSITU_VENV            the venv whose pip fetches the PyPI packages and whose versions are
#                          pinned (default: .venv in the project root)
set -euo pipefail

say() { printf '[arm-userland] %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

arch="${1:-}"
case "$arch" in
    armhf) qemu=qemu-arm-static;     cpu=cortex-a9;  triplet=arm-linux-gnueabihf; machine=armv7l ;;
    arm64) qemu=qemu-aarch64-static; cpu=cortex-a53; triplet=aarch64-linux-gnu;   machine=aarch64 ;;
    *) die "usage: $0 armhf|arm64" ;;
esac

project="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${INSITU_VENV:-$project/.venv}"
cache="${INSITU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/insitu}/arm-userland"
dest="$cache/$arch"
suite=bookworm
# scipy: the LRT board path (lrt/online.py imports scipy.ndimage), as on the board images.
# cffi, distutils, setuptools, ipython: pynq's import chain (pynq.pmbus, pynqutils, pynqmetadata's
# visualisations); ply: pycparser's, a virtual dependency that debootstrap does not resolve.
debs=python3,python3-numpy,python3-scipy,python3-cffi,python3-distutils,python3-setuptools
debs+=,python3-ipython,python3-ply
# More of pynq's import chain: pynqutils imports tqdm, pynqmetadata needs pydantic 1.x.
pinned_wheels=(pynqmetadata==0.1.2 pydantic==1.10.27)
pinned_sources=(pynq==3.0.1 pynqutils==0.1.1)          # source releases only
pinned=("${pinned_wheels[@]}" "${pinned_sources[@]}")
# insitu's own pure-Python dependencies on the board path, at the host venv's versions.
from_venv=(click rich markdown-it-py mdurl pygments tomli-w threadpoolctl typing-extensions
           nest-asyncio tqdm)

python="$venv/bin/python"
[ -x "$python" ] || python=python3
versions=()
for name in "${from_venv[@]}"; do
    v="$("$python" -c 'import sys, importlib.metadata as m; print(m.version(sys.argv[1]))' "$name" 2>/dev/null)" \
        || die "$name is not installed in $venv (run scripts/setup.sh first)"
    versions+=("$name==$v")
done

# Debian's qemu-user-static (which runs a root) and debootstrap (which builds one), if missing.
install_tools() {
    local need=()
    command -v "$qemu" >/dev/null 2>&1 || need+=(qemu-user-static)
    [ "$1" = run ] || command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
    [ ${#need[@]} -gt 0 ] || return 0
    [ "$(id -u)" -eq 0 ] || die "need root to apt-get install ${need[*]}"
    say "installing Debian packages: ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
}

# The stamp: this script and the package versions; a root with another stamp is rebuilt.
stamp="$( { cat "${BASH_SOURCE[0]}"; printf '%s\n' "${pinned[@]}" "${versions[@]}"; } | sha256sum | cut -d' ' -f1)"
cached() { [ -f "$dest/.insitu-userland" ] && [ "$(cat "$dest/.insitu-userland")" = "$stamp" ]; }
if cached; then
    install_tools run          # a cache restored onto a fresh machine
    say "cached: $dest"
    echo "$dest"
    exit 0
fi

[ "$(id -u)" -eq 0 ] || die "building the $arch root needs root (debootstrap); none is cached at $dest"
install_tools build

mirror="${INSITU_DEBIAN_MIRROR:-}"
if [ -z "$mirror" ]; then
    # deb822 (.sources: URIs + Suites) or one-line (deb URL SUITE ...) entries carrying $suite.
    mirror="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v s="$suite" '
        /^URIs:/ { uri = $2 } /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s && uri != "") { print uri; exit } }')"
    [ -n "$mirror" ] || mirror="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        awk -v s="$suite" '$1 == "deb" && $3 == s { print $2; exit }')"
    mirror="${mirror:-http://deb.debian.org/debian}"
fi

mkdir -p "$cache"
# One build per architecture at a time (parallel test workers); a build that was waiting finds
# the root the other one made.
exec 9>"$cache/.$arch.lock"
flock 9
if cached; then
    say "cached: $dest"
    echo "$dest"
    exit 0
fi
work="$(mktemp -d "$cache/.build-$arch.XXXXXX")"
trap 'rm -rf "$work"' EXIT
root="$work/root"
start=$SECONDS

say "building the Debian $suite $arch userland in $dest (1-2 minutes, once)"
say "debootstrap --foreign: downloading and unpacking the $arch base from $mirror"
debootstrap --arch="$arch" --variant=minbase --foreign --include="$debs" "$suite" "$root" "$mirror" \
    > "$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; die "debootstrap failed"; }

# debootstrap downloads more than the interpreter needs (arm64's python3-scipy depends on
# python3-pythran, which brings gcc and g++: 500 MB), and --exclude does not drop dependencies.
# So only the dependency closure of $debs without $skip is unpacked, read from the Packages index
# the first stage used: the first alternative of each dependency, a virtual one by its provider.
skip=python3-pythran
"$python" - "$root" "$debs" "$skip" > "$work/unpack.txt" <<'EOF' || die "resolving the packages to unpack failed"
import glob, re, sys
root, wanted, skip = sys.argv[1], sys.argv[2].split(","), set(sys.argv[3].split(","))
(index,) = glob.glob(f"{root}/var/lib/apt/lists/*_Packages")
fields, providers = {}, {}
for para in open(index, encoding="utf-8").read().split("\n\n"):
    info = dict(re.findall(r"^([\w-]+): (.*)$", para, re.M))
    if "Package" in info:
        fields.setdefault(info["Package"], info)
        for p in filter(None, re.split(r"\s*,\s*", info.get("Provides", ""))):
            providers.setdefault(p.split()[0], info["Package"])
debpaths = dict(line.split() for line in open(f"{root}/debootstrap/debpaths"))
required = set(open(f"{root}/debootstrap/required").read().split())
done, todo = set(), list(wanted)
while todo:
    name = todo.pop()
    if name in done or name in skip:
        continue
    done.add(name)
    deps = fields[name].get("Pre-Depends", "") + "," + fields[name].get("Depends", "")
    for clause in filter(None, (c.strip() for c in deps.split(","))):
        alternatives = [a.split()[0].split(":")[0] for a in clause.split("|")]
        chosen = next((a for a in alternatives if a in done), None) or next(
            (a if a in fields else providers[a] for a in alternatives if a in fields or a in providers), None)
        if chosen is None:
            sys.exit(f"{name}: nothing in the index satisfies {clause!r}")
        todo.append(chosen)
missing = sorted(p for p in done - required if p not in debpaths)
if missing:
    sys.exit(f"debootstrap did not download {missing}")
print("\n".join(root + debpaths[p] for p in sorted(done - required)))
EOF
say "unpacking $(wc -l < "$work/unpack.txt") packages (and their dependencies) with dpkg-deb"
while read -r deb; do
    # Not `dpkg-deb -x`: its tar replaces the merged-/usr links (/lib -> usr/lib) by directories
    # and the loader's /lib/ld-linux*.so link is lost.
    dpkg-deb --fsys-tarfile "$deb" | tar -x --keep-directory-symlink -C "$root"
done < "$work/unpack.txt"
# The downloads, the Packages index (48 MB) and debootstrap's second stage are not needed.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root/debootstrap"
# What the maintainer scripts would have done and the interpreter needs: the BLAS/LAPACK
# alternatives (libblas3's postinst; numpy links libblas.so.3).
for lib in blas lapack; do
    [ -e "$root/usr/lib/$triplet/$lib/lib$lib.so.3" ] || die "lib$lib.so.3 missing from the $arch root"
    ln -sf "$lib/lib$lib.so.3" "$root/usr/lib/$triplet/lib$lib.so.3"
done
# qemu -L resolves an absolute path inside the root where it exists there: the root must not
# shadow the host's /dev, /proc, /sys, /tmp, /run or $HOME (nothing here is chrooted into).
rm -rf "${root:?}"/{dev,proc,sys,tmp,run,root,home}

say "PyPI packages into /opt/insitu-site: ${pinned[*]}"
say "  ${versions[*]}"
wheels="$work/wheels"
"$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --platform any \
    --python-version 3.11 --implementation py -d "$wheels" "${versions[@]}" "${pinned_wheels[@]}" \
    > "$work/pip-download.log" 2>&1 || { tail -20 "$work/pip-download.log" >&2; die "pip download failed"; }
# pynq and pynqutils are source releases: their wheels are pure Python off the board (pynq's
# setup.py builds its C libraries only when it runs on a Zynq).
"$python" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w "$wheels" \
    "${pinned_sources[@]}" > "$work/pip-wheel.log" 2>&1 \
    || { tail -20 "$work/pip-wheel.log" >&2; die "building pynq's wheel failed"; }
site="$root/opt/insitu-site"
"$python" - "$site" "$wheels"/*.whl <<'EOF'
import sys, zipfile
site, wheels = sys.argv[1], sys.argv[2:]
for wheel in wheels:
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if ".data/" in name.split("/", 1)[0] + "/":
                raise SystemExit(f"{wheel}: has a .data folder ({name}); unzip cannot install it")
            if name.endswith(".so"):
                raise SystemExit(f"{wheel}: has a compiled module ({name})")
        z.extractall(site)
# pynqmetadata 0.1.2 (the board images', on Python 3.10) cannot be imported by Python 3.11, whose
# dataclasses refuse an unhashable default (DFXCore.vlnv = Vlnv(...)); upstream's fix (0.1.9,
# 0.2.0) gives Vlnv a __hash__, backported here.
vlnv = f"{site}/pynqmetadata/models/vlnv.py"
text = open(vlnv).read()
if "__hash__" not in text:
    anchor = "    def dict(self) -> Dict:"
    assert text.count(anchor) == 1, f"{vlnv}: not the pynqmetadata 0.1.2 this patch is for"
    open(vlnv, "w").write(text.replace(anchor, "    def __hash__(self):\n        return hash(self.str)\n\n" + anchor))
EOF
# Relative to dist-packages, so the root can move (it is renamed into place below).
echo "../../../../opt/insitu-site" > "$root/usr/lib/python3/dist-packages/insitu-site.pth"

# The host's Python settings stay out of the guest.
guest=(env -u PYTHONPATH -u PYTHONHOME -u PYTHONSTARTUP PYTHONNOUSERSITE=1
       "$qemu" -L "$root" -cpu "$cpu" "$root/usr/bin/python3")
# No compileall of the whole root (a minute of emulated CPU): the check below imports the board
# path, which writes the bytecode of what it imports; the first run writes the rest it needs.
say "checking the interpreter (and compiling what the board path imports)"
got="$("${guest[@]}" -c '
import platform, numpy as np, scipy.ndimage, cffi, pynq, pynqmetadata, click, rich, tomli_w, threadpoolctl
from pynq.buffer import PynqBuffer
print(platform.machine(), np.__version__, np.array([1, 2]).dtype)')" || die "the $arch interpreter cannot import the board path's packages"
read -r got_machine got_numpy got_int <<<"$got"
[ "$got_machine" = "$machine" ] || die "the interpreter says it runs on $got_machine, not $machine"
say "$got_machine, Python $("${guest[@]}" -c 'import platform; print(platform.python_version())'), numpy $got_numpy, default int $got_int"

echo "$stamp" > "$root/.insitu-userland"
if [ -e "$dest" ]; then
    mv "$dest" "$work/old"          # removed with $work
fi
mv "$root" "$dest"
say "built in $((SECONDS - start)) s: $dest ($(du -sh "$dest" | cut -f1))"
echo "$dest"
