#!/usr/bin/env bash
# The `memwall demo` command end to end, on real MPI ranks: exact memory by
# category, the parameter check, the meta backend, and its errors.
# Usage (from Bazel): demo_test.sh MPIRUN_SH MEMWALL_BINARY
set -u
mpirun_sh=$1
memwall=$2
passed=0 failed=0

check() {  # check NAME OUTPUT EXPECTED_SUBSTRING... (runs of spaces compare as one)
  local name=$1 output=$2 ok=1
  shift 2
  local squeezed
  squeezed=$(tr -s ' ' <<<"$output")
  for want in "$@"; do
    if ! grep -qF -- "$(tr -s ' ' <<<"$want")" <<<"$squeezed"; then
      echo "FAILED: $name: output lacks: $want" >&2
      ok=0
    fi
  done
  if [ $ok -eq 1 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "$output" >&2; fi
}

# 100003 parameters on 2 ranks: shards of 50002, padded to 100004.
# parameter 100004*2 B, gradient 100004*4 + 50002*4 B, optimizer states
# 3*50002*4 B, comm buffer 50002*2 B.
out=$("$mpirun_sh" 2 "$memwall" demo --params 100003 --device_memory 64MiB 2>&1)
check "host, 2 ranks" "$out" \
  "memwall demo: 2 ranks, host backend with 64.00 MiB per rank, 100003 parameters (50002 per shard)" \
  "check: 0 of 100003 gathered parameters differ from the single-process update on some rank" \
  " parameter 195.32 KiB   195.32 KiB" \
  " gradient 585.96 KiB   585.96 KiB" \
  " optimizer_state 585.96 KiB   585.96 KiB" \
  " comm_buffer 97.66 KiB    97.66 KiB" \
  "communication per rank: ReduceScatter 390.64 KiB, AllGather 195.32 KiB"

# 4 ranks also divide the model exactly.
out=$("$mpirun_sh" 4 "$memwall" demo --params 1000000 2>&1)
check "host, 4 ranks" "$out" \
  "memwall demo: 4 ranks, host backend with 256.00 MiB per rank, 1000000 parameters (250000 per shard)" \
  "check: 0 of 1000000 gathered parameters differ"

# Meta: a 1.5B-parameter step in 32 GiB per rank, no bytes touched.
out=$("$mpirun_sh" 2 "$memwall" demo --backend meta --device_memory 32GiB --params 1.5e9 2>&1)
check "meta, 2 ranks" "$out" \
  "memwall demo: 2 ranks, meta backend with 32.00 GiB per rank, 1500000000 parameters (750000000 per shard)" \
  "check: skipped on meta" \
  " parameter 2.79 GiB     2.79 GiB" \
  " optimizer_state 8.38 GiB     8.38 GiB"

# Out of memory is a report, not a crash.
out=$("$mpirun_sh" 1 "$memwall" demo --device_memory 40MiB 2>&1)
check "out of memory" "$out" \
  "memwall: RESOURCE_EXHAUSTED: out of memory on host:0: cannot allocate 32.00 MiB (33554432 bytes) of gradient for 'toy.weight.grad'" \
  "exceed the capacity of 40.00 MiB (16.00 MiB reserved)" \
  "Largest owners: 'toy.weight' (parameter) 16.00 MiB"

# Bad input names the flag.
out=$("$memwall" demo --device_memory 32gigs 2>&1); rc=$?
check "bad --device_memory" "$out" \
  "memwall: INVALID_ARGUMENT: --device_memory: expected a byte size such as 256MiB, 32GiB or 32GB, got '32gigs'"
[ $rc -eq 1 ] || { echo "FAILED: bad --device_memory exits $rc, want 1" >&2; failed=$((failed + 1)); }
out=$("$memwall" demo --backend tpu 2>&1)
check "bad --backend" "$out" "backend: expected one of host, meta, cuda; got 'tpu'"
out=$("$memwall" demo --params 2.5 2>&1)
check "bad --params" "$out" "--params: expected a whole number of parameters between 1 and 1e15, got '2.5'"
out=$("$memwall" frobnicate 2>&1); rc=$?
check "unknown command" "$out" "usage:" "memwall demo"
[ $rc -eq 2 ] || { echo "FAILED: unknown command exits $rc, want 2" >&2; failed=$((failed + 1)); }

echo "memwall-tests: $passed passed, $failed failed"
[ $failed -eq 0 ]
