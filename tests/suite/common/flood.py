"""Holds idle connections to a TCP port and a Unix socket, reopening each one the server
closes, until its stdin closes: a local user flooding the broker's doors from another
process. Prints "ready N M" once every connection has been opened once.

usage: flood.py PORT TCP_COUNT SOCKET UNIX_COUNT
"""
import os
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
reopened = 0


def open_one(kind):
    s = socket.socket(socket.AF_INET if kind == "tcp" else socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.5)
    try:
        s.connect(("127.0.0.1", port) if kind == "tcp" else path)
    except OSError:
        s.close()
        return False
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ, kind)
    return True


for kind, count in (("tcp", tcp_count), ("unix", unix_count)):
    opened = 0
    deadline = time.monotonic() + 20
    while opened < count and time.monotonic() < deadline:
        opened += open_one(kind)
print("ready", len(sel.get_map()) - 1, flush=True)
end = time.monotonic() + 120  # bounded: stops by itself
while time.monotonic() < end:
    for key, _ in sel.select(timeout=1):
        if key.data == "stdin":
            if not os.read(sys.stdin.fileno(), 4096):
                print("reopened", reopened, flush=True)
                sys.exit(0)
            continue
        s = key.fileobj
        try:
            data = s.recv(4096)
        except OSError:
            data = b""
        if not data:
            sel.unregister(s)
            s.close()
            if open_one(key.data):
                reopened += 1
print("reopened", reopened, flush=True)
