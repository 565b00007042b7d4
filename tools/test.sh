#!/usr/bin/env bash
# Runs every memwall test: installs what is missing, builds, then `bazel test //...`
# (single-process Catch2 tests, multi-rank tests under mpirun -np 1/2/4, the
# command-line tests; GPU tests report "skipped" without a GPU), then the
# Python front end's tests under pytest in the project virtual environment
# (tools/python_env.sh makes it: torch, transformers and pytest from PyPI).
# Ends with one line "N passed, N failed, N skipped" counting test cases:
# the "memwall-tests:" line each test binary prints plus pytest's counts; a
# test target that failed without printing one counts as one failed case.
# Exits non-zero if anything failed. Extra arguments go to `bazel test`.
set -uo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh --tests || exit 1
. tools/bazel_config.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Everything is built before any test starts: on a 2-core machine a test
# that starts MPI ranks beside the compiler can run past its timeout. (A
# build error shows again in `bazel test`, which counts what it stops.)
bazel build "${memwall_bazel_flags[@]}" //... 2>&1 |
  grep -vE "^(Loading|Analyzing|\[[0-9,]+ / [0-9,]+\])"
bazel test "${memwall_bazel_flags[@]}" --test_summary=short "$@" //... 2>&1 | tee "$log" |
  grep -vE "^(Loading|Analyzing|\[[0-9,]+ / [0-9,]+\])"
bazel_rc=${PIPESTATUS[0]}

passed=0 failed=0 skipped=0
testlogs=$(bazel info "${memwall_bazel_flags[@]}" bazel-testlogs 2>/dev/null)
while read -r target status; do
  path=${target#//}
  path=${path/://}
  line=$(grep -h "^memwall-tests: " "$testlogs/$path/test.log" 2>/dev/null | tail -n 1)
  case "$status" in
    PASSED|FAILED)
      if [ -n "$line" ]; then
        read -r p f s <<<"$(sed -E 's/^memwall-tests: ([0-9]+) passed, ([0-9]+) failed(, ([0-9]+) skipped)?.*/\1 \2 \4/' <<<"$line")"
        passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + ${s:-0}))
        if [ "$status" = FAILED ] && [ "$f" -eq 0 ]; then failed=$((failed + 1)); fi
      elif [ "$status" = FAILED ]; then
        failed=$((failed + 1))
      else
        echo "memwall: $target passed without reporting its test cases" >&2
        failed=$((failed + 1))
      fi ;;
    SKIPPED) skipped=$((skipped + 1)) ;;
    *) failed=$((failed + 1)) ;;  # TIMEOUT, FAILED TO BUILD, NO STATUS, ...
  esac
done < <(sed -nE 's#^(//[^ ]+) +(\(cached\) +)?([A-Z]+).*#\1 \3#p' "$log" | sort -u)

if [ "$bazel_rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "memwall: bazel test exited with $bazel_rc" >&2
  failed=1
fi

# pytest's summary: "12 passed, 1 failed, 2 skipped in 3.21s" (any order).
pytest_rc=1
if python=$(tools/python_env.sh); then
  "$python" -m pytest -q -p no:cacheprovider tests/python 2>&1 | tee "$log"
  pytest_rc=${PIPESTATUS[0]}
  summary=$(grep -E "^=* *[0-9]+ (passed|failed|skipped|error)" "$log" | tail -n 1)
  for kind in passed failed skipped error errors; do
    n=$(grep -oE "[0-9]+ $kind\b" <<<"$summary" | grep -oE "^[0-9]+" || true)
    case "$kind" in
      passed) passed=$((passed + ${n:-0})) ;;
      skipped) skipped=$((skipped + ${n:-0})) ;;
      *) failed=$((failed + ${n:-0})) ;;
    esac
  done
  if [ "$pytest_rc" -ne 0 ] && ! grep -qE "[0-9]+ (failed|errors?)\b" <<<"$summary"; then
    echo "memwall: pytest exited with $pytest_rc" >&2
    failed=$((failed + 1))
  fi
else
  echo "memwall: the Python environment could not be made (tools/python_env.sh)" >&2
  failed=$((failed + 1))
fi

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ] && [ "$bazel_rc" -eq 0 ] && [ "$pytest_rc" -eq 0 ]
