#!/usr/bin/env python3
"""Prints the longest functions in src/ and crates/*/src/ outside tests, and fails when one is over the limit.

A function is measured from its `fn` line to its closing brace (blank and comment lines
count: they are part of what a reader reads). Code under `#[cfg(test)]` (test modules and
`tests.rs` files) is skipped, and so is `src/testkit/`, which only tests build.

usage: long-functions.py [--limit N] [--top K] [--report-only]

--report-only prints the same and exits 0. .ci/run runs it without, so a function over the
limit fails CI (issue 27).
"""
import argparse
import pathlib
import re
import sys

FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)")


def strip_strings(line):
    """The line without string and char literals and `//` comments (braces inside them do not count)."""
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    return line.split("//", 1)[0]


def functions(path):
    lines = path.read_text().splitlines()
    i = 0
    skip_depth = None  # brace depth at which a #[cfg(test)] item ends
    depth = 0
    pending_cfg_test = False
    stack = []  # (name, start line, depth at its opening brace)
    out = []
    in_raw = False
    while i < len(lines):
        raw = lines[i]
        if '#[cfg(test)]' in raw:
            pending_cfg_test = True
        code = strip_strings(raw)
        m = FN.match(raw)
        if m and skip_depth is None and not pending_cfg_test:
            stack.append([m.group(6), i + 1, None])
        for ch in code:
            if ch == "{":
                depth += 1
                if pending_cfg_test and skip_depth is None:
                    skip_depth = depth
                    pending_cfg_test = False
                if stack and stack[-1][2] is None:
                    stack[-1][2] = depth
            elif ch == "}":
                if stack and stack[-1][2] == depth:
                    name, start, _ = stack.pop()
                    out.append((i + 1 - start + 1, name, start))
                if skip_depth == depth:
                    skip_depth = None
                depth -= 1
        if pending_cfg_test and code.strip().endswith(";"):
            pending_cfg_test = False  # `#[cfg(test)] mod tests;`
        # A declaration without a body (trait method) never opens a brace.
        if stack and stack[-1][2] is None and code.strip().endswith(";"):
            stack.pop()
        i += 1
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    repo = pathlib.Path(__file__).resolve().parent.parent
    found = []
    sources = [*sorted((repo / "src").rglob("*.rs")), *sorted((repo / "crates").glob("*/src/**/*.rs"))]
    for path in sources:
        rel = path.relative_to(repo)
        if path.name == "tests.rs" or "testkit" in path.parts:
            continue
        for length, name, start in functions(path):
            found.append((length, f"{rel}:{start}", name))
    found.sort(reverse=True)
    print(f"the {args.top} longest functions in src/ and crates/ (outside tests):")
    for length, where, name in found[: args.top]:
        mark = "  over the limit" if length > args.limit else ""
        print(f"  {length:4d}  {name}  ({where}){mark}")
    over = [f for f in found if f[0] > args.limit]
    if over:
        print(f"{len(over)} function(s) over {args.limit} lines: split them into named steps", file=sys.stderr)
        return 0 if args.report_only else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
