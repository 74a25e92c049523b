#!/usr/bin/env bash
# User-space instructions per call, counted by callgrind: the daemon's native door and a bare
# relay process, each carrying the same echo calls (one at a time) to the same editor process.
# Instruction counts do not move with the machine's load, where the timing tables move 2-5x,
# so this is the figure to compare two builds of the hot path by.
#
#   benches/instructions.sh [daemon binary]      (default: this checkout's release build)
#   CALLS=N (default 2000) calls are counted, after 200 that warm up; SESSIONS=S (default 1)
#   connections make them (under callgrind the daemon is the bottleneck, so at S > 1 each of
#   its wake-ups handles many calls, as it does under load); TOOL=NAME calls that tool of the
#   fake editor instead of `echo` (e.g. getDiagnostics); PAYLOAD=BYTES puts a string that long
#   in every call's arguments (echoed back, so both frames are large).
#   DOOR=compat counts the compat door (loopback TCP, as pi-ide enters) instead of the native one.
#   KEEP=DIR keeps the callgrind dumps there (callgrind_annotate DIR/cg.<pid>.1 shows where
#   the instructions go).
#
# Needs valgrind (Debian: apt-get install valgrind).
set -euo pipefail
. "$(dirname "$0")/common.sh"
bench_setup valgrind "Debian: apt-get install valgrind" "${1:-}"
calls=${CALLS:-2000}
sessions=${SESSIONS:-1}
bench_scratch
on_exit() {
  if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$dir"/cg.* "$KEEP"/ 2>/dev/null || true; fi
}

# Counts the instructions of the callgrind process PID over $calls calls made by `--calls ARGS`.
count() {
  local pid=$1; shift
  "$bench" --calls 200 "$@" --sessions "$sessions" ${TOOL:+--tool "$TOOL"} ${PAYLOAD:+--payload "$PAYLOAD"} >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  "$bench" --calls "$calls" "$@" --sessions "$sessions" ${TOOL:+--tool "$TOOL"} ${PAYLOAD:+--payload "$PAYLOAD"} >/dev/null
  callgrind_control -d "$pid" >/dev/null 2>&1
  local total
  total=$(callgrind_annotate "$dir/cg.$pid.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  [ -n "$total" ] || { echo "no callgrind dump from pid $pid" >&2; exit 1; }
  echo $((total / calls))
}

start_editor

valgrind --tool=callgrind --callgrind-out-file="$dir/cg.%p" "$daemon" --config "$dir/config.toml" daemon 2>"$dir/daemon.err" &
daemon_pid=$!
pids+=("$daemon_pid")
wait_daemon_ready
door_args
broker=$(count "$daemon_pid" "$dir/run/sock" "${door[@]}")

valgrind --tool=callgrind --callgrind-out-file="$dir/cg.%p" "$bench" --relay "$dir/relay.sock" "$port" >"$dir/relay.out" 2>"$dir/relay.err" &
relay_pid=$!
pids+=("$relay_pid")
wait_word "$dir/relay.out" ready >/dev/null
relay=$(count "$relay_pid" "$dir/relay.sock" "$port" "$token")

printf 'user-space instructions per call (%s calls on %s connections, callgrind)\n' "$calls" "$sessions"
printf '  %-28s %8s\n' "bare relay" "$relay" "broker, ${DOOR:-native} door" "$broker"
awk -v b="$broker" -v r="$relay" 'BEGIN { printf "  %-28s %8.2fx\n", "broker / relay", b / r }'
