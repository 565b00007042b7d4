# Shared by the CLI shell tests: counts checks and reports them the way the
# test runner reads ("memwall-tests: N passed, N failed"). Sourced.
passed=0 failed=0
pass() { passed=$((passed + 1)); }
fail() { echo "FAILED: $*" >&2; failed=$((failed + 1)); }
check() {  # check NAME OUTPUT EXPECTED_SUBSTRING...
  local name=$1 output=$2 ok=1
  shift 2
  for want in "$@"; do
    if ! grep -qF -- "$want" <<<"$output"; then
      echo "FAILED: $name: output lacks: $want" >&2
      ok=0
    fi
  done
  if [ $ok -eq 1 ]; then pass; else failed=$((failed + 1)); echo "$output" >&2; fi
}
report() {
  echo "memwall-tests: $passed passed, $failed failed"
  [ $failed -eq 0 ]
}
