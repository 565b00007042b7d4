#!/usr/bin/env bash
# Packs every GPU test (the cuda backend, the CUDA kernel twins and the NN
# kernels against the CPU ones, cuBLAS GEMM against OpenBLAS, NCCL, ZeRO and
# gpt-tiny training on cuda against host), the memwall CLI, and the Debian
# libraries and Open MPI runtime they load, into DIR (default .devbin) as
# one xz archive, for a GPU machine that has the CUDA toolkit, the driver
# and NCCL but neither Bazel nor Debian's packages nor a network. There:
#   DIR/run.sh        unpacks it, runs each test and prints its
#                     memwall-tests line, then times `memwall train` on
#                     cuda with and without optimizer offload
# tools/gpu_check.sh does the same on a machine that can build memwall.
#
# With the Python front end: the extension is linked there for that
# machine's Python (pybind11 modules are built per Python version, and this
# machine's is not the GPU image's): the archive carries the objects
# Bazel compiled for //python:_memwall.so and its link line, the headers
# memwall_module.cc includes (memwall's, Abseil's, nlohmann's, DLPack's,
# Open MPI's), the memwall package and the CUDA tests and benchmark;
# gpu_bundle_run.sh compiles memwall_module.cc with that Python's headers
# and pybind11 and links it as Bazel did (tools/gpu_python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.devbin}
# The MPI tests' binaries are <name>_bin (tests/defs.bzl's mpi_test).
tests=(cuda_backend_test nn_cuda_test nccl_test_bin sharded_optimizer_cuda_test_bin
  trainer_cuda_test_bin)
. tools/bazel_config.sh
bazel build "${memwall_bazel_flags[@]}" "${tests[@]/#///tests/cuda:}" //cli:memwall \
  //python:_memwall.so
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/root"
tools/gpu_python_pack.sh "$stage/py"
# Debian's libraries a file loads (not the C/C++ runtime, nor CUDA's or
# NCCL's, which the GPU machine has in its own versions).
libs_of() {
  ldd "$1" | awk '$3 ~ /^\/(usr\/)?lib\/x86_64-linux-gnu\// {print $3}' |
    grep -vE '/lib(c|m|stdc\+\+|gcc_s|pthread|dl|rt|cuda|cudart|cublas|cublasLt|nccl)\.so' || true
}
for t in "${tests[@]}"; do cp -L "bazel-bin/tests/cuda/$t" "$stage/bin/"; done
cp -L bazel-bin/cli/memwall "$stage/bin/"
# Open MPI's launcher, daemon, components and help texts, at the absolute
# paths Debian's build looks for them (copied there on the GPU machine).
ompi=/usr/lib/x86_64-linux-gnu/openmpi
pmix=/usr/lib/x86_64-linux-gnu/pmix2
for path in /usr/bin/orterun /usr/bin/orted "$ompi/lib/openmpi3" "$pmix" /usr/share/openmpi \
  /usr/share/pmix /etc/openmpi; do
  [ -e "$path" ] || continue
  mkdir -p "$stage/root$(dirname "$path")"
  cp -rL "$path" "$stage/root$(dirname "$path")/"
done
{
  for f in "$stage"/bin/* "$stage"/root/usr/bin/* bazel-bin/python/_memwall.so; do
    libs_of "$f"
  done
  find "$stage/root" -name '*.so*' -type f | while read -r f; do libs_of "$f"; done
} | sort -u | xargs -r -I{} cp -L {} "$stage/lib/"
for lib in "$stage"/lib/*; do libs_of "$lib"; done | sort -u | xargs -r -I{} cp -Ln {} "$stage/lib/"
cp tools/gpu_bundle_run.sh "$stage/run-inside.sh"
cp tools/gpu_python.sh "$stage/"
rm -rf "$dir" && mkdir -p "$dir"
tar -C "$stage" -cf - . | xz -T0 -6 > "$dir/bundle.tar.xz"
cat > "$dir/run.sh" <<'RUN'
#!/usr/bin/env bash
here=$(cd "$(dirname "$0")" && pwd)
rm -rf /tmp/memwall-gpu && mkdir -p /tmp/memwall-gpu
xz -dc "$here/bundle.tar.xz" | tar -C /tmp/memwall-gpu -xf - || exit 1
exec bash /tmp/memwall-gpu/run-inside.sh "$@"
RUN
chmod +x "$dir/run.sh"
du -sh "$dir"
