#!/usr/bin/env bash
# examples/mlp_zero trains on 1, 2 and 4 real ranks at every ZeRO stage: the
# loss falls, every stage gives the same losses, and the per-rank parameter
# bytes shrink as the stage says.
# Usage (from Bazel): mlp_zero_test.sh MPIRUN_SH MLP_ZERO_BINARY
set -u
mpirun_sh=$1
binary=$2
passed=0 failed=0
fail() { echo "FAILED: $*" >&2; failed=$((failed + 1)); }

for ranks in 1 2 4; do
  reference=""
  for stage in 0 1 2 3; do
    out=$("$mpirun_sh" "$ranks" "$binary" --stage "$stage" --steps 60 2>&1)
    rc=$?
    if [ $rc -ne 0 ]; then fail "stage $stage on $ranks ranks exited $rc"; echo "$out" >&2; continue; fi
    losses=$(grep -E "^step" <<<"$out" | awk '{print $4}')
    summary=$(grep -E "^ZeRO stage" <<<"$out")
    if [ -z "$reference" ]; then reference=$losses; fi
    # Two groups of 1088 and 260 f32 elements, each padded to a multiple of
    # 128 * ranks elements; stage 3 keeps 1/N of them.
    params=$(awk '$1 == "0" {print $2}' <<<"$out")
    quantum=$((128 * ranks))
    padded=$(( ((1088 + quantum - 1) / quantum + (260 + quantum - 1) / quantum) * quantum ))
    want=$((4 * padded / (stage == 3 ? ranks : 1)))
    if [ "$losses" != "$reference" ]; then
      fail "stage $stage on $ranks ranks: losses differ from stage 0"
    elif [ "$params" != "$want" ]; then
      fail "stage $stage on $ranks ranks: parameter bytes $params, want $want"
    elif ! grep -q "ZeRO stage $stage on $ranks rank" <<<"$summary"; then
      fail "stage $stage on $ranks ranks: no summary"; echo "$out" >&2
    else
      passed=$((passed + 1))
    fi
  done
done
echo "memwall-tests: $passed passed, $failed failed"
[ $failed -eq 0 ]
