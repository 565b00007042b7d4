#!/usr/bin/env bash
# `memwall tune-aio` end to end: the settings it sweeps for a small slot,
# the fastest update's settings printed and written as an "aio" block that
# memwall's config accepts, and bad input named.
# Usage (from Bazel): tune_aio_test.sh MEMWALL_BINARY
set -u
memwall=$1
tmp=${TEST_TMPDIR:-/tmp}
source "$(dirname "$0")/check.sh"

# 8 MiB through 4 buffers: the settings whose 4 chunks fit, by chunk size.
out=$("$memwall" tune-aio --dir "$tmp" --bytes 8MiB --repeats 1 --out "$tmp/aio.json" 2>&1)
rc=$?
[ $rc -eq 0 ] && pass || fail "tune-aio exited with status $rc: $out"
check "header" "$out" "memwall tune-aio: $tmp, a slot of 8.00 MiB through 4 buffers, best of 1"
# block depth threads per row, in order (the sizes are FormatBytes's).
rows=$(awk '/^ +block/ { on = 1; next } /^fastest/ { on = 0 } on { print $1 $2, $3, $4, $5 $6 }' <<<"$out")
want="128.00KiB 1 1 128.00KiB
128.00KiB 1 2 256.00KiB
128.00KiB 4 1 512.00KiB
512.00KiB 1 1 512.00KiB
128.00KiB 4 2 1.00MiB
128.00KiB 8 1 1.00MiB
512.00KiB 1 2 1.00MiB
1.00MiB 1 1 1.00MiB
128.00KiB 8 2 2.00MiB
512.00KiB 4 1 2.00MiB
1.00MiB 1 2 2.00MiB"
[ "$rows" = "$want" ] && pass || fail "swept settings: got
$rows"
# The printed choice is a row with the fastest update (memwall compares
# the unrounded rates: any row printing the fastest figure may be it), and
# the file holds it.
table=$(awk '/^ +block/ { on = 1; next } /^fastest/ { on = 0 }
  on { print $1 * ($2 == "MiB" ? 1048576 : 1024), $3, $4, $9 }' <<<"$out")
block=$(python3 - "$tmp/aio.json" "$table" <<'PY') && pass || fail "aio.json: $(cat "$tmp/aio.json")"
import json, sys
aio = json.load(open(sys.argv[1]))["aio"]
rows = [line.split() for line in sys.argv[2].splitlines()]
best = max(float(r[3]) for r in rows)
fastest = [{"block_size": int(r[0]), "queue_depth": int(r[1]), "thread_count": int(r[2]),
            "single_submit": False, "overlap_events": True}
           for r in rows if float(r[3]) == best]
print(aio["block_size"])
sys.exit(0 if aio in fastest else 1)
PY
check "the choice printed" "$out" "fastest update: " "\"block_size\": $block," "written to $tmp/aio.json"
# The measurement's file is gone.
ls "$tmp"/memwall-aio-*.bin > /dev/null 2>&1 && fail "a memwall-aio file is left in $tmp" || pass
# Interrupted mid-sweep (Ctrl-C), or killed, it leaves no file behind: the
# measured file never has a name past its creation.
mkdir -p "$tmp/interrupted"
for signal in INT KILL; do
  "$memwall" tune-aio --dir "$tmp/interrupted" --bytes 64MiB --repeats 8 > "$tmp/sweep.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do  # until the sweep is under way: its first row
    grep -q "^ *128.00 KiB" "$tmp/sweep.log" && break
    sleep 0.1
  done
  kill -"$signal" "$pid"
  wait "$pid" 2>/dev/null
  [ -z "$(ls -A "$tmp/interrupted")" ] && pass ||
    fail "tune-aio ended by SIG$signal left: $(ls -A "$tmp/interrupted")"
done
# memwall reads the block as a config (a plan with the NVMe tier using it).
cat > "$tmp/nvme.json" <<JSON
{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "$tmp"}},
 "aio": $(python3 -c "import json; print(json.dumps(json.load(open('$tmp/aio.json'))['aio']))")}
JSON
out=$("$memwall" plan --model gpt-tiny --config "$tmp/nvme.json" --nvme 1GiB 2>&1)
check "the block in a config" "$out" "fits: yes"

# Bad input names the flag or the path.
out=$("$memwall" tune-aio 2>&1); rc=$?
check "no --dir" "$out" "memwall: tune-aio: expected --dir DIR (a directory on the disk to measure)"
[ $rc -eq 2 ] && pass || fail "no --dir: exit status $rc, expected 2"
out=$("$memwall" tune-aio --dir /nonexistent/memwall --bytes 8MiB 2>&1); rc=$?
check "missing directory" "$out" \
  "NVMe store /nonexistent/memwall: cannot use the directory: No such file or directory"
[ $rc -eq 1 ] && pass || fail "missing directory: exit status $rc, expected 1"
out=$("$memwall" tune-aio --dir "$tmp" --bytes 256KiB 2>&1)
check "too small" "$out" \
  "--bytes: expected a multiple of 128 KiB (the smallest setting's chunk), at least 4 of them, got 262144"
out=$("$memwall" tune-aio --dir "$tmp" --bytes 1000000 --buffer_count 2 2>&1)
check "not a multiple" "$out" \
  "--bytes: expected a multiple of 128 KiB (the smallest setting's chunk), at least 2 of them, got 1000000"
out=$("$memwall" tune-aio --dir "$tmp" --buffer_count 0 2>&1)
check "no buffers" "$out" "--buffer_count: expected at least 1, got 0"
out=$("$memwall" tune-aio --dir "$tmp" --repeats 0 2>&1)
check "no runs" "$out" "--repeats: expected at least 1, got 0"
out=$("$memwall" tune-aio --dir "$tmp" --bytes 8Mb 2>&1)
check "bad size" "$out" "--bytes: expected a byte size such as 256MiB, 32GiB or 32GB, got '8Mb'"
out=$("$memwall" tune-aio --dir "$tmp" --params 5 2>&1)
check "a flag of another command" "$out" "--params does not apply to 'tune-aio' (it is read by demo)"

report
