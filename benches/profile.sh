#!/usr/bin/env bash
# Where the daemon's CPU goes during the bench's realistic 32-session phase (direct, relay and
# broker interleaved; only the broker phases load the daemon). Samples the daemon with perf on
# the software clock (this machine kind has no hardware counters) and prints a flat profile.
#
#   benches/profile.sh [daemon binary]      (default: this checkout's release build)
#
# Needs `perf` (Debian: linux-perf). Output in target/profile/: bench.txt, perf.data, report.txt.
set -euo pipefail
. "$(dirname "$0")/common.sh"
bench_setup perf "Debian: apt-get install linux-perf" "${1:-}"
out=target/profile
mkdir -p "$out"
PI_IDE_BROKER_BENCH_DAEMON="$daemon" "$bench" --quick --only realistic --sessions 32 >"$out/bench.txt" 2>&1 &
bench_pid=$!
pid=""
for _ in $(seq 200); do
  pid=$(pgrep -P "$bench_pid" -f " daemon$" || true)
  [ -n "$pid" ] && break
  sleep 0.05
done
[ -n "$pid" ] || { echo "the bench did not start a daemon" >&2; kill "$bench_pid"; exit 1; }
perf record -q -g -F 4999 -e cpu-clock -p "$pid" -o "$out/perf.data" 2>/dev/null &
perf_pid=$!
wait "$bench_pid"
kill -INT "$perf_pid" 2>/dev/null || true
wait "$perf_pid" 2>/dev/null || true
perf report -i "$out/perf.data" --no-children --sort dso,symbol --percent-limit 0.7 --stdio 2>/dev/null \
  | grep -v '^#' | sed '/^$/d' >"$out/report.txt"
cat "$out/bench.txt" | grep -A3 '^sessions'
head -40 "$out/report.txt"
