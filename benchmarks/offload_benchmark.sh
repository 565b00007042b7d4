#!/usr/bin/env bash
# ZeRO-Offload on the host backend: tokens/s and the device's peak
# parameter, gradient and optimizer-state bytes of `memwall train` with the optimizer
# states in the pinned pool (stage 2, ratio 1 and 0.5) or in a file on the
# local disk (the NVMe tier, here whatever disk holds $TMPDIR), and with
# parameter paging on top (stage 3), each against the same stage without
# offload, measured in the same invocation. bf16, AdamW.
#
#   bazel build //cli:memwall && benchmarks/offload_benchmark.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
memwall=bazel-bin/cli/memwall
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() {  # run RANKS MODEL MICRO STAGE OFFLOAD_JSON -> "tok/s, param P, grad G, optim O"
  cat > "$tmp/c.json" <<JSON
{"train_micro_batch_size_per_gpu": $3, "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
 "zero_optimization": {"stage": $4, "reduce_bucket_size": 2000000$5}}
JSON
  local out
  out=$(tools/mpirun.sh "$1" "$memwall" train --model "$2" --config "$tmp/c.json" \
        --steps "$steps" --log_every "$steps" --device_memory 4GiB 2>&1)
  printf '%s tok/s, param %s, grad %s, optim %s' \
    "$(sed -nE 's/^summary: .* ([0-9]+) tokens\/s.*/\1/p' <<<"$out")" \
    "$(grep -oE 'parameter [0-9.]+ [KMG]?i?B' <<<"$out" | tail -n 1 | cut -d' ' -f2-)" \
    "$(grep -oE 'gradient [0-9.]+ [KMG]?i?B' <<<"$out" | tail -n 1 | cut -d' ' -f2-)" \
    "$(grep -oE 'optimizer_state [0-9.]+ [KMG]?i?B' <<<"$out" | tail -n 1 | cut -d' ' -f2-)"
}
optimizer=', "offload_optimizer": {"device": "cpu"}'
half=', "offload_optimizer": {"device": "cpu", "ratio": 0.5}'
paging="$optimizer"', "offload_param": {"device": "cpu"}'
mkdir -p "$tmp/nvme"
nvme=', "offload_optimizer": {"device": "nvme", "nvme_path": "'"$tmp/nvme"'"}'
echo "offload_benchmark: $steps steps each, host backend, bf16, AdamW; $(nproc) cores"
for spec in "gpt-tiny:8" "gpt2-124m:layers=2,seq=256:2"; do
  model=${spec%:*}
  micro=${spec##*:}
  for ranks in 1 2; do
    echo "$model, $ranks rank(s), peaks per rank:"
    echo "  stage 2, no offload:          $(run "$ranks" "$model" "$micro" 2 "")"
    echo "  stage 2, optimizer offload:   $(run "$ranks" "$model" "$micro" 2 "$optimizer")"
    echo "  stage 2, offload ratio 0.5:   $(run "$ranks" "$model" "$micro" 2 "$half")"
    echo "  stage 2, optimizer on NVMe:   $(run "$ranks" "$model" "$micro" 2 "$nvme")"
    echo "  stage 3, no offload:          $(run "$ranks" "$model" "$micro" 3 "")"
    echo "  stage 3, optimizer + params:  $(run "$ranks" "$model" "$micro" 3 "$paging")"
  done
done
