#!/usr/bin/env bash
# The NVMe tier's disk throughput against fio's best on the same file
# system, measured in the same run: fio (installed from Debian if missing;
# libaio, O_DIRECT, one job, --end_fsync for writes as the tier's step
# syncs; best of 3 runs each) swept over block sizes and queue depths,
# then memwall's tier (benchmarks/nvme_benchmark.cc: chunks through 4
# pinned buffers, as a step streams them; best of 3 too) at DeepSpeed's
# default aio settings and at the fio configurations that did best. Then
# ROUNDS rounds (default 3) alternate fio at its best configurations and
# the tier at the same settings (DeepSpeed's aio keys set to them: fio's
# best write settings for the tier's write, its best read settings for
# the read and the update), one run each, so that the disk's drift between
# minutes hits both; each round's share of fio, and their median. The tier's update
# (each chunk read, then written back, as the optimizer's step) is set
# against fio's best read and best write of the same bytes one after the
# other. Prints MB/s and shares.
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
fio_mbps() {  # fio_mbps RW BS DEPTH [RUNS] -> MB/s (decimal), best of RUNS (3) as the tier's
  local extra="" best=0 mbps
  [ "$1" = write ] && extra="--end_fsync=1"
  for _ in $(seq 1 "${4:-3}"); do
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
memwall_run() {  # memwall_run BLOCK DEPTH REPEATS -> "W R U" (MB/s: write, read, update)
  bazel-bin/benchmarks/nvme_benchmark --dir "$dir" --bytes "$bytes" --block_size "$1" \
    --queue_depth "$2" --repeats "$3" | awk '/^(write|read|update) / { printf "%s ", $2 }'
}
share() { awk "BEGIN { printf \"%3.0f\", 100 * $1 / $2 }"; }  # share PART WHOLE -> percent
serial() { awk "BEGIN { printf \"%.0f\", 1 / (1 / $1 + 1 / $2) }"; }  # read then write, MB/s
for rw in write read; do
  echo "fio best $rw: ${best[$rw]} MB/s (bs, iodepth: ${best_at[$rw]})"
done
bound=$(serial "${best[read]}" "${best[write]}")
echo "fio best read, then best write, of the same bytes: $bound MB/s"
report() {  # report LABEL BLOCK DEPTH
  local w r u
  read -r w r u <<<"$(memwall_run "$2" "$3" 3)"
  printf '  memwall %-32s write %5s MB/s (%s%%), read %5s MB/s (%s%%), update %5s MB/s (%s%%)\n' \
    "$1" "$w" "$(share "$w" "${best[write]}")" "$r" "$(share "$r" "${best[read]}")" \
    "$u" "$(share "$u" "$bound")"
}
report "aio defaults (1 MiB, depth 8):" 1048576 8
read -r wbs wdepth <<<"${best_at[write]}"
report "at fio's best write ($wbs, $wdepth):" "$(to_bytes "$wbs")" "$wdepth"
read -r rbs rdepth <<<"${best_at[read]}"
report "at fio's best read ($rbs, $rdepth):" "$(to_bytes "$rbs")" "$rdepth"
echo "(shares: of fio's best write, best read, and best read then best write)"
rounds=${ROUNDS:-3}
echo "alternated, $rounds round(s): fio at its best, then the tier at the same settings"
ws=() rs=() us=()
for k in $(seq 1 "$rounds"); do
  fw=$(fio_mbps write "$wbs" "$wdepth" 1)
  read -r w _ _ <<<"$(memwall_run "$(to_bytes "$wbs")" "$wdepth" 1)"
  fr=$(fio_mbps read "$rbs" "$rdepth" 1)
  read -r _ r u <<<"$(memwall_run "$(to_bytes "$rbs")" "$rdepth" 1)"
  ws+=("$(share "$w" "$fw")") rs+=("$(share "$r" "$fr")") us+=("$(share "$u" "$(serial "$fr" "$fw")")")
  printf '  round %d: fio write %5s, read %5s; memwall write %5s (%s%%), read %5s (%s%%), update %5s (%s%%)\n' \
    "$k" "$fw" "$fr" "$w" "${ws[-1]}" "$r" "${rs[-1]}" "$u" "${us[-1]}"
done
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "median shares of fio: write $(median "${ws[@]}")%, read $(median "${rs[@]}")%, update $(median "${us[@]}")%"
