#!/usr/bin/env bash
# Usage: scripts/beside.sh LOG BACKGROUND FOREGROUND
# Runs the shell command BACKGROUND beside FOREGROUND, BACKGROUND's output held back in LOG and
# printed whole once both have ended, so that the two outputs do not interleave. `make test` runs
# the sanitized build this way beside the release build's tests, which leave a core idle much of
# their time (docs/reliability.md). Exits with FOREGROUND's status if it fails (BACKGROUND is then
# stopped), else with BACKGROUND's.
set -uo pipefail
if (($# != 3)); then
  echo "usage: $0 LOG BACKGROUND FOREGROUND" >&2
  exit 2
fi
log=$1 background=$2 foreground=$3
mkdir -p "$(dirname "$log")"
set -m  # the background job in a process group of its own, so that it can be stopped whole
start=$SECONDS
bash -c "$background" > "$log" 2>&1 &
pid=$!
set +m
trap 'kill -TERM -- "-$pid" 2>/dev/null; exit 130' INT TERM
echo "started beside what follows: $background (output in $log)"
bash -c "$foreground"
status=$?
if ((status != 0)); then
  kill -TERM -- "-$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  echo "stopped after $((SECONDS - start)) s, since the command above failed: $background" >&2
  exit "$status"
fi
echo "waiting for: $background"
wait "$pid"
status=$?
cat "$log"
echo "ended after $((SECONDS - start)) s (exit status $status): $background"
exit "$status"
