#!/usr/bin/env python3
"""Memory figures for smtp-once (issue 5 targets), printed, never asserted.

  benches/memory.py --pid PID --server 127.0.0.1:PORT [--idle 1000] [--big 32] [--big-size 1048576]

1. Opens --idle connections that only read the greeting and stay idle, then
   reads the daemon's RSS (VmRSS and VmHWM from /proc/PID/status).
2. Sends --big messages of --big-size bytes at once, each on its own
   connection (plaintext, trusted network or --auth user:pass), and reports
   the peak RSS while they are in flight.
"""
import argparse, base64, socket, threading, time

def rss(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                fields[k] = int(v.split()[0]) / 1024
    return fields

def read_reply(sock_file):
    while True:
        line = sock_file.readline()
        if not line:
            raise ConnectionError("closed")
        if line[3:4] != b"-":
            return line

def connect(host, port):
    s = socket.create_connection((host, port))
    f = s.makefile("rb")
    read_reply(f)
    return s, f

def send_big(host, port, size, auth, key, results):
    try:
        s, f = connect(host, port)
        def cmd(line):
            s.sendall(line + b"\r\n")
            return read_reply(f)
        cmd(b"EHLO mem.test")
        if auth:
            user, pw = auth.split(":", 1)
            cmd(b"AUTH PLAIN " + base64.b64encode(f"\0{user}\0{pw}".encode()))
        cmd(b"MAIL FROM:<bench@example.test> SIZE=%d" % size)
        cmd(b"RCPT TO:<sink@example.test>")
        cmd(b"DATA")
        head = f"From: bench@example.test\r\nX-Bird-Idempotency-Key: {key}\r\n\r\n".encode()
        line = b"x" * 998 + b"\r\n"
        body = line * max(1, (size - len(head)) // len(line))
        s.sendall(head + body + b".\r\n")
        results.append(read_reply(f)[:3].decode())
        s.close()
    except Exception as e:  # report, don't hide
        results.append(f"error: {e}")

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--server", default="127.0.0.1:2525")
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--big", type=int, default=32)
    ap.add_argument("--big-size", type=int, default=1 << 20)
    ap.add_argument("--auth")
    a = ap.parse_args()
    host, port = a.server.rsplit(":", 1)
    port = int(port)

    base = rss(a.pid)
    print(f"baseline             RSS {base['VmRSS']:.1f} MiB")
    idle = [connect(host, port) for _ in range(a.idle)]
    time.sleep(0.5)
    r = rss(a.pid)
    print(f"{a.idle} idle connections RSS {r['VmRSS']:.1f} MiB (target < 64 MiB)")
    for s, _ in idle:
        s.close()
    time.sleep(0.5)

    results, peak = [], 0.0
    stamp = int(time.time())
    threads = [threading.Thread(target=send_big, args=(host, port, a.big_size, a.auth, f"mem-{stamp}-{i}", results)) for i in range(a.big)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss(a.pid)["VmRSS"])
        time.sleep(0.005)
    peak = max(peak, rss(a.pid)["VmRSS"])
    codes = {c: results.count(c) for c in set(results)}
    print(f"{a.big} concurrent {a.big_size // 1024} KiB messages: peak RSS {peak:.1f} MiB (target < 200 MiB), replies {codes}")

if __name__ == "__main__":
    main()
