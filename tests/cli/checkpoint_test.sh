#!/usr/bin/env bash
# `memwall train --save/--resume` end to end on real MPI jobs: a run killed
# with SIGKILL mid-way and resumed ends with the same losses and the same
# checkpoint bytes as the run that was never interrupted (host, f32); so
# does one whose rank hung (SIGSTOP), which ends by the collective timeout; a
# checkpoint saved on 4 ranks loads on 2 and back on 4 without losing a
# bit; bad flags and missing checkpoints are named; a --save directory is
# checked before the first step and held against a second run; export
# never overwrites the checkpoint; a damaged newest checkpoint gives way.
# Usage (from Bazel): checkpoint_test.sh MPIRUN_SH MEMWALL_BINARY
set -u
mpirun_sh=$1
memwall=$2
tmp=${TEST_TMPDIR:-/tmp}
source "$(dirname "$0")/check.sh"

# The per-step losses of a run's log: "step N loss".
losses() { sed -nE 's/.* step ([0-9]+)\/[0-9]+ \| loss ([0-9.]+).*/\1 \2/p' <<<"$1"; }
same_files() {  # same_files DIR_A DIR_B: every rank file byte for byte
  local a=$1 b=$2 f
  for f in "$a"/rank-*.safetensors; do
    cmp -s "$f" "$b/$(basename "$f")" || return 1
  done
  [ "$(ls "$a" | grep -c safetensors)" = "$(ls "$b" | grep -c safetensors)" ]
}

# Waits (up to 5 minutes: slow under sanitizers) until DIR holds a
# complete checkpoint of step 20 or later. Not step 20 itself: with
# --keep_checkpoints 2 it lives only 10 steps, on a fast machine less than
# one poll.
wait_for_step_20() {
  local newest
  for _ in $(seq 1 6000); do
    newest=$(ls -d "$1"/step-* 2>/dev/null | sort | tail -1)
    if [ -n "$newest" ] && [ -e "$newest/manifest.json" ] && [ $((10#${newest##*step-})) -ge 20 ]; then
      return
    fi
    sleep 0.05
  done
}

steps=300
# The run that is never interrupted.
ref=$("$mpirun_sh" 2 "$memwall" train --steps $steps --log_every 1 --save "$tmp/ref" 2>&1)
check "uninterrupted run saves" "$ref" "saved $tmp/ref/step-00000300"

# The same run, killed with SIGKILL once a few checkpoints exist.
setsid "$mpirun_sh" 2 "$memwall" train --steps $steps --log_every 1 --save "$tmp/ck" \
  --save_every 5 --keep_checkpoints 2 > "$tmp/killed.log" 2>&1 &
pid=$!
wait_for_step_20 "$tmp/ck"
kill -9 -- -"$pid" 2>/dev/null
wait "$pid" 2>/dev/null
# The ranks go with mpirun, a moment later; until then they hold --save's
# lock, and a run that resumed now would be refused (as it should be).
gone() { for _ in $(seq 1 600); do pgrep -f -- "--save $1" > /dev/null || return 0; sleep 0.1; done; return 1; }
gone "$tmp/ck" || fail "the killed run's ranks still run a minute later"
killed=$(cat "$tmp/killed.log")
if grep -q "saved $tmp/ck/step-00000300" <<<"$killed"; then
  fail "the run finished before it was killed; the test proves nothing"
else
  pass
fi
complete=$(ls "$tmp/ck" | wc -l)
[ "$complete" -le 3 ] && pass || fail "keep_checkpoints 2 left $complete directories: $(ls "$tmp/ck")"

resumed=$("$mpirun_sh" 2 "$memwall" train --steps $steps --log_every 1 --save "$tmp/ck" \
  --save_every 5 --keep_checkpoints 2 --resume "$tmp/ck" 2>&1)
check "resume after kill -9" "$resumed" "resumed from $tmp/ck/step-" "saved $tmp/ck/step-00000300"
from=$(sed -nE 's/resumed from .* at step ([0-9]+)/\1/p' <<<"$resumed")
[ -n "$from" ] && [ "$from" -ge 20 ] && pass || fail "resumed at step '$from', expected >= 20"
# Every step the resumed run took has the uninterrupted run's loss, to the
# printed digit, and the final checkpoints are the same bytes.
want=$(losses "$ref" | awk -v f="$from" '$1 > f')
got=$(losses "$resumed")
[ -n "$got" ] && [ "$want" = "$got" ] && pass || fail "resumed losses differ: $(diff <(echo "$want") <(echo "$got") | head -5)"
same_files "$tmp/ref/step-00000300" "$tmp/ck/step-00000300" && pass ||
  fail "the resumed run's final checkpoint differs from the uninterrupted run's"

# A rank that hangs (SIGSTOP) mid-run: the other gives up after
# --collective_timeout and the whole job ends with its error instead of
# waiting forever; resuming then gives the uninterrupted run's result.
setsid "$mpirun_sh" 2 "$memwall" train --steps $steps --log_every 1 --save "$tmp/stuck" \
  --save_every 5 --keep_checkpoints 2 --collective_timeout 2 > "$tmp/stuck.log" 2>&1 &
pid=$!
wait_for_step_20 "$tmp/stuck"
stopped=""
for p in $(pgrep -f -- "--save $tmp/stuck"); do
  tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 && stopped=$p
done
if [ -n "$stopped" ]; then
  kill -STOP "$stopped"
  pass
else
  fail "found no rank 1 process to stop"
fi
for _ in $(seq 1 1200); do  # the job must end by itself: 2 s, and up to 2 minutes of slack
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
  fail "the job with a stopped rank still runs 2 minutes later"
  kill -9 -- -"$pid" 2>/dev/null
  [ -n "$stopped" ] && kill -9 "$stopped" 2>/dev/null
else
  pass
fi
wait "$pid"
rc=$?
[ $rc -ne 0 ] && pass || fail "the job with a stopped rank exited with status 0"
check "a stuck rank ends the job" "$(cat "$tmp/stuck.log")" \
  "on rank 0 of 2: not every rank joined within 2s (a rank failed, is stuck or stopped calling collectives); "
# The stopped rank is named: stopped outside a collective, it never arrived;
# stopped while waiting in one, it stalled inside it.
grep -qE "stopped calling collectives\); (never arrived: rank 1, which had posted [0-9]+ of this communicator's MPI collectives to this rank's [0-9]+|stalled inside it: rank 1 \(posted it, then stopped polling: a stopped process, or stuck in MPI\)); the communicator is unusable now: end the job and resume from the last checkpoint" "$tmp/stuck.log" &&
  pass || fail "the stuck run's error does not name rank 1: $(grep -m1 'not every rank' "$tmp/stuck.log")"
gone "$tmp/stuck" || fail "the stuck run's ranks still run a minute later"
resumed=$("$mpirun_sh" 2 "$memwall" train --steps $steps --log_every 1 --save "$tmp/stuck" \
  --resume "$tmp/stuck" 2>&1)
check "resume after a stuck rank" "$resumed" "resumed from $tmp/stuck/step-" \
  "saved $tmp/stuck/step-00000300"
same_files "$tmp/ref/step-00000300" "$tmp/stuck/step-00000300" && pass ||
  fail "the run resumed after a stuck rank ends with a different checkpoint"

# Resharding: 4 ranks -> 2 -> 4, losslessly; and the 2-rank load trains on.
"$mpirun_sh" 4 "$memwall" train --steps 6 --log_every 6 --save "$tmp/four" > /dev/null 2>&1
out=$("$mpirun_sh" 2 "$memwall" train --steps 6 --resume "$tmp/four" --save "$tmp/two" 2>&1)
check "4 -> 2 ranks" "$out" "resumed from $tmp/four/step-00000006 at step 6" "saved $tmp/two/step-00000006"
"$mpirun_sh" 4 "$memwall" train --steps 6 --resume "$tmp/two" --save "$tmp/back" > /dev/null 2>&1
same_files "$tmp/four/step-00000006" "$tmp/back/step-00000006" && pass ||
  fail "4 -> 2 -> 4 ranks changed the checkpoint"
out=$("$mpirun_sh" 2 "$memwall" train --steps 10 --log_every 10 --resume "$tmp/two" 2>&1)
check "2 ranks train on from a 4-rank checkpoint" "$out" "step 10/10" "summary: 4 steps (0 skipped)"
# ZeRO stage 3 loads a stage-2 checkpoint.
echo '{"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 3},
       "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "betas": [0.9, 0.95], "weight_decay": 0.01}},
       "gradient_clipping": 1.0}' > "$tmp/zero3.json"
out=$("$mpirun_sh" 2 "$memwall" train --config "$tmp/zero3.json" --steps 10 --log_every 10 \
  --resume "$tmp/four" 2>&1)
check "stage 2 -> stage 3" "$out" "ZeRO stage 3" "resumed from $tmp/four/step-00000006 at step 6" \
  "summary: 4 steps (0 skipped)"

# Export: one safetensors file of the master weights.
out=$("$memwall" export --checkpoint "$tmp/four" --out "$tmp/model.safetensors" --dtype bf16 2>&1)
check "export" "$out" "exported $tmp/four/step-00000006 to $tmp/model.safetensors (bf16)"
[ -s "$tmp/model.safetensors" ] && head -c 4000 "$tmp/model.safetensors" | grep -q '"BF16"' && pass ||
  fail "export wrote no BF16 safetensors file"
out=$("$memwall" export --checkpoint "$tmp/four" --out "$tmp/m.safetensors" --dtype f16 2>&1)
check "export bad dtype" "$out" "--dtype: expected f32 or bf16, got 'f16'"

# Bad input.
out=$("$memwall" train --resume "$tmp/nothing" 2>&1)
check "missing checkpoint" "$out" "NOT_FOUND: checkpoint $tmp/nothing: no such directory"
mkdir -p "$tmp/empty"
out=$("$memwall" train --resume "$tmp/empty" 2>&1)
check "no complete checkpoint" "$out" "checkpoint $tmp/empty: no complete checkpoint"
out=$("$memwall" train --save "$tmp/x" --save_every -2 2>&1)
check "bad save_every" "$out" "--save_every: expected >= 0, got -2"
out=$("$memwall" train --model gpt-tiny:layers=3 --resume "$tmp/four" 2>&1)
check "another model" "$out" "no parameter 'block2.attn_proj_bias' (the checkpoint is of another model)"
out=$("$memwall" train --backend meta --steps 8 --resume "$tmp/four" 2>&1)
check "resume on meta" "$out" \
  "checkpoint $tmp/four: cannot load it on meta:0, which holds no values (a dry run needs no checkpoint; resume with --backend host or cuda)"
# Heads change no tensor shape; the manifest's model description catches it.
out=$("$memwall" train --model gpt-tiny:heads=2 --resume "$tmp/four" 2>&1)
check "another number of heads" "$out" \
  "saved from model 'gpt:vocab=256,seq=64,hidden=64,heads=4,layers=2', this run's model is 'gpt:vocab=256,seq=64,hidden=64,heads=2,layers=2'"

# The rank files balance by bytes (gpt-tiny is one flat group: by group,
# rank 0 wrote 1.45 MB and rank 1 10 bytes).
a=$(stat -c %s "$tmp/ref/step-00000300/rank-00000.safetensors")
b=$(stat -c %s "$tmp/ref/step-00000300/rank-00001.safetensors")
[ $((a > b ? a - b : b - a)) -le $(((a + b) / 10)) ] && pass ||
  fail "rank files of $a and $b bytes: not balanced within 10%"

# --steps 0 saves (and so exports) the initial weights; --steps at or below
# a checkpoint's step says there is nothing to train; a resumed summary
# counts only its own skipped steps.
out=$("$memwall" train --steps 0 --save "$tmp/init" 2>&1)
check "--steps 0 saves the initialisation" "$out" "saved $tmp/init/step-00000000"
out=$("$memwall" export --checkpoint "$tmp/init" --out "$tmp/init.safetensors" 2>&1)
check "export the initialisation" "$out" "exported $tmp/init/step-00000000 to $tmp/init.safetensors"
out=$("$memwall" train --steps 4 --resume "$tmp/four" 2>&1)
check "--steps below the checkpoint" "$out" \
  "nothing to train: the run is at step 6 and --steps 4 is the step to train up to"
echo '{"train_micro_batch_size_per_gpu": 8, "fp16": {"enabled": true, "initial_scale_power": 32},
       "zero_optimization": {"stage": 2}}' > "$tmp/fp16.json"
"$memwall" train --config "$tmp/fp16.json" --steps 3 --save "$tmp/fp16" > /dev/null 2>&1
out=$("$memwall" train --config "$tmp/fp16.json" --steps 5 --resume "$tmp/fp16" 2>&1)
check "a resumed run counts its own skipped steps" "$out" "summary: 2 steps (2 skipped)"

# A --save directory is checked before the first step, not at the first save.
touch "$tmp/a-file"
out=$("$memwall" train --steps 5 --save "$tmp/a-file" 2>&1)
check "--save a file" "$out" "--save $tmp/a-file: not a directory"
grep -q "step 1/5" <<<"$out" && fail "a run with a bad --save trained before failing" || pass
out=$("$memwall" train --steps 5 --save /proc/memwall-cannot 2>&1)
check "--save unwritable" "$out" "--save /proc/memwall-cannot: cannot create the directory"
# Ranks that do not see one directory (a path relative to working
# directories that differ, or a disk of each node's own) are told so.
mkdir -p "$tmp/cwd0" "$tmp/cwd1"
out=$("$mpirun_sh" 2 bash -c 'cd "$1/cwd$OMPI_COMM_WORLD_RANK" && exec "$0" train --steps 2 --save b' \
  "$(realpath "$memwall")" "$tmp" 2>&1)
check "ranks that do not share --save" "$out" \
  "--save b: rank 1 does not see the directory rank 0 made there: every rank must save to one directory they all see (a shared file system, the same path)"
grep -q "step 1/2" <<<"$out" && fail "ranks that do not share --save trained" || pass
# A new run into a directory holding another run's checkpoints is refused;
# the run that resumes from it may save there.
out=$("$memwall" train --steps 8 --save "$tmp/four" 2>&1)
check "another run's checkpoints" "$out" \
  "--save $tmp/four: holds 1 checkpoint(s) of another run (the newest $tmp/four/step-00000006); continue that run with --resume $tmp/four, or save this one elsewhere"
# Two runs never save into one directory at once.
# The first run must still hold its lock when the second starts: it gets far
# more steps than it can run before it is killed, and the second starts only
# once the lock is seen held (flock(1) fails on it), not on a log line, which
# a loaded machine may print after the run has long been under way.
lock=$tmp/busy/.memwall.lock
setsid "$mpirun_sh" 1 "$memwall" train --steps 100000000 --save "$tmp/busy" \
  > "$tmp/busy.log" 2>&1 &
pid=$!
for _ in $(seq 1 3000); do  # up to 5 minutes (slow under sanitizers)
  [ -e "$lock" ] && ! flock -n "$lock" true && break
  sleep 0.1
done
out=$("$memwall" train --steps 5 --save "$tmp/busy" 2>&1)
check "a directory another run saves into" "$out" \
  "--save $tmp/busy: another run saves there (it holds $tmp/busy/.memwall.lock, process "
kill -9 -- -"$pid" 2>/dev/null
wait "$pid" 2>/dev/null
gone "$tmp/busy"

# Export never overwrites the checkpoint it reads, nor silently anything else.
ckpt=$tmp/four/step-00000006
before=$(cksum < "$ckpt/rank-00000.safetensors")
out=$("$memwall" export --checkpoint "$tmp/four" --out "$ckpt/rank-00000.safetensors" 2>&1)
check "export into the checkpoint" "$out" \
  "export: --out $ckpt/rank-00000.safetensors: is inside the checkpoint $ckpt; write it elsewhere"
[ "$(cksum < "$ckpt/rank-00000.safetensors")" = "$before" ] && pass || fail "export changed a checkpoint file"
out=$("$memwall" export --checkpoint "$tmp/four" --out "$tmp/model.safetensors" 2>&1)
check "export over an existing file" "$out" \
  "export: --out $tmp/model.safetensors: exists; pass --force to replace it"
out=$("$memwall" export --checkpoint "$tmp/four" --out "$tmp/model.safetensors" --force 2>&1)
check "export --force" "$out" "exported $ckpt to $tmp/model.safetensors (f32)"

# No --out ever replaces a checkpoint's file or a save directory's lock,
# --force or not, and an existing file only with --force; the file is
# checked before the work (tune-aio's sweep takes minutes), which never
# starts.
other=$tmp/init/step-00000000
cksums() { cat "$ckpt"/* "$other"/* "$tmp/four/.memwall.lock" | cksum; }
before=$(cksums)
out=$("$memwall" export --checkpoint "$tmp/four" --out "$other/rank-00000.safetensors" --force 2>&1)
check "export --force over another checkpoint's file" "$out" \
  "export: --out $other/rank-00000.safetensors: is inside the checkpoint $other; write it elsewhere"
out=$("$memwall" export --checkpoint "$tmp/four" --out "$tmp/four/.memwall.lock" --force 2>&1)
check "export --force over a save directory's lock" "$out" \
  "export: --out $tmp/four/.memwall.lock: is the lock of a directory of checkpoints; write it elsewhere"
out=$("$memwall" tune-aio --dir "$tmp" --out "$ckpt/manifest.json" 2>&1)
check "tune-aio --out a manifest" "$out" \
  "--out $ckpt/manifest.json: is inside the checkpoint $ckpt; write it elsewhere"
grep -q "update MB/s" <<<"$out" && fail "tune-aio measured before refusing its --out" || pass
out=$("$memwall" plan --model gpt-tiny --auto --out "$other/rank-00000.safetensors" --force 2>&1)
check "plan --auto --out a rank file" "$out" \
  "--out $other/rank-00000.safetensors: is inside the checkpoint $other; write it elsewhere"
[ "$(cksums)" = "$before" ] && pass || fail "an --out changed a checkpoint file or a lock"
echo "a user's notes" > "$tmp/notes.json"
out=$("$memwall" plan --model gpt-tiny --auto --out "$tmp/notes.json" 2>&1)
check "plan --auto --out an existing file" "$out" \
  "--out $tmp/notes.json: exists; pass --force to replace it"
[ "$(cat "$tmp/notes.json")" = "a user's notes" ] && pass || fail "plan replaced a file without --force"
out=$("$memwall" plan --model gpt-tiny --auto --out "$tmp/notes.json" --force 2>&1)
check "plan --auto --out --force" "$out" "written to $tmp/notes.json"
grep -q '"zero_optimization"' "$tmp/notes.json" && pass || fail "plan --force did not write the config"

# --keep_checkpoints is checked before the first step, not at the first save.
out=$("$memwall" train --steps 5 --save "$tmp/keep0" --keep_checkpoints 0 2>&1)
check "--keep_checkpoints 0" "$out" "--keep_checkpoints: expected >= 1, got 0"
grep -q "step 1/5" <<<"$out" && fail "a run with --keep_checkpoints 0 trained before failing" || pass

# A save the file system refuses (here a file-size limit: EFBIG, as ENOSPC
# would be) leaves no empty step-* behind: a fresh run may save there, and
# one resuming from it is told there is no checkpoint. The limit (4 MiB)
# leaves room for MPI's own files; the 12-block model's 7 MiB does not fit.
out=$(trap '' XFSZ; ulimit -f 4096; "$memwall" train --model gpt-tiny:layers=12 --steps 1 \
  --save "$tmp/full" 2>&1)
check "a save past the file-size limit fails" "$out" \
  "checkpoint $tmp/full/step-00000001/rank-00000.safetensors.tmp: write: File too large"
[ -z "$(ls "$tmp/full")" ] && pass || fail "the failed save left: $(ls "$tmp/full")"
out=$("$memwall" train --model gpt-tiny:layers=12 --steps 1 --resume "$tmp/full" 2>&1)
check "resume after the failed save" "$out" \
  "checkpoint $tmp/full: no complete checkpoint (a step-* directory with manifest.json)"
out=$("$memwall" train --model gpt-tiny:layers=12 --steps 1 --save "$tmp/full" 2>&1)
check "a fresh save after the failed one" "$out" "saved $tmp/full/step-00000001"

# A damaged newest checkpoint gives way to the newest intact one, named.
"$memwall" train --steps 4 --save "$tmp/two-ck" --save_every 2 > /dev/null 2>&1
damaged=$tmp/two-ck/step-00000004/rank-00000.safetensors
printf 'x' | dd of="$damaged" bs=1 seek=$(( $(stat -c %s "$damaged") - 10 )) conv=notrunc 2>/dev/null
out=$("$memwall" train --steps 4 --resume "$tmp/two-ck" 2>&1)
check "fall back past a damaged checkpoint" "$out" \
  "resume: skipped $tmp/two-ck/step-00000004 (damaged: checkpoint $tmp/two-ck/step-00000004/rank-00000.safetensors: CRC-32" \
  "resumed from $tmp/two-ck/step-00000002 at step 2"
ls -a "$tmp"/*/step-* 2>/dev/null | grep -q '\.tmp$' && fail "a temporary file was left behind" || pass

report
