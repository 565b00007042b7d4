#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds memwall with CUDA and runs the
# tests that need a GPU (the cuda backend, the CUDA kernel twins against the
# CPU kernels bit for bit, the NN kernels and cuBLAS GEMM against the CPU
# ones, pinned copies, NCCL, ZeRO on cuda + NCCL against host + MPI, and
# gpt-tiny trained on cuda against host), uncached and with their full
# output, then `memwall train --backend cuda` and the CPU kernel benchmark. Needs the Debian packages of tools/install_deps.sh
# (installed if missing and a package mirror is reachable) and the CUDA
# toolkit under /usr/local/cuda. Exits non-zero if a GPU test failed or saw
# no GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh || exit 1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
echo "memwall gpu_check: $(nvidia-smi -L 2>/dev/null | wc -l) GPU(s)"
bazel test --cache_test_results=no --test_output=all //tests/cuda/... 2>&1 |
  grep -vE "^(Loading|Analyzing|\[[0-9,]+ / [0-9,]+\])"
rc=${PIPESTATUS[0]}
if grep -h "^skipped: no GPU" bazel-testlogs/tests/cuda/*/test.log >/dev/null 2>&1; then
  echo "memwall gpu_check: the GPU tests saw no GPU" >&2
  rc=1
fi
grep -h "^memwall-tests:" bazel-testlogs/tests/cuda/*/test.log
bazel run //cli:memwall -- train --backend cuda --device_memory 8GiB --steps 50 \
  --log_every 25 2>/dev/null | tail -n 8 || rc=1
bazel run //benchmarks:kernels_benchmark 2>/dev/null | tail -n 30
exit $rc
