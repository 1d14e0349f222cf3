#!/usr/bin/env bash
# Every script in scripts/ answers --help with its header comment and
# refuses an argument it does not know, at once and before it does
# anything (scripts/test used to run the whole suite on `--help`, and
# `scripts/figures --chek` rewrote every figures block). The scripts run
# from a copy, so a regression cannot build or install in this tree.
# Usage: scripts_help.sh SOURCE_DIR
set -u
src="${1:?usage: scripts_help.sh SOURCE_DIR}"
guard_s=10
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$src/scripts" "$tmp/"
failed=0
checked=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

for path in "$tmp"/scripts/*; do
  [ -f "$path" ] && [ -x "$path" ] || continue
  name="scripts/$(basename "$path")"
  checked=$((checked + 1))
  out=$(timeout "$guard_s" "$path" --help 2>&1)
  rc=$?
  if [ "$rc" -ne 0 ]; then
    fail "$name --help exited $rc"
  elif ! head -n 3 <<<"$out" | grep -qF "$name"; then
    fail "$name --help does not start with its name: $(head -n 1 <<<"$out")"
  fi
  # scripts/build hands its arguments to cmake --build: not refused here.
  [ "$name" = scripts/build ] && continue
  out=$(timeout "$guard_s" "$path" --no-such-flag 2>&1)
  rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
    fail "$name --no-such-flag exited $rc"
  elif ! grep -qF -- "--no-such-flag" <<<"$out"; then
    fail "$name --no-such-flag does not name the argument: $out"
  fi
done
echo "scripts_help: $checked scripts, $failed failed"
[ "$checked" -gt 0 ] && [ "$failed" -eq 0 ]
