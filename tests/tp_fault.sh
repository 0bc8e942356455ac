#!/usr/bin/env bash
# A rank that dies or stops answering must end the job with an error within a bounded time,
# never a hang (runtime.md §6.11). Usage: tp_fault.sh exit|hang|ok PROBE MPIRUN-ARGS...
set -u
mode=$1; probe=$2; shift 2
start=$(date +%s)
out=$(KILN_COLLECTIVE_TIMEOUT=3 timeout 90 "$@" -x KILN_COLLECTIVE_TIMEOUT "$probe" "$mode" 2>&1)
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
exit 0
