#!/usr/bin/env bash
# Packs into DIR what tools/gpu_python.sh needs to build memwall's Python
# extension on a machine without Bazel, for that machine's Python: the
# objects Bazel compiled for //python:_memwall.so (memwall_module.cc's
# own left out) with the link line Bazel used (link/link.params), the
# headers memwall_module.cc includes, memwall_module.cc itself, the memwall
# package, the tests of tests/python/test_cuda.py and the benchmark
# benchmarks/torch_cuda.py. Needs //python:_memwall.so built (the default
# configuration: with CUDA).
#   tools/gpu_python_pack.sh DIR
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1
. tools/bazel_config.sh
params=bazel-bin/python/_memwall.so-2.params
[ -f "$params" ] || { echo "gpu_python_pack: build //python:_memwall.so first" >&2; exit 1; }
exec_root=$(bazel info "${memwall_bazel_flags[@]}" execution_root 2>/dev/null)
mkdir -p "$out/link" "$out/include" "$out/src/python" "$out/package" "$out/tests/python" \
  "$out/benchmarks"
# The link line, with the extension's own object and output at fixed names
# (memwall_module.pic.o: compiled there; _memwall.so: what it makes).
awk 'prev == "-o" {print "_memwall.so"; prev = $0; next}
     /\/memwall_module\.pic\.o$/ {print "memwall_module.pic.o"; prev = $0; next}
     {print; prev = $0}' "$params" > "$out/link/link.params"
# The defines Bazel compiled memwall_module.cc with (CUDA_LOCAL_DEFINES).
if grep -q cudart "$params"; then echo -DMEMWALL_HAS_CUDA=1; fi > "$out/link/defines"
grep -v '^-' "$out/link/link.params" | grep -vx -e _memwall.so -e memwall_module.pic.o |
  while read -r f; do
    mkdir -p "$out/link/$(dirname "$f")"
    cp -L "$exec_root/$f" "$out/link/$f"
  done
for d in absl nlohmann dlpack; do cp -r "/usr/include/$d" "$out/include/"; done
cp -r /usr/lib/x86_64-linux-gnu/openmpi/include/. "$out/include/"
git ls-files '*.h' | tar -cf - -T - | tar -C "$out/src" -xf -
cp python/memwall_module.cc "$out/src/python/"
tar -cf - --exclude='_memwall*.so' --exclude=__pycache__ -C python memwall |
  tar -C "$out/package" -xf -
cp tests/python/conftest.py tests/python/test_cuda.py "$out/tests/python/"
cp benchmarks/torch_cuda.py "$out/benchmarks/"
