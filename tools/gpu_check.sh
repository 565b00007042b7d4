#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds memwall with CUDA and runs the
# tests that need a GPU (the cuda backend, the CUDA kernel twins against the
# CPU kernels, NCCL), uncached, with their full output, then the whole test
# suite. Needs the same Debian packages as tools/test.sh (installed if
# missing and a package mirror is reachable) and the CUDA toolkit under
# /usr/local/cuda.
set -uo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh --tests || exit 1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "memwall gpu_check: $gpus GPU(s)"
bazel test --cache_test_results=no --test_output=all //tests/cuda/... 2>&1 |
  grep -vE "^(Loading|Analyzing|\[[0-9,]+ / [0-9,]+\])"
rc=${PIPESTATUS[0]}
if grep -rh "^skipped: no GPU" bazel-testlogs/tests/cuda/*/test.log >/dev/null 2>&1; then
  echo "memwall gpu_check: the GPU tests saw no GPU" >&2
  rc=1
fi
tools/test.sh || rc=1
exit $rc
