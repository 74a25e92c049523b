"""Holds idle connections to a TCP port and a Unix socket, reopening each one the server
closes, until its stdin closes: a local user flooding the broker's doors from another
process. Each reopen is a connect that waits (at most 100 ms) for the server's backlog to
take it, as a simple client's does; one that times out is retried on the next turn. Between
reopens it looks at its stdin, so it stops as soon as it is told. Prints "ready N" once every
connection has been opened once, and "reopened N" when it stops.

usage: flood.py PORT TCP_COUNT SOCKET UNIX_COUNT
"""
import os
import select
import resource
import selectors
import socket
import sys
import time

port, tcp_count, path, unix_count = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
want = tcp_count + unix_count + 64
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < want:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(want, soft), hard), hard))

sel = selectors.DefaultSelector()
sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
owed = {"tcp": tcp_count, "unix": unix_count}
reopened = 0


def open_one(kind):
    """Starts one connection; False when the server cannot take it yet."""
    s = socket.socket(socket.AF_INET if kind == "tcp" else socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.1)
    try:
        s.connect(("127.0.0.1", port) if kind == "tcp" else path)
    except OSError:
        s.close()
        return False
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ, kind)
    return True


def told_to_stop():
    """True once stdin has closed (looked at without waiting)."""
    if not select.select([sys.stdin], [], [], 0)[0]:
        return False
    return not os.read(sys.stdin.fileno(), 4096)


def open_owed(stop_check=False):
    """Opens the connections owed, until the server's backlog takes no more this turn; None
    when told to stop meanwhile."""
    opened = 0
    for kind in owed:
        while owed[kind] > 0:
            if stop_check and opened % 32 == 0 and told_to_stop():
                return None
            if not open_one(kind):
                break
            owed[kind] -= 1
            opened += 1
    return opened


deadline = time.monotonic() + 20
while sum(owed.values()) > 0 and time.monotonic() < deadline:
    open_owed()
print("ready", len(sel.get_map()) - 1, flush=True)
end = time.monotonic() + 120  # bounded: stops by itself
while time.monotonic() < end:
    events = sel.select(timeout=0.05)
    if any(key.data == "stdin" for key, _ in events) and told_to_stop():
        break
    for key, _ in events:
        if key.data == "stdin":
            continue
        s = key.fileobj
        try:
            data = s.recv(4096)
        except OSError:
            data = b""
        if not data:
            sel.unregister(s)
            s.close()
            owed[key.data] += 1
    opened = open_owed(stop_check=True)
    if opened is None:
        break
    reopened += opened
print("reopened", reopened, flush=True)
