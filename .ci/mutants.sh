#!/usr/bin/env bash
# Mutation testing of the core (issue 40): cargo-mutants over the modules that decide where
# things go and what is trusted, against the lib tests (the registry's model test included),
# which run in about 15 s. Not in .ci/run: each mutant is a rebuild (7-10 s incremental here),
# so the four core modules (identity, router, pathmap, lockfile: about 220 mutants) take about
# an hour on this 2-core machine. Results and the missed mutants' fate: .ci/mutants.md.
#   bash .ci/mutants.sh                      # the four core modules
#   bash .ci/mutants.sh --follow             # the ACP agent (agent, prompt, messages: the
#                                            # sans-IO part; acp/mod.rs is its I/O, which the
#                                            # suite drives) and session::follow (lib tests:
#                                            # their sans-IO and model tests; ~20 s a mutant)
#   bash .ci/mutants.sh --mcp                # the MCP door (frontdoor/mcp/door.rs: eras, the tool
#                                            # list, what is answered before the daemon is up)
#   bash .ci/mutants.sh --wire               # protocol's era, winpath and handshake (how a
#                                            # peer's era is told, WSL paths, the hello)
#   bash .ci/mutants.sh --links              # editor::taken, inbound, dial, against the lib
#                                            # tests and the suite modules that drive them
#                                            # (editor_quirks, broker_core, faults): ~1.5 min
#                                            # a mutant here, about 3 h for the three files
#   bash .ci/mutants.sh --rights             # who may do what: frontdoor::rights, status
#                                            # (what an agent sees) and native (the door's
#                                            # checks), against the lib tests (issue 61)
#   bash .ci/mutants.sh src/registry/router.rs ...    # the files given (lib tests)
# Groups and files combine (one baseline build for all): bash .ci/mutants.sh --follow --mcp
# cargo-mutants' own options go after `--`: bash .ci/mutants.sh --follow -- --iterate
set -euo pipefail
cd "$(dirname "$0")/.."
version=27.1.0
root="${PI_IDE_BROKER_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pi-ide-broker-ci}/cargo-mutants-$version"
if [ ! -x "$root/bin/cargo-mutants" ]; then
  cargo install --locked --root "$root" "cargo-mutants@$version"
fi
# Which test targets build and run (given to every cargo call, so a mutant builds only them,
# not the suite's binary) and the filters for the test binaries.
targets=(--lib)
filters=()
# The lib test modules that exercise a group's files (the lib tests of the rest of the crate
# take most of the test time and reach none of them); empty: every lib test.
modules=()
files=()
# Mutants are looked for in every crate of the workspace (the files given pick them); a mutant
# is tested in the crate of its file unless a group names the whole workspace.
workspace=(--workspace)
extra=() # after `--`: cargo-mutants' own options (--re, --iterate, --in-diff, ...)
while [ $# -gt 0 ]; do
  arg=$1
  shift
  case "$arg" in
    --)
      extra=("$@")
      break
      ;;
    --follow)
      files+=(src/frontdoor/acp/agent.rs src/frontdoor/acp/agent/review.rs src/frontdoor/acp/prompt.rs src/frontdoor/acp/messages.rs src/session/follow.rs)
      modules+=(frontdoor::acp session::)
      ;;
    --mcp)
      files+=(src/frontdoor/mcp/door.rs)
      modules+=(frontdoor::mcp)
      ;;
    --wire)
      files+=(crates/protocol/src/era.rs crates/protocol/src/winpath.rs crates/protocol/src/handshake.rs)
      # The protocol crate's own tests (its modules are top-level there) and the daemon's.
      modules+=(era:: winpath:: handshake:: editor:: frontdoor:: frontdoor::mcp frontdoor::acp session::)
      workspace+=(--test-workspace=true)
      ;;
    --rights) files+=(src/frontdoor/rights.rs src/frontdoor/status.rs src/frontdoor/native.rs) ;;
    --links)
      files+=(src/editor/taken.rs src/editor/inbound.rs src/editor/dial.rs)
      targets=(--lib --test suite)
      filters=(-- editor_quirks:: broker_core:: faults:: editor::)
      ;;
    *) files+=("$arg") ;;
  esac
done
[ ${#modules[@]} -eq 0 ] || [ ${#filters[@]} -gt 0 ] || filters=(-- "${modules[@]}")
[ ${#files[@]} -gt 0 ] || files=(src/registry/identity.rs src/registry/router.rs crates/protocol/src/pathmap.rs src/editor/lockfile.rs)
args=()
for f in "${files[@]}"; do args+=(-f "$f"); done
for t in "${targets[@]}"; do args+=("--cargo-arg=$t"); done
mkdir -p target # cargo-mutants writes its report under target/mutants, even on a fresh clone
# No debug info: linking each mutant's test binary is most of its time. The dependencies are
# built once, in target/mutants-target, not again in each run's copy of the tree; and the copy
# reads this checkout's git (build.rs watches HEAD: without it every cargo call rebuilt the
# crate, so each mutant was compiled twice).
# Two runs at once need a report and a target directory each: MUTANTS_OUT, MUTANTS_TARGET.
out="${MUTANTS_OUT:-target/mutants}"
mkdir -p "$out"
GIT_DIR="$(git rev-parse --absolute-git-dir)" CARGO_TARGET_DIR="${MUTANTS_TARGET:-$PWD/target/mutants-target}" \
  CARGO_PROFILE_TEST_DEBUG=0 CARGO_PROFILE_DEV_DEBUG=0 \
  "$root/bin/cargo-mutants" mutants "${args[@]}" "${workspace[@]}" "${extra[@]}" --timeout 60 --build-timeout 900 -o "$out" -- "${filters[@]}"
