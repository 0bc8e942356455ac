#!/usr/bin/env bash
# A rank that dies, stops answering or fails must end the job with an error within a bounded
# time, never a hang. Usage: tp_fault.sh MODE PROGRAM MPIRUN-ARGS...
#   ok | exit | hang: PROGRAM is tests/tp_probe.cc (collective timeout 3 s);
#   cli-error: PROGRAM is the kiln CLI, whose rank 0 alone fails (an unwritable --out) while
#   rank 1 would go on to its first collective: the job must end at once, well before the
#   60 s collective timeout.
#   cli-mismatch: PROGRAM is the kiln CLI, each rank given another --seed (sh -c '... --seed
#   $OMPI_COMM_WORLD_RANK'): every rank must stop before any work, naming the argument, and no
#   image may be written (without the check the job "succeeds" with an image no single process gives).
set -u
mode=$1; program=$2; shift 2
start=$(date +%s)
if [ "$mode" = cli-error ]; then
  out=$(KILN_COLLECTIVE_TIMEOUT=60 timeout 90 "$@" -x KILN_COLLECTIVE_TIMEOUT "$program" generate --tp 2 \
        --out /nonexistent-dir/x.png 2>&1)
elif [ "$mode" = cli-mismatch ]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  png=$scratch/x.png
  out=$(KILN_COLLECTIVE_TIMEOUT=60 timeout 90 "$@" -x KILN_COLLECTIVE_TIMEOUT sh -c \
        'exec "$0" generate --tp 2 --seed "$OMPI_COMM_WORLD_RANK" --out "$1"' "$program" "$png" 2>&1)
else
  out=$(KILN_COLLECTIVE_TIMEOUT=3 timeout 90 "$@" -x KILN_COLLECTIVE_TIMEOUT "$program" "$mode" 2>&1)
fi
rc=$?
took=$(( $(date +%s) - start ))
echo "$out"
echo "tp_fault.sh: mode $mode, exit code $rc after ${took}s"
if [ "$mode" = ok ]; then
  [ $rc -eq 0 ] && echo "$out" | grep -q "sum 3" && exit 0
  exit 1
fi
[ $rc -eq 124 ] && { echo "hung: the job did not end within 90 s"; exit 1; }
[ $rc -eq 0 ] && { echo "the job succeeded although a rank failed"; exit 1; }
if [ "$mode" = hang ]; then
  echo "$out" | grep -q "did not complete within 3 s" || { echo "no timeout message naming the collective"; exit 1; }
fi
if [ "$mode" = cli-error ]; then
  echo "$out" | grep -q "cannot write /nonexistent-dir/x.png" || { echo "rank 0's error is missing"; exit 1; }
  [ $took -lt 30 ] || { echo "the other rank waited for its collective timeout"; exit 1; }
fi
if [ "$mode" = cli-mismatch ]; then
  echo "$out" | grep -qF "launched with different arguments: argument 5 (after '--seed') is '1' on rank 1 but '0' on rank 0" ||
    { echo "no line naming the differing argument"; exit 1; }
  [ -e "$png" ] && { echo "an image was written"; exit 1; }
  [ $took -lt 30 ] || { echo "the ranks did not stop before any work"; exit 1; }
fi
exit 0
