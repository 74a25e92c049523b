#!/usr/bin/env bash
# Builds and packs every npm package this machine can (issue 41), into one folder:
#   bash packaging/pack.sh [--out DIR] [--only linux-x64,...]
# - pi-ide-broker-linux-x64 and -linux-arm64: static binaries (x86_64- and
#   aarch64-unknown-linux-musl), cross-linked here with rust-lld, the linker rustup ships:
#   the crate is pure Rust and the musl targets bring their own C runtime, so no C cross
#   toolchain (zig, musl-gcc) is needed.
# - pi-ide-broker-win32-x64: x86_64-pc-windows-gnu, linked by Debian's mingw-w64 gcc
#   (apt-get install gcc-mingw-w64-x86-64).
#   No win32-arm64: aarch64-pc-windows-gnullvm needs an llvm-mingw toolchain no registry
#   here ships.
# - pi-ide-broker-darwin-*: need a Mac (Apple's linker and SDK); packaging/README.md says how.
# - pi-ide-broker: the pi package (the extension and the launcher), from the repository root.
# Each tarball's size and files are printed. Nothing is published.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${CARGO_TARGET_DIR:-target}/packages"
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "pack.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"
rm -f "$out"/pi-ide-broker-*.tgz
target_dir="${CARGO_TARGET_DIR:-target}"
stage="$target_dir/npm-stage"
wanted() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }

build_linux() {
  local key="$1" triple="$2"
  rustup target add "$triple" >/dev/null
  local var
  var="CARGO_TARGET_$(echo "$triple" | tr 'a-z-' 'A-Z_')_LINKER"
  env "$var=rust-lld" cargo build --locked --profile dist --target "$triple" --bin pi-ide-broker
  rm -rf "${stage:?}/$key"
  mkdir -p "$stage/$key/vendor/$triple/bin"
  cp "packaging/npm/$key/package.json" LICENSE "$stage/$key/"
  cp "$target_dir/$triple/dist/pi-ide-broker" "$stage/$key/vendor/$triple/bin/pi-ide-broker"
  (cd "$stage/$key" && npm pack --silent --pack-destination "$out" >/dev/null)
}

build_windows() {
  local key="win32-x64" triple="x86_64-pc-windows-gnu"
  rustup target add "$triple" >/dev/null
  command -v x86_64-w64-mingw32-gcc >/dev/null || {
    echo "pack.sh: $key needs x86_64-w64-mingw32-gcc (apt-get install gcc-mingw-w64-x86-64)" >&2
    return 1
  }
  cargo build --locked --profile dist --target "$triple" --bin pi-ide-broker
  rm -rf "${stage:?}/$key"
  mkdir -p "$stage/$key/vendor/$triple/bin"
  cp "packaging/npm/$key/package.json" LICENSE "$stage/$key/"
  cp "$target_dir/$triple/dist/pi-ide-broker.exe" "$stage/$key/vendor/$triple/bin/pi-ide-broker.exe"
  (cd "$stage/$key" && npm pack --silent --pack-destination "$out" >/dev/null)
}

wanted linux-x64 && build_linux linux-x64 x86_64-unknown-linux-musl
wanted linux-arm64 && build_linux linux-arm64 aarch64-unknown-linux-musl
wanted win32-x64 && build_windows
for key in darwin-x64 darwin-arm64; do
  wanted "$key" && echo "note: pi-ide-broker-$key needs a Mac to build: see packaging/README.md"
done
# The pi package ships the docs its README links to; its README's relative links (right on a
# clone) are made absolute, to this version's files on unpkg, since a registry page resolves a
# relative link against a repository this package does not name.
pack_pi() {
  local version pi_stage
  version="$(node -p 'require("./package.json").version')"
  pi_stage="$stage/pi"
  rm -rf "$pi_stage"
  mkdir -p "$pi_stage"
  npm pack --silent --ignore-scripts --pack-destination "$pi_stage" >/dev/null
  tar -xzf "$pi_stage/pi-ide-broker-$version.tgz" -C "$pi_stage"
  V="$version" perl -pi -e 's{\]\((?!https?:|#|mailto:)([^)\s]+)\)}{](https://unpkg.com/pi-ide-broker\@$ENV{V}/$1)}g' \
    "$pi_stage/package/README.md"
  (cd "$pi_stage/package" && npm pack --silent --ignore-scripts --pack-destination "$out" >/dev/null)
}
wanted pi && pack_pi

echo
echo "packages in $out:"
for t in "$out"/pi-ide-broker-*.tgz; do
  [ -e "$t" ] || continue
  printf '%-42s %8s KiB packed\n' "$(basename "$t")" "$(( $(stat -c %s "$t") / 1024 ))"
  tar -tzvf "$t" | awk '{printf "    %10s  %s\n", $3, $6}'
done
