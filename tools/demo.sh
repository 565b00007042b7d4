#!/usr/bin/env bash
# memwall's main job on its built-in default: installs what is missing,
# builds the `memwall` command, and runs `memwall demo` on 2 MPI ranks on the
# host backend. Extra arguments go to `memwall demo` (see `memwall --help`);
# MEMWALL_RANKS sets the number of ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
. tools/bazel_config.sh
bazel build "${memwall_bazel_flags[@]}" //cli:memwall 2>&1 | grep -vE "^(Loading|Analyzing|INFO:|\[)" || true
test -x bazel-bin/cli/memwall || { echo "memwall: build failed" >&2; exit 1; }
exec tools/mpirun.sh "${MEMWALL_RANKS:-2}" bazel-bin/cli/memwall demo "$@"
