#!/usr/bin/env bash
# `make test` and the other test targets run CTest through this: ctest's lines pass through as they come, and after
# every 30 s without one a line names each test still running and how long it has run. CTest prints a test's output
# only once the test has ended, and some run for minutes (the Soft-RoCE VM boots under TCG where there is no KVM), so
# without these lines the console would say nothing for that long. Tests may also write their own milestones to the
# console: GDX_CONSOLE_FD names a descriptor that reaches it (tests/softroce/run-in-vm.sh writes the guest's).
# Usage (in the build directory): ctest_progress.sh [CTEST ARGS...]; GDX_PROGRESS_SECONDS (default 30).
# Exit status: ctest's.
set -uo pipefail
every=${GDX_PROGRESS_SECONDS:-30}

watch_silence() {
  local line rc now n
  local -A name since  # test number -> its name, when its Start line came
  while :; do
    IFS= read -r -t "$every" line
    rc=$?
    if [ $rc = 0 ]; then
      printf '%s\n' "$line"
      if [[ $line =~ ^\ *Start\ +([0-9]+):\ (.*)$ ]]; then
        name[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
        since[${BASH_REMATCH[1]}]=$SECONDS
      elif [[ $line =~ Test\ +#([0-9]+): ]]; then
        unset "name[${BASH_REMATCH[1]}]" "since[${BASH_REMATCH[1]}]"
      fi
      continue
    fi
    if [ $rc -le 128 ]; then  # end of ctest's output (ctest prints whole lines, so nothing is left half read)
      [ -z "$line" ] || printf '%s\n' "$line"
      return
    fi
    now=$SECONDS
    for n in "${!name[@]}"; do
      printf '      ... %s: still running, %d s so far\n' "${name[$n]}" $((now - since[$n]))
    done
  done
}

exec 4>&1  # the console, for the tests' own milestones: ctest's stdout is the pipe below
export GDX_CONSOLE_FD=3
ctest "$@" 3>&4 4>&- 2>&1 | watch_silence
exit "${PIPESTATUS[0]}"
