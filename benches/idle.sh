#!/usr/bin/env bash
# An idle daemon's wake-ups: three editors and two sessions connected, nothing asked. The
# daemon's context switches (voluntary + involuntary, summed over its threads from
# /proc/<pid>/task/*/status) are counted over SECONDS, RUNS times, each run a fresh daemon
# after a WARM-second settle; prints each run and the median and worst per second. Goal: at
# most 1 a second (issue 62), and none without work.
#
#   benches/idle.sh [daemon binary]   (default: this checkout's debug build)
#   RUNS=N (default 3), SECONDS_PER_RUN=S (default 60), WARM=W (default 5).
#
# The editors are the suite's `fake_editor` example, the sessions two `pi-ide-broker mcp`
# doors (each an agent session of the daemon) whose stdin stays open. Wake-ups do not depend
# on the optimisation level, so a debug build measures the same thing as a release one.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --quiet --bin pi-ide-broker --example fake_editor
daemon=$(realpath "${1:-target/debug/pi-ide-broker}")
editor=target/debug/examples/fake_editor
runs=${RUNS:-3}
seconds=${SECONDS_PER_RUN:-60}
warm=${WARM:-5}

dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
cat >"$dir/config.toml" <<CONF
socket = "$dir/run/sock"
state_dir = "$dir/state"
log = "warn"
[compat]
lock_dir = "$dir/compat"
[[lock_dirs]]
path = "$dir/pi-ide"
family = "pi"
CONF
mkdir -p "$dir/pi-ide" "$dir/proj"

# "<tid> <switches>" for every thread of PID: its context switches of KIND (`ctxt_switches`:
# voluntary and involuntary; `^voluntary`: those where it waited for something, i.e. its
# wake-ups whatever else runs on the machine).
switches() {
  for t in /proc/"$1"/task/*; do
    awk -v t="${t##*/}" -v k="$2" '$1 ~ k { n += $2 } END { print t, n + 0 }' "$t/status" 2>/dev/null || true
  done
}

# Wake-ups between two `switches` lists: each thread's growth (a thread born since counts
# all of its switches); a thread gone since (tokio's blocking pool lets an idle one go after
# 10 s) counts the one wake-up that ended it, its last ones being unreadable.
woken() {
  awk 'NR == FNR { before[$1] = $2; next } { n += $2 - ($1 in before ? before[$1] : 0); seen[$1] = 1 }
       END { for (t in before) if (!(t in seen)) n += 1; print n }' "$1" "$2"
}

# Waits until FILE has a line starting with WORD.
wait_word() {
  for _ in $(seq 300); do grep -q "^$2" "$1" 2>/dev/null && return; sleep 0.1; done
  echo "timed out waiting for '$2' in $1" >&2; exit 1
}

for i in 1 2 3; do
  "$editor" --dir "$dir/pi-ide" --folder "$dir/proj/e$i" >"$dir/editor$i.out" &
  pids+=($!)
  wait_word "$dir/editor$i.out" ready
done

rates=()
for run in $(seq "$runs"); do
  rm -rf "$dir/run" "$dir/state"
  "$daemon" --config "$dir/config.toml" daemon 2>"$dir/daemon.err" &
  daemon_pid=$!
  pids+=("$daemon_pid")
  for _ in $(seq 300); do
    [ "$("$daemon" --config "$dir/config.toml" status 2>/dev/null | grep -c ' ready ')" -ge 3 ] && break
    sleep 0.1
  done
  session_pids=()
  for s in 1 2; do
    mkdir -p "$dir/proj/e$s/src"
    # stdin held open by a sleep that ends with the run: an idle client, connected.
    sleep $((warm + seconds + 30)) | "$daemon" --config "$dir/config.toml" mcp \
      --cwd "$dir/proj/e$s/src" --session "idle-$s" --no-spawn >/dev/null 2>"$dir/mcp$s.err" &
    session_pids+=($!)
    pids+=($!)
  done
  for _ in $(seq 300); do
    [ "$("$daemon" --config "$dir/config.toml" status 2>/dev/null | grep -c 'idle-')" -ge 2 ] && break
    sleep 0.1
  done
  sleep "$warm"
  switches "$daemon_pid" ctxt_switches >"$dir/before"
  switches "$daemon_pid" ^voluntary >"$dir/before.vol"
  sleep "$seconds"
  switches "$daemon_pid" ctxt_switches >"$dir/after"
  switches "$daemon_pid" ^voluntary >"$dir/after.vol"
  n=$(woken "$dir/before" "$dir/after")
  vol=$(woken "$dir/before.vol" "$dir/after.vol")
  rate=$(awk -v n="$n" -v s="$seconds" 'BEGIN { printf "%.2f", n / s }')
  echo "run $run: $n context switches in ${seconds} s = $rate a second ($vol voluntary; $(wc -l <"$dir/after") threads)"
  rates+=("$rate")
  kill "${session_pids[@]}" "$daemon_pid" 2>/dev/null || true
  wait "$daemon_pid" 2>/dev/null || true
done
printf '%s\n' "${rates[@]}" | sort -g | awk -v bin="$daemon" '
  { v[NR] = $1 } END {
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "idle context switches a second, 3 editors + 2 sessions (%s): median %.2f, worst %.2f over %d runs\n", bin, m, v[NR], NR
  }'
