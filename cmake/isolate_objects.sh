#!/bin/bash
# isolate_objects.sh LD NM OBJCOPY ARCHIVE OUT: links one level's copy of the CPU kernels
# (ARCHIVE) into one relocatable object OUT in which the copy's weak functions (inline functions
# and templates, its own instructions) and vtables are local, so no other code links to them
# (cmake/cpu_kernels.cmake says why). Its unique objects (the function-local statics of inline
# functions) become weak: the final link binds every copy to one of them, as it would have.
set -euo pipefail
ld=$1 nm=$2 objcopy=$3 archive=$4 out=$5
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# --force-group-allocation resolves the COMDAT groups here, as a final link would, so the
# symbols made local below name one definition each.
"$ld" -r --force-group-allocation -o "$tmp/all.o" --whole-archive "$archive"
"$nm" --defined-only "$tmp/all.o" >"$tmp/symbols"
awk '$2 == "W" || ($2 == "V" && $3 ~ /^_ZTV/) { print $3 }' "$tmp/symbols" >"$tmp/local"
awk '$2 == "u" { print $3 }' "$tmp/symbols" >"$tmp/weak"
"$objcopy" --localize-symbols="$tmp/local" --weaken-symbols="$tmp/weak" "$tmp/all.o" "$out"
