# Sourced by the scripts in benches/: the repository root as the working dir, a check for the
# tool they need, the bench binary (built if needed) as $bench and the daemon to measure
# (the script's first argument, or this checkout's release build) as $daemon.
#
#   bench_setup TOOL "HOW TO INSTALL IT" [daemon binary]
bench_setup() {
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  command -v "$1" >/dev/null || { echo "$1 not found: install it ($2)" >&2; exit 1; }
  bench=$(cargo bench --bench broker --no-run 2>&1 | grep -o 'target/release/deps/broker-[0-9a-f]*' | tail -1)
  [ -n "$bench" ] || { echo "cannot find the bench binary in cargo's output" >&2; exit 1; }
  daemon=$(realpath "${3:-target/release/pi-ide-broker}")
}
