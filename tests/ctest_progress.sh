#!/usr/bin/env bash
# `make test` and the other test targets run CTest through this: ctest's lines pass through as they come, and after
# every 30 s without one a line names each test still running and how long it has run. CTest prints a test's output
# only once the test has ended, and some run for minutes (the Soft-RoCE VM boots under TCG where there is no KVM), so
# without these lines the console would say nothing for that long. Tests may also show their own milestones: lines
# they append to the file GDX_CONSOLE_FILE names are printed within a second or two (tests/softroce/run-in-vm.sh
# appends the guest's). A file, not an inherited descriptor of the console: a process a test leaves behind would keep
# that open, and whatever reads the console (CI's log) would wait for it.
# Usage (in the build directory): ctest_progress.sh [CTEST ARGS...]; GDX_PROGRESS_SECONDS (default 30).
# Exit status: ctest's.
set -uo pipefail
every=${GDX_PROGRESS_SECONDS:-30}
GDX_CONSOLE_FILE=$(mktemp "${TMPDIR:-/tmp}/gdx_console.XXXXXX")
export GDX_CONSOLE_FILE
trap 'rm -f "$GDX_CONSOLE_FILE"' EXIT

shown=0  # bytes of GDX_CONSOLE_FILE printed so far
show_milestones() {
  local size
  size=$(stat -c %s "$GDX_CONSOLE_FILE" 2>/dev/null || echo 0)
  if [ "$size" -gt "$shown" ]; then
    tail -c +$((shown + 1)) "$GDX_CONSOLE_FILE" | head -c $((size - shown))
    shown=$size
  fi
}

watch_silence() {
  local line rc partial="" n quiet_since=$SECONDS
  local -A name since  # test number -> its name, when its Start line came
  while :; do
    IFS= read -r -t 1 line
    rc=$?
    if [ $rc -gt 128 ]; then  # a second without a whole line: what tests appended, then maybe a progress line
      partial+=$line
      show_milestones
      if [ $((SECONDS - quiet_since)) -ge "$every" ]; then
        for n in "${!name[@]}"; do
          printf '      ... %s: still running, %d s so far\n' "${name[$n]}" $((SECONDS - since[$n]))
        done
        quiet_since=$SECONDS
      fi
      continue
    fi
    line=$partial$line
    partial=""
    show_milestones  # a test's milestones before the line that says it ended
    if [ $rc != 0 ]; then  # end of ctest's output
      [ -z "$line" ] || printf '%s\n' "$line"
      return
    fi
    printf '%s\n' "$line"
    quiet_since=$SECONDS
    if [[ $line =~ ^\ *Start\ +([0-9]+):\ (.*)$ ]]; then
      name[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
      since[${BASH_REMATCH[1]}]=$SECONDS
    elif [[ $line =~ Test\ +#([0-9]+): ]]; then
      unset "name[${BASH_REMATCH[1]}]" "since[${BASH_REMATCH[1]}]"
    fi
  done
}

ctest "$@" 2>&1 | watch_silence
exit "${PIPESTATUS[0]}"
