#!/usr/bin/env bash
# The NVMe tier's disk throughput against fio's best on the same file
# system, measured in the same run: fio (installed from Debian if missing;
# libaio, O_DIRECT, one job, --end_fsync for writes as the tier's step
# syncs; best of 3 runs each) swept over block sizes and queue depths,
# then memwall's tier (benchmarks/nvme_benchmark.cc, best of 3 too) at
# DeepSpeed's default aio settings and
# at the fio configuration that did best. Prints each figure in MB/s and
# the tier's share of fio's best.
#
#   bazel build //benchmarks:nvme_benchmark && benchmarks/nvme_benchmark.sh [DIR] [MiB]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-${TMPDIR:-/tmp}}
mib=${2:-1024}
bytes=$((mib * 1048576))
if ! command -v fio > /dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q > /dev/null && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q fio > /dev/null
fi
file="$dir/memwall-fio-$$.bin"
trap 'rm -f "$file"' EXIT
fio_mbps() {  # fio_mbps RW BS DEPTH -> MB/s (decimal), best of 3 as the tier's
  local extra="" best=0 mbps
  [ "$1" = write ] && extra="--end_fsync=1"
  for _ in 1 2 3; do
    mbps=$(fio --name=memwall --filename="$file" --rw="$1" --bs="$2" --iodepth="$3" \
        --size="$bytes" --ioengine=libaio --direct=1 --numjobs=1 --output-format=json $extra \
        2>/dev/null |
      python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; \
d=j['write'] if j['write']['io_bytes'] else j['read']; print(round(d['io_bytes']/(d['runtime']/1e3)/1e6))")
    [ "$mbps" -gt "$best" ] && best=$mbps
  done
  echo "$best"
}
echo "nvme_benchmark: $mib MiB under $dir ($(df -T "$dir" | awk 'NR==2 {print $2}')), $(nproc) cores"
declare -A best=([write]=0 [read]=0) best_at
for rw in write read; do
  for bs in 128k 1m 4m; do
    for depth in 1 8 32; do
      mbps=$(fio_mbps "$rw" "$bs" "$depth")
      echo "  fio $rw bs=$bs iodepth=$depth: $mbps MB/s"
      if [ "$mbps" -gt "${best[$rw]}" ]; then best[$rw]=$mbps; best_at[$rw]="$bs $depth"; fi
    done
  done
done
to_bytes() { case "$1" in 128k) echo 131072 ;; 1m) echo 1048576 ;; 4m) echo 4194304 ;; esac; }
memwall_run() {  # memwall_run BLOCK DEPTH -> "write W read R"
  bazel-bin/benchmarks/nvme_benchmark --dir "$dir" --bytes "$bytes" --block_size "$1" \
    --queue_depth "$2" | awk '/^write|^read/ {printf "%s %s ", $1, $2}'
}
for rw in write read; do
  echo "fio best $rw: ${best[$rw]} MB/s (bs, iodepth: ${best_at[$rw]})"
done
report() {  # report LABEL BLOCK DEPTH
  local out w r
  out=$(memwall_run "$2" "$3")
  w=$(awk '{print $2}' <<<"$out")
  r=$(awk '{print $4}' <<<"$out")
  printf '  memwall %-34s write %5s MB/s (%3s%% of fio best), read %5s MB/s (%3s%%)\n' "$1" \
    "$w" "$((100 * w / best[write]))" "$r" "$((100 * r / best[read]))"
}
report "aio defaults (1 MiB, depth 8):" 1048576 8
read -r wbs wdepth <<<"${best_at[write]}"
report "at fio's best write ($wbs, $wdepth):" "$(to_bytes "$wbs")" "$wdepth"
read -r rbs rdepth <<<"${best_at[read]}"
report "at fio's best read ($rbs, $rdepth):" "$(to_bytes "$rbs")" "$rdepth"
