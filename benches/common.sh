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

# A scratch dir ($dir) with a daemon config watching $dir/pi-ide, removed on exit with every
# process whose pid is added to $pids. A script may define `on_exit` to save something from
# $dir before it goes. The daemon logs at $PI_IDE_BROKER_BENCH_LOG (default warn), as in
# `cargo bench`.
bench_scratch() {
  dir=$(mktemp -d)
  pids=()
  trap bench_cleanup EXIT
  mkdir -p "$dir/pi-ide"
  cat >"$dir/config.toml" <<CONF
socket = "$dir/run/sock"
state_dir = "$dir/state"
log = "${PI_IDE_BROKER_BENCH_LOG:-warn}"
[compat]
lock_dir = "$dir/compat"
[[lock_dirs]]
path = "$dir/pi-ide"
family = "pi"
CONF
}

bench_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if declare -F on_exit >/dev/null; then on_exit; fi
  rm -rf "$dir"
}

# Waits until FILE has a line starting with WORD; prints that line's second field.
wait_word() {
  for _ in $(seq 600); do
    if line=$(grep -m1 "^$2" "$1" 2>/dev/null); then echo "$line" | cut -d' ' -f2; return; fi
    sleep 0.1
  done
  echo "timed out waiting for '$2' in $1" >&2; exit 1
}

# Starts the bench's realistic editor (150 µs of CPU per answer) in $dir/pi-ide; sets $port
# and $token.
start_editor() {
  "$bench" --editor "$dir/pi-ide" >"$dir/editor.out" &
  pids+=($!)
  port=$(wait_word "$dir/editor.out" ready)
  token=$(sed -n 's/.*"authToken":"\([^"]*\)".*/\1/p' "$dir/pi-ide/$port.lock")
}

# Waits until the daemon of $dir/config.toml reports an editor ready.
wait_daemon_ready() {
  for _ in $(seq 600); do
    "$daemon" --config "$dir/config.toml" status 2>/dev/null | grep -q " ready " && return
    sleep 0.1
  done
  echo "the daemon did not report a ready editor" >&2; exit 1
}

# The calls-mode arguments for the door named by $DOOR (native, the default, or compat, which
# pi-ide enters over loopback TCP), as the array $door.
door_args() {
  case "${DOOR:-native}" in
    native) door=() ;;
    compat) door=(--compat "$dir/compat") ;;
    *) echo "DOOR is native or compat" >&2; exit 2 ;;
  esac
}
