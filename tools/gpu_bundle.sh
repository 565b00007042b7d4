#!/usr/bin/env bash
# Packs the GPU tests that need no MPI (the cuda backend, the CUDA kernel
# twins and the NN kernels against the CPU ones, cuBLAS GEMM against
# OpenBLAS) with the shared libraries they load from Debian into DIR
# (default .devbin), for a GPU machine that has the CUDA toolkit and driver
# but neither Bazel nor Debian's packages nor a network. There:
#   DIR/run.sh        runs each test and prints its memwall-tests line
# The MPI-based GPU tests (NCCL, ZeRO and training on cuda against host)
# need an MPI runtime there too: tools/gpu_check.sh runs every GPU test on a
# machine that can build memwall.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.devbin}
tests=(cuda_backend_test nn_cuda_test)
bazel build "${tests[@]/#///tests/cuda:}"
rm -rf "$dir" && mkdir -p "$dir/lib"
for t in "${tests[@]}"; do
  cp -L "bazel-bin/tests/cuda/$t" "$dir/"
  # Debian's libraries it loads (not the C/C++ runtime, not CUDA's).
  ldd "bazel-bin/tests/cuda/$t" | awk '$3 ~ /^\/lib\/x86_64-linux-gnu\// {print $3}' |
    grep -vE '/lib(c|m|stdc\+\+|gcc_s|pthread|dl|rt)\.so' | xargs -r -I{} cp -L {} "$dir/lib/"
done
for lib in "$dir"/lib/libgfortran.so.*; do
  [ -e "$lib" ] || continue
  ldd "$lib" | awk '/quadmath/ {print $3}' | xargs -r -I{} cp -L {} "$dir/lib/"
done
cat > "$dir/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the bundled GPU tests; exit status 1 if one failed or saw no GPU.
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$here/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
rc=0
for t in cuda_backend_test nn_cuda_test; do
  out=$("$here/$t" --durations yes 2>&1) || rc=1
  grep -q "^skipped: no GPU" <<<"$out" && rc=1
  echo "$out" | grep -E "^[0-9.]+ s: |FAILED|^memwall-tests"
done
exit $rc
RUN
chmod +x "$dir/run.sh"
du -sh "$dir"
