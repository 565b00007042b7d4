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

# 100003 parameters on 2 ranks, ZeRO stage 1 in bf16: shards of 50048 (a
# multiple of 128 elements), padded to 100096. parameter and gradient
# 100096*2 B (bf16, the whole group at stage 1), optimizer states
# 3*50048*4 B (f32 master weights and Adam's moments), workspace 100096*4 B
# (the f32 staging of the initial values and of the added gradients), comm
# buffer (2 + 1)*50048*4 B (the reduction's packed f32 input and its output).
# ReduceScatter's logical bytes are its f32 input, 100096*4; AllGather's the
# bf16 parameters, 100096*2, and the step's 16-byte scalars from each rank.
out=$("$mpirun_sh" 2 "$memwall" demo --params 100003 --device_memory 64MiB 2>&1)
check "host, 2 ranks" "$out" \
  "memwall demo: 2 ranks, host backend with 64.00 MiB per rank, 100003 parameters (50048 per shard)" \
  "step: memwall's engine, ZeRO stage 1, bf16 parameters and gradients, f32 master weights and AdamW" \
  "check: 0 of 100003 gathered parameters differ from the single-process update on some rank" \
  " parameter 195.50 KiB   195.50 KiB" \
  " gradient 195.50 KiB   195.50 KiB" \
  " optimizer_state 586.50 KiB   586.50 KiB" \
  " workspace 391.00 KiB   391.00 KiB" \
  " comm_buffer 586.50 KiB   586.50 KiB" \
  "communication per rank: ReduceScatter 391.00 KiB, AllGather 195.53 KiB"

# 4 ranks: shards of 250112.
out=$("$mpirun_sh" 4 "$memwall" demo --params 1000000 2>&1)
check "host, 4 ranks" "$out" \
  "memwall demo: 4 ranks, host backend with 256.00 MiB per rank, 1000000 parameters (250112 per shard)" \
  "check: 0 of 1000000 gathered parameters differ"

# Meta: a 1.5B-parameter step of 2 simulated ranks in 32 GiB per rank, no
# bytes touched (one process: meta moves no bytes between real ranks).
out=$("$memwall" demo --backend meta --device_memory 32GiB --params 1.5e9 --simulate_ranks 2 2>&1)
check "meta, 2 simulated ranks" "$out" \
  "memwall demo: 2 ranks (simulated: rank 0's books), meta backend with 32.00 GiB per rank, 1500000000 parameters (750000000 per shard)" \
  "check: skipped on meta" \
  " parameter 2.79 GiB" \
  " optimizer_state 8.38 GiB"
out=$("$mpirun_sh" 2 "$memwall" demo --backend meta 2>&1)
check "meta on two real ranks" "$out" \
  "memwall: INVALID_ARGUMENT: --backend meta: run one process and set --simulate_ranks to the world it plays"
out=$("$memwall" demo --simulate_ranks 2 2>&1)
check "--simulate_ranks without meta" "$out" \
  "memwall: --simulate_ranks applies to 'demo' with --backend meta only"

# Out of memory is a report, not a crash: 8M parameters' bf16 copy and
# gradients (16 MiB each) fit 40 MiB, their f32 master weights do not.
out=$("$mpirun_sh" 1 "$memwall" demo --device_memory 40MiB 2>&1)
check "out of memory" "$out" \
  "memwall: RESOURCE_EXHAUSTED: out of memory on host:0: cannot allocate 32.00 MiB (33554432 bytes) of optimizer_state for 'toy.master'" \
  "exceed the capacity of 40.00 MiB (32.00 MiB reserved)" \
  "Largest owners: 'toy' (parameter) 16.00 MiB, 'toy.grad' (gradient) 16.00 MiB" \
  "It happened while allocating the model states."

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
