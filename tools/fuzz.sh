#!/usr/bin/env bash
# Builds memwall's libFuzzer targets (tests/fuzz/) with clang and runs each
# for a bounded time on its corpus, keeping what it finds:
#   tools/fuzz.sh [SECONDS_PER_TARGET]   (default 60)
# New coverage-increasing inputs land in tests/fuzz/corpus/<target>/ (commit
# the useful ones: tests/fuzz:corpus_test replays them in every build); a
# crash stops the run with the input saved as crash-* in the current
# directory: fix it, then add the input to the corpus as a regression test.
# Clang and libFuzzer come from Debian (clang, libfuzzer-14-dev); the build
# uses its own Bazel output base, so the gcc build's cache stays as it was.
set -euo pipefail
seconds=${1:-60}
cd "$(dirname "$0")/.."
for p in clang libfuzzer-14-dev zlib1g-dev; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "$p"
  fi
done
bash tools/install_deps.sh
targets=(config model_spec checkpoint)
fuzz_bazel() {  # no bazel-* symlinks: they belong to the gcc build
  CC=clang CXX=clang++ bazel --output_base="$HOME/.cache/memwall-fuzz" "$1" --config=fuzz \
    --symlink_prefix=/ "${@:2}"
}
fuzz_bazel build $(printf '//tests/fuzz:fuzz_%s ' "${targets[@]}")
bin=$(fuzz_bazel info bazel-bin 2>/dev/null)
for t in "${targets[@]}"; do
  mkdir -p "tests/fuzz/corpus/$t"
  echo "fuzzing $t for ${seconds}s"
  "$bin/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -print_final_stats=1 \
    -rss_limit_mb=2048 "tests/fuzz/corpus/$t" 2>&1 | grep -E "^stat::(number_of_executed_units|average_exec_per_sec)|^#.*DONE|ERROR|SUMMARY" || true
done
