#!/usr/bin/env bash
# Two builds of the daemon compared in the same runs: `cargo bench`'s tables against the relay
# with build X and build Y both measured in every run (PI_IDE_BROKER_BENCH_DAEMON and
# PI_IDE_BROKER_BENCH_DAEMON_B), X first in odd runs and Y first in even ones, then the median
# and range of each figure per build. Timings move 2-5x with the machine's load between runs
# and far less within one: this is how the README's before/after tables are made.
#
#   benches/ab.sh X Y [RUNS] [SECTIONS] [-- BENCH ARGS...]
#   X, Y: daemon binaries (e.g. a release build copied aside, and target/release/pi-ide-broker);
#   RUNS: default 6; SECTIONS: default fake,realistic; BENCH ARGS: e.g. --payload 1048576.
#
# Each run's output is kept in target/ab/run-N.txt. Needs python3 for the summary.
set -euo pipefail
. "$(dirname "$0")/common.sh"
[ $# -ge 2 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
bench_setup python3 "Debian: apt-get install python3" "$1"
x=$daemon
y=$(realpath "$2")
shift 2
runs=6
sections=fake,realistic
if [ $# -gt 0 ] && [ "$1" != "--" ]; then runs=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" != "--" ]; then sections=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" = "--" ]; then shift; fi
out=target/ab
rm -rf "$out" && mkdir -p "$out"
for i in $(seq "$runs"); do
  if [ $((i % 2)) = 1 ]; then first=$x second=$y order=XY; else first=$y second=$x order=YX; fi
  echo "run $i of $runs ($order)" >&2
  PI_IDE_BROKER_BENCH_DAEMON=$first PI_IDE_BROKER_BENCH_DAEMON_B=$second \
    "$bench" --quick --only "$sections" "$@" >"$out/run-$i.txt" 2>&1
  echo "$order" >"$out/run-$i.order"
done

python3 - "$out" "$runs" "$x" "$y" <<'PY'
import re, statistics, sys
out, runs, x, y = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = {}  # (scenario, sessions, door, build) -> {figure: [values]}
for i in range(1, runs + 1):
    order = open(f"{out}/run-{i}.order").read().strip()
    scenario = None
    for line in open(f"{out}/run-{i}.txt"):
        if line.startswith("Against a bare relay"):
            scenario = line.split("—")[1].split("(")[0].strip()
        m = re.match(r"^(\d+) (native|compat)( B)?\s+(.*)", line)
        if not m or not scenario:
            continue
        c = [v.rstrip("µsx") for v in m.group(4).split()]
        second = bool(m.group(3))
        build = "X" if (order == "XY") != second else "Y"
        cpu_r, cpu_b = float(c[10]), float(c[11])
        relay99, broker99 = float(c[6]), float(c[7])
        fig = {"b/r p50": c[5], "b/r p99": f"{broker99 / relay99:.3f}" if relay99 > 0.05 else "n/a",
               "cpu b/r": f"{cpu_b / cpu_r:.3f}" if cpu_r else "n/a",
               "cpu µs": c[11], "ctx": c[9], "broker+50 µs": c[4], "broker+99 µs": c[7]}
        d = rows.setdefault((scenario, int(m.group(1)), m.group(2), build), {})
        for k, v in fig.items():
            if v not in ("n/a", "-"):
                d.setdefault(k, []).append(float(v))
print(f"X = {x}\nY = {y}\n{runs} runs; median (min-max) of each figure, per build\n")
names = ["b/r p50", "b/r p99", "cpu b/r", "cpu µs", "ctx", "broker+50 µs", "broker+99 µs"]
print(f"{'':<32}{'':>6}" + "".join(f"{n:>28}" for n in names))
for key in sorted(rows):
    d = rows[key]
    cells = []
    for n in names:
        v = d.get(n, [])
        cells.append(f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" if v else "n/a")
    label = f"{key[0]}, {key[1]} {key[2]}"
    print(f"{label:<32}{key[3]:>6}" + "".join(f"{c:>28}" for c in cells))
PY
