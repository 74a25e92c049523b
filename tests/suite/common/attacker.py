"""The attacker of tests/suite/attacks.rs, run in a container's place (`unshare --mount`).

  flood SOCK N   opens N `GET /v1/events` connections and keeps those answered 200; prints
                 `flood held=<n> refused=<n> pending=<n> failed=<n>` (refused: another
                 answer; pending: none within 3 s, never accepted); on `close K` from stdin closes K of
                 them (`closed K`); on `quit`, ends.
  race SOCK      a child connects, queues `GET /v1/pi-sessions?cwd=/`, and exits; the parent
                 keeps the connection: prints `child <pid>` once the child is reaped, then on
                 `read` from stdin prints `status <code>` (0: no answer).
"""
import os
import selectors
import socket
import sys
import time


def request(path):
    return f"GET {path} HTTP/1.1\r\nHost: pi-ide-broker\r\n\r\n".encode()


def status_of(sock, timeout=5.0):
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    line = data.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) > 1 and line[1].isdigit() else 0


def flood(path, n):
    held, failed = [], 0
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(path)
            s.sendall(request("/v1/events"))
        except OSError:
            failed += 1
            s.close()
            continue
        s.setblocking(False)
        held.append(s)
    # Every connection was queued at once; now read what each got, for three seconds at most
    # in all (a connection the daemon never accepts stays pending).
    sel = selectors.DefaultSelector()
    for s in held:
        sel.register(s, selectors.EVENT_READ, b"")
    codes = {}
    deadline = time.monotonic() + 3.0
    while len(codes) < len(held) and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
            s = key.fileobj
            try:
                chunk = s.recv(4096)
            except OSError:
                chunk = b""
            data = key.data + chunk
            if b"\r\n" in data or not chunk:
                line = data.split(b"\r\n", 1)[0].split()
                codes[s] = int(line[1]) if len(line) > 1 and line[1].isdigit() else 0
                sel.unregister(s)
            else:
                sel.modify(s, selectors.EVENT_READ, data)
    kept = [s for s in held if codes.get(s) == 200]
    refused = sum(1 for s in held if s in codes and codes[s] != 200)
    pending = sum(1 for s in held if s not in codes)
    for s in held:
        if codes.get(s) != 200:
            s.close()
    print(f"flood held={len(kept)} refused={refused} pending={pending} failed={failed}", flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["close"]:
            k = int(words[1])
            for s in kept[:k]:
                s.close()
            kept = kept[k:]
            print(f"closed {k}", flush=True)
        elif words[:1] == ["quit"]:
            break


def race(path):
    s = socket.socket(socket.AF_UNIX)
    pid = os.fork()
    if pid == 0:
        # The child connects the shared socket (the kernel notes the child's pid as the peer),
        # queues a request, and exits.
        try:
            s.connect(path)
            s.sendall(request("/v1/pi-sessions?cwd=/"))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    print(f"child {pid}", flush=True)
    for line in sys.stdin:
        if line.strip() == "read":
            print(f"status {status_of(s)}", flush=True)
            return


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "flood":
        flood(path, int(sys.argv[3]))
    else:
        race(path)
