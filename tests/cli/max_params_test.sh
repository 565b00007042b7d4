#!/usr/bin/env bash
# `memwall max-params` end to end on a small family: the largest size, the
# config written, `memwall plan` agreeing that it fits and that the next
# size up does not; JSON; bad input named.
# Usage (from Bazel): max_params_test.sh MEMWALL_BINARY
set -u
memwall=$1
tmp=${TEST_TMPDIR:-/tmp}
source "$(dirname "$0")/check.sh"

# 1.15 GiB a GPU: 150 MiB besides the CUDA runtime's 1 GiB; no offload.
machine="--device_memory 1200MiB --host_memory 0 --nvme 0"
out=$("$memwall" max-params --model gpt:seq=64,vocab=256 $machine --out "$tmp/chosen.json" 2>&1)
rc=$?
[ $rc -eq 0 ] && pass || fail "max-params exited with status $rc: $out"
check "header" "$out" "memwall max-params: GPT, hidden = 128 x heads = 128 x layers, seq 64, vocab 256; 1 GPU of 1.17 GiB, host 0 B and NVMe 0 B per GPU; bf16 AdamW, micro-batch 1"
check "strategy" "$out" "strategy: stage 3, recomputation optimal"
check "written" "$out" "written to $tmp/chosen.json"
model=$(sed -n 's/^largest: .* parameters, --model //p' <<<"$out")
next=$(sed -n 's/^next size up: \([^ ]*\) .*/\1/p' <<<"$out")
[ -n "$model" ] && [ -n "$next" ] && pass || fail "no model or next size in: $out"
# The answer checked by plan: the model fits under the config written, the
# next size up does not.
plan=$("$memwall" plan --model "$model" $machine --config "$tmp/chosen.json" 2>&1)
check "plan: it fits" "$plan" "fits: yes"
plan=$("$memwall" plan --model "$next" $machine --config "$tmp/chosen.json" 2>&1)
check "plan: the next size up does not" "$plan" "fits: no ("
check "the plan command printed" "$out" \
  "plan it: memwall plan --model $model --gpus 1 --device_memory 1200MiB --host_memory 0 --nvme 0 --config $tmp/chosen.json"

# JSON, the same answer.
out=$("$memwall" max-params --model gpt:seq=64,vocab=256 $machine --json 2>/dev/null)
check "json" "$out" '"schema": "memwall.max-params/1"' "\"model\": \"$model\"" '"fits": true'

# --out is checked before the search: an existing file only with --force.
out=$("$memwall" max-params --model gpt:seq=64,vocab=256 $machine --out "$tmp/chosen.json" 2>&1)
check "existing --out" "$out" "--out $tmp/chosen.json: exists; pass --force to replace it"
out=$("$memwall" max-params --model gpt:hidden=4096 2>&1)
check "a searched key" "$out" \
  "--model gpt:hidden=4096: key 'hidden' is not fixed in a family (hidden and heads grow with the size; fixed keys: seq, vocab, layers)"
out=$("$memwall" max-params --model gpt:seq=64 --device_memory 1GiB 2>&1)
check "nothing fits" "$out" "largest: none: the smallest, gpt:layers=1,hidden=128,heads=1,seq=64" \
  "fits: no (device memory by "
out=$("$memwall" max-params --steps 3 2>&1)
check "a flag it does not read" "$out" "--steps does not apply to 'max-params'"
report
