#!/usr/bin/env bash
# Every program gdx builds answers --help with its usage (its flags) (exit 0, without running anything or writing a file) and
# refuses an unknown flag with a message naming it (a non-zero exit that is not a crash). Usage: check_cli.sh PROG...
set -uo pipefail
failed=0
for prog in "$@"; do
  prog=$(readlink -f "$prog")
  name=$(basename "$prog")
  scratch=$(mktemp -d)
  out=$(cd "$scratch" && timeout 60 "$prog" --help 2>&1); rc=$?
  written=$(ls -A "$scratch"); rm -rf "$scratch"
  if [ $rc -ne 0 ] || ! grep -qiE -- 'usage|--[a-z]' <<<"$out"; then
    echo "FAIL $name --help: exit $rc, output: $(head -c 300 <<<"$out")"; failed=1; continue
  fi
  if [ -n "$written" ]; then echo "FAIL $name --help wrote files: $written"; failed=1; continue; fi
  err=$(timeout 60 "$prog" --no-such-flag 2>&1 >/dev/null); rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 124 ] || ! grep -q -- '--no-such-flag' <<<"$err"; then
    echo "FAIL $name --no-such-flag: exit $rc, stderr: $(head -c 300 <<<"$err")"; failed=1; continue
  fi
  echo "ok   $name: --help exits 0 with its usage, an unknown flag exits $rc naming it"
done
exit $failed
