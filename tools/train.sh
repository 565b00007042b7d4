#!/usr/bin/env bash
# memwall's main job on its built-in default: installs what is missing,
# builds the `memwall` command, and trains gpt-tiny with ZeRO stage 2 on 2
# MPI ranks on the host backend for 100 steps, showing the loss fall and the
# device memory by category. Extra arguments go to `memwall train` (see
# `memwall --help`); MEMWALL_RANKS sets the number of ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
. tools/bazel_config.sh
bazel build "${memwall_bazel_flags[@]}" //cli:memwall 2>&1 | grep -vE "^(Loading|Analyzing|INFO:|\[)" || true
test -x bazel-bin/cli/memwall || { echo "memwall: build failed" >&2; exit 1; }
exec tools/mpirun.sh "${MEMWALL_RANKS:-2}" bazel-bin/cli/memwall train "$@"
