#!/usr/bin/env bash
# Kernel work per call, counted: the daemon's native door and a bare relay process, each
# carrying the same echo calls to the same editor process (150 µs of CPU per answer), from
# SESSIONS concurrent connections. Counted with perf's tracepoints (syscalls, context
# switches, packets sent, timers armed), which are exact where the timing tables move 2-5x
# with load: the figure to compare two builds' system calls, ACKs and wake-ups by.
#
#   benches/syscalls.sh [daemon binary]      (default: this checkout's release build)
#   CALLS=N (default 4000) calls are counted, after 640 that warm up; SESSIONS=S (default 32);
#   DOOR=compat counts the compat door (loopback TCP, as pi-ide enters) instead of the native one.
#
# Needs perf (Debian: apt-get install linux-perf) and the permission to read tracepoints (root,
# or kernel.perf_event_paranoid <= 1).
set -euo pipefail
. "$(dirname "$0")/common.sh"
bench_setup perf "Debian: apt-get install linux-perf" "${1:-}"
calls=${CALLS:-4000}
sessions=${SESSIONS:-32}
bench_scratch

events=syscalls:sys_enter_epoll_wait,syscalls:sys_enter_recvfrom,syscalls:sys_enter_read
events+=,syscalls:sys_enter_sendto,syscalls:sys_enter_writev,syscalls:sys_enter_write
events+=,syscalls:sys_enter_setsockopt,syscalls:sys_enter_futex,sched:sched_switch
events+=,net:net_dev_xmit,timer:hrtimer_start
names=(epoll_wait recvfrom read sendto writev write setsockopt futex switch packet hrtimer)

# Counts PID's events over $calls calls made by `--calls ARGS`; prints them per call.
count() {
  local pid=$1; shift
  "$bench" --calls $((sessions * 20)) "$@" --sessions "$sessions" >/dev/null
  perf stat -x, -e "$events" -p "$pid" -o "$dir/stat" -- "$bench" --calls "$calls" "$@" --sessions "$sessions" >/dev/null
  awk -F, -v n="$calls" '/^[0-9]/ { printf "%s ", $1 / n }' "$dir/stat"
}

start_editor

"$daemon" --config "$dir/config.toml" daemon 2>"$dir/daemon.err" &
daemon_pid=$!
pids+=("$daemon_pid")
wait_daemon_ready
door_args
broker=$(count "$daemon_pid" "$dir/run/sock" "${door[@]}")

"$bench" --relay "$dir/relay.sock" "$port" >"$dir/relay.out" 2>"$dir/relay.err" &
relay_pid=$!
pids+=("$relay_pid")
wait_word "$dir/relay.out" ready >/dev/null
relay=$(count "$relay_pid" "$dir/relay.sock" "$port" "$token")

printf 'kernel work per call (%s calls on %s connections, perf tracepoints)\n' "$calls" "$sessions"
printf '  %-22s' ""; printf '%11s' "${names[@]}"; echo
printf '  %-22s' "bare relay"; printf '%11.2f' $relay; echo
printf '  %-22s' "broker, ${DOOR:-native} door"; printf '%11.2f' $broker; echo
