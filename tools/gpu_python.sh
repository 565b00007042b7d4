#!/usr/bin/env bash
# Builds memwall's Python extension from what tools/gpu_python_pack.sh
# packed (in DIR, default: py/ beside this script) for PYTHON (default
# python3): memwall_module.cc compiled with that Python's headers and
# pybind11 as Bazel compiles it, then linked with Bazel's link line; the
# package with the extension goes to DIR/package/memwall. Libraries the
# link line names that this machine has only under a versioned name (the
# bundle's, pip's NVIDIA wheels') are linked through DIR/devlib.
#   PYTHON=python3 tools/gpu_python.sh [DIR] [LIBDIR...]
# LIBDIRs: where else to look for them (the bundle's lib/).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=$(cd "${1:-$here/py}" && pwd)
shift || true
py=$("${PYTHON:-python3}" -c "import sys; print(sys.executable)")
include=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
pybind=$("$py" -c 'import pybind11; print(pybind11.get_include())' 2>/dev/null || echo /usr/include)
[ -f "$include/Python.h" ] || { echo "gpu_python: no Python.h under $include" >&2; exit 1; }
[ -f "$pybind/pybind11/pybind11.h" ] || { echo "gpu_python: no pybind11 for $py" >&2; exit 1; }
# /usr/include is searched already (naming it -isystem breaks #include_next).
pybind_flag=()
[ "$pybind" = /usr/include ] || pybind_flag=(-isystem "$pybind")
cd "$dir/link"
# -include cstdint: GCC 13 (the GPU image's) no longer brings <cstdint> in
# through other standard headers, which headers written against Debian's
# GCC 12 may rely on.
g++ -std=c++17 -include cstdint -O2 -DNDEBUG -fPIC -fexceptions -fvisibility=hidden -ffunction-sections \
  -fdata-sections $(cat defines) -DOMPI_SKIP_MPICXX -I"$dir/src" -isystem "$dir/include" \
  "${pybind_flag[@]}" -isystem "$include" -c "$dir/src/python/memwall_module.cc" \
  -o memwall_module.pic.o
# -lNAME needs libNAME.so; where only libNAME.so.N exists (a runtime-only
# install), a link to it in devlib.
mkdir -p "$dir/devlib"
nvidia=$("$py" -c 'import nvidia, os; print(" ".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p)))' 2>/dev/null || true)
for name in $(grep -oP '^-l\K\S+' link.params); do
  [ -n "$(g++ -print-file-name="lib$name.so" | grep /)" ] && continue
  for d in "$@" /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu $nvidia; do
    found=$(ls "$d/lib$name.so"* 2>/dev/null | head -n 1 || true)
    if [ -n "$found" ]; then ln -sf "$found" "$dir/devlib/lib$name.so"; break; fi
  done
done
linker=()
g++ -fuse-ld=gold -Wl,--version >/dev/null 2>&1 ||
  linker=(-e '/^-fuse-ld=gold$/d' -e '/^-Wl,--start-lib$/d' -e '/^-Wl,--end-lib$/d')
if [ ${#linker[@]} -gt 0 ]; then sed "${linker[@]}" link.params > link.local.params
else cp link.params link.local.params; fi
g++ @link.local.params -L"$dir/devlib" -Wl,-rpath,"$dir/devlib"
install -m 0755 _memwall.so "$dir/package/memwall/_memwall.so"
echo "gpu_python: built $dir/package/memwall/_memwall.so for $("$py" -V 2>&1)"
