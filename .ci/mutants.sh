#!/usr/bin/env bash
# Mutation testing of the core (issue 40): cargo-mutants over the modules that decide where
# things go and what is trusted, against the lib tests (the registry's model test included),
# which run in about 15 s. Not in .ci/run: each mutant is a rebuild (7-10 s incremental here),
# so the four core modules (identity, router, pathmap, lockfile: about 220 mutants) take about
# an hour on this 2-core machine. Results and the missed mutants' fate: .ci/mutants.md.
#   bash .ci/mutants.sh                      # the four core modules
#   bash .ci/mutants.sh --follow             # the ACP agent and session::follow (lib tests:
#                                            # their sans-IO and model tests; ~20 s a mutant)
#   bash .ci/mutants.sh --links              # editor::taken, inbound, dial, against the lib
#                                            # tests and the suite modules that drive them
#                                            # (editor_quirks, broker_core, faults): ~1.5 min
#                                            # a mutant here, about 3 h for the three files
#   bash .ci/mutants.sh --rights             # who may do what: frontdoor::rights, status
#                                            # (what an agent sees) and native (the door's
#                                            # checks), against the lib tests (issue 61)
#   bash .ci/mutants.sh src/registry/router.rs ...    # the files given (lib tests)
set -euo pipefail
cd "$(dirname "$0")/.."
version=27.1.0
root="${PI_IDE_BROKER_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pi-ide-broker-ci}/cargo-mutants-$version"
if [ ! -x "$root/bin/cargo-mutants" ]; then
  cargo install --locked --root "$root" "cargo-mutants@$version"
fi
tests=(--lib)
case "${1:-}" in
  --follow) files=(src/cli/acp/agent.rs src/session/follow.rs) ;;
  --rights) files=(src/frontdoor/rights.rs src/frontdoor/status.rs src/frontdoor/native.rs) ;;
  --links)
    files=(src/editor/taken.rs src/editor/inbound.rs src/editor/dial.rs)
    tests=(--lib --test suite -- editor_quirks:: broker_core:: faults:: editor::)
    ;;
  *) files=("$@") ;;
esac
[ ${#files[@]} -gt 0 ] || files=(src/registry/identity.rs src/registry/router.rs src/protocol/pathmap.rs src/editor/lockfile.rs)
args=()
for f in "${files[@]}"; do args+=(-f "$f"); done
mkdir -p target # cargo-mutants writes its report under target/mutants, even on a fresh clone
# No debug info: linking each mutant's test binary is most of its time.
CARGO_PROFILE_TEST_DEBUG=0 CARGO_PROFILE_DEV_DEBUG=0 \
  "$root/bin/cargo-mutants" mutants "${args[@]}" --timeout 60 --build-timeout 900 -o target/mutants -- "${tests[@]}"
