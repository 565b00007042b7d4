#!/usr/bin/env bash
# Runs on a GPU machine from the archive tools/gpu_bundle.sh packs (its
# run.sh unpacks it and calls this): first memwall.torch on the GPU (the
# extension built for this machine's python3 by gpu_python.sh, then
# tests/python/test_cuda.py and benchmarks/torch_cuda.py, their output
# under $OUT), then every GPU test, then `memwall train` on cuda timed
# with the optimizer on the GPU and offloaded to the CPU, with and without
# the update overlapping backward. Settings from the environment: MODEL,
# STEPS, CPU_THREADS, BUCKET (reduce_bucket_size), DEVICE_MEMORY (default:
# the engine's, the GPU's free memory less 1 GiB), OFFLOAD_ONLY, PYTHON
# (default python3), OUT (default /tmp/memwall-gpu-out). Exit status 1 if a
# test failed or saw no GPU.
#   --python-only   memwall.torch's part only
#   --largest       the extension, then benchmarks/torch_cuda.py --largest
#                   (the largest GPT-2-shaped model, predicted and tried)
#   --cpu           memwall.torch's part rehearsed on a machine without a
#                   GPU: the tests and the benchmark on the host backend
#                   (CPU mode); --cpu --largest the same for --largest
#   --mpi-only      skips memwall.torch and the tests that need no MPI
#   --train-only    `memwall train` only
b=$(cd "$(dirname "$0")" && pwd)
mode=${1:-}
largest=""
[ "${2:-}" = --largest ] || [ "$mode" = --largest ] && largest=yes
[ "$mode" = --largest ] && mode=--python-only
# Open MPI's trees go where Debian's build looks for them, replacing any
# other build's there (their components must match the bundle's libraries,
# which stay in the bundle); a rehearsal has Debian's own there.
[ "$mode" = --cpu ] || cp -rf "$b/root/." /
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' \
  2>/dev/null)
export LD_LIBRARY_PATH=$b/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${nccl:+$nccl:}${LD_LIBRARY_PATH:-}
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_hwloc_base_binding_policy=none OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
mpirun=(/usr/bin/orterun --allow-run-as-root --oversubscribe)
# A Python process that initialises MPI as root (its singleton rank).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ "$mode" = --cpu ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "host: $(nproc) CPUs, $(awk '/MemTotal/ {print $2 / 1048576 " GiB"}' /proc/meminfo)"
rc=0
out=${OUT:-/tmp/memwall-gpu-out}
mkdir -p "$out"
py=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')
# memwall.torch: the extension for this python, the CUDA tests (-s: their
# figures), the benchmark.
torch_part() {
  local device=cuda cpu=()
  [ "$mode" = --cpu ] && device=cpu cpu=(--cpu)
  echo "== memwall.torch: the extension for $("$py" -V 2>&1)"
  if ! PYTHON=$py bash "$b/gpu_python.sh" "$b/py" "$b/lib" > "$out/extension.txt" 2>&1; then
    tail -n 20 "$out/extension.txt"
    rc=1
    return
  fi
  tail -n 1 "$out/extension.txt"
  if [ -n "$largest" ]; then
    echo "== memwall.torch: benchmarks/torch_cuda.py --largest on $device"
    PYTHONPATH="$b/py/package" timeout 420 "$py" "$b/py/benchmarks/torch_cuda.py" --largest \
      "${cpu[@]}" --json "$out/largest.json" 2>&1 | grep -v '^\[transformers\]' |
      tee "$out/largest.txt" | tail -n 14
    [ -s "$out/largest.json" ] || rc=1
    return
  fi
  echo "== memwall.torch: tests/python/test_cuda.py on $device"
  (cd "$b/py" && MEMWALL_TEST_DEVICE=$device PYTHONPATH="$b/py/package" timeout 240 \
     "$py" -m pytest -q -s -rs -p no:cacheprovider tests/python/test_cuda.py) \
    > "$out/test_cuda.txt" 2>&1 || rc=1
  grep -E "passed|failed|^FAILED|^ERROR|profile peak|planned|SKIPPED" "$out/test_cuda.txt" | tail -n 25
  echo "== memwall.torch: benchmarks/torch_cuda.py on $device"
  PYTHONPATH="$b/py/package" timeout 180 "$py" "$b/py/benchmarks/torch_cuda.py" "${cpu[@]}" \
    --json "$out/torch_cuda.json" 2>&1 | grep -v '^\[transformers\]' | tee "$out/torch_cuda.txt" |
    tail -n 12
  [ -s "$out/torch_cuda.json" ] || rc=1
}
case $mode in
  "" | --python-only | --cpu) torch_part ;;
esac
[ "$mode" = --python-only ] || [ "$mode" = --cpu ] && exit $rc
check() {  # check NAME COMMAND...: runs a test binary, keeps its summary
  local name=$1 out
  shift
  out=$(timeout 300 "$@" --durations yes 2>&1) || rc=1
  grep -q "^skipped: no GPU" <<<"$out" && rc=1
  echo "== $name"
  if grep -q "^memwall-tests" <<<"$out"; then
    echo "$out" | grep -E "^[0-9.]+ s: |FAILED|failed|error|^memwall-tests" | head -40
  else
    echo "$out" | tail -n 15
  fi
}
if [ "${1:-}" = "" ]; then
  check cuda_backend_test "$b/bin/cuda_backend_test"
  check nn_cuda_test "$b/bin/nn_cuda_test"
fi
# One GPU: one rank (NCCL refuses two ranks on one device).
if [ "${1:-}" != --train-only ]; then
  for t in nccl_test sharded_optimizer_cuda_test trainer_cuda_test; do
    check "$t (1 rank)" "${mpirun[@]}" -np 1 "$b/bin/${t}_bin"
  done
fi
# The step with the optimizer on the GPU against the offloaded step, the
# same model, batch and seed; the throughput of the last logged steps.
cfg=$(mktemp -d)
train() {  # train LABEL OFFLOAD(none|cpu) OVERLAP(true|false)
  local label=$1 offload=$2 overlap=$3 threads="" bucket=""
  [ -n "${CPU_THREADS:-}" ] && threads=", \"cpu_threads\": $CPU_THREADS"
  # Overlap needs several groups (the default bucket, 5e8, makes GPT-2 one).
  [ -n "${BUCKET:-}" ] && bucket=" \"reduce_bucket_size\": $BUCKET,"
  cat > "$cfg/$label.json" <<JSON
{"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 2,$bucket
   "offload_optimizer": {"device": "$offload", "overlap_step": $overlap$threads}}}
JSON
  [ "$offload" = none ] && sed -i 's/, "overlap_step": [a-z]*\(, "cpu_threads": [0-9]*\)\?//' "$cfg/$label.json"
  echo "== memwall train: $label"
  timeout 75 "${mpirun[@]}" -np 1 "$b/bin/memwall" train --backend cuda --model "${MODEL:-gpt2-124m}" \
    ${DEVICE_MEMORY:+--device_memory "$DEVICE_MEMORY"} --config "$cfg/$label.json" --steps "${STEPS:-8}" --log_every 2 2>&1 |
    grep -E "^memwall train|step [0-9]+/|tokens/s|error|memwall:" | tail -n 6
}
[ -z "${OFFLOAD_ONLY:-}" ] && train on-gpu none false
train offload cpu false
train offload-overlap cpu true
exit $rc
