#!/usr/bin/env python3
"""Memory held by unfinished messages (issue 8), printed, never asserted.

  benches/in_flight_memory.py [--bin target/debug/smtp-once] [--conns 16]
                              [--size 25165824] [--bdat-conns 200]

Starts the daemon itself, on a fresh data directory per scenario, with the
default [limits] (max_bytes_in_flight 512 MiB, per account 128 MiB) and
max_message_size 25 MiB, and the delivery worker idle (so the figures are
the acceptance side's alone), and reports the daemon's RSS (VmRSS, peak VmHWM)
and virtual size (VmSize) from /proc/PID/status:

1. trusted: --conns connections from a trusted network each send --size
   bytes of DATA and stop before the final dot (only the global budget
   applies); then each sends the dot and the replies are counted.
2. account: the same, all logged in as one account (the per-account
   budget applies).
3. bdat: --bdat-conns connections each announce `BDAT 26214000` and send
   1 KiB of it.
"""
import argparse, base64, os, socket, subprocess, sys, tempfile, threading, time

USER, PASSWORD = "bench", "bench-pw"


def status(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "VmSize"):
                fields[k] = int(v.split()[0]) / 1024
    return fields


def read_reply(f):
    while True:
        line = f.readline()
        if not line:
            raise ConnectionError("closed")
        if line[3:4] != b"-":
            return line


class Conn:
    def __init__(self, addr, auth):
        self.s = socket.create_connection(addr)
        self.f = self.s.makefile("rb")
        read_reply(self.f)
        self.cmd(b"EHLO mem.test")
        if auth:
            token = base64.b64encode(f"\0{USER}\0{PASSWORD}".encode())
            code = self.cmd(b"AUTH PLAIN " + token)[:3]
            assert code == b"235", code

    def cmd(self, line):
        self.s.sendall(line + b"\r\n")
        return read_reply(self.f)

    def transaction(self, size=0):
        size_param = b" SIZE=%d" % size if size else b""
        assert self.cmd(b"MAIL FROM:<bench@example.test>" + size_param)[:3] == b"250"
        assert self.cmd(b"RCPT TO:<sink@example.net>")[:3] == b"250"


def start_daemon(binary, workdir, trusted):
    hashed = subprocess.run([binary, "hash-password"], input=PASSWORD.encode(),
                            capture_output=True, check=True).stdout.decode().strip()
    trusted_block = ('[[trusted_network]]\ncidr = "127.0.0.0/8"\nworkspace = "local"\n'
                     if trusted else "")
    config = f"""[server]
hostname = "relay.test"
data_dir = "{workdir}/data"
max_message_size = 26214400
max_connections = 1000
shutdown_grace = "1s"

[[listener]]
addr = "127.0.0.1:0"
tls = "none"

[auth]
allow_plaintext = true

[[user]]
name = "{USER}"
password_hash = "{hashed}"
workspace = "bench"

{trusted_block}
[relay]
mode = "file"
dir = "{workdir}/outbox"
# Keep the delivery worker out of the figures: it only polls at start.
poll_interval = "1h"

[limits]
max_connections_per_ip = 1000
"""
    path = os.path.join(workdir, "smtp-once.toml")
    with open(path, "w") as f:
        f.write(config)
    log = open(os.path.join(workdir, "daemon.log"), "w")
    proc = subprocess.Popen([binary, "serve", "--config", path], stdout=subprocess.PIPE,
                            stderr=log, env={**os.environ, "RUST_LOG": "warn"})
    for line in proc.stdout:
        line = line.decode()
        if line.startswith("smtp-once listening on "):
            host, port = line.split()[3].rsplit(":", 1)
            return proc, (host, int(port))
    raise RuntimeError("daemon did not start")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settle(pid, quiet=0.02, limit=120):
    """Waits until the daemon is idle (under `quiet` s of CPU per 0.5 s):
    it has read and handled everything sent so far."""
    start, last = time.time(), cpu_seconds(pid)
    while time.time() - start < limit:
        time.sleep(0.5)
        now = cpu_seconds(pid)
        if now - last < quiet:
            break
        last = now
    return status(pid)


def hold(binary, conns, size, trusted):
    with tempfile.TemporaryDirectory() as workdir:
        proc, addr = start_daemon(binary, workdir, trusted)
        try:
            base = status(proc.pid)
            clients = [Conn(addr, auth=not trusted) for _ in range(conns)]
            line = b"x" * 998 + b"\r\n"
            body = b"From: bench@example.test\r\n\r\n" + line * (size // len(line))

            def send(c):
                c.transaction(len(body))
                assert c.cmd(b"DATA")[:3] == b"354"
                c.s.sendall(body)

            threads = [threading.Thread(target=send, args=(c,)) for c in clients]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            held = settle(proc.pid)
            codes = {}
            for c in clients:
                c.s.sendall(b".\r\n")
                code = read_reply(c.f)[:3].decode()
                codes[code] = codes.get(code, 0) + 1
            after = settle(proc.pid)
            who = "trusted network (global budget)" if trusted else "one account (per-account budget)"
            print(f"{conns} x {size / 2**20:.0f} MiB unfinished DATA, {who}:")
            print(f"  idle RSS {base['VmRSS']:.0f} MiB; all sent and read: RSS {held['VmRSS']:.0f} MiB; "
                  f"after the dots: RSS {after['VmRSS']:.0f} MiB, peak VmHWM {after['VmHWM']:.0f} MiB; "
                  f"replies {dict(sorted(codes.items()))}")
        finally:
            proc.kill()
            proc.wait()


def bdat(binary, conns):
    with tempfile.TemporaryDirectory() as workdir:
        proc, addr = start_daemon(binary, workdir, trusted=True)
        try:
            base = status(proc.pid)
            clients = []
            for _ in range(conns):
                c = Conn(addr, auth=False)
                c.transaction()
                c.s.sendall(b"BDAT 26214000\r\n" + b"x" * 1024)
                clients.append(c)
            held = settle(proc.pid)
            print(f"{conns} x BDAT 26214000 with 1 KiB sent:")
            print(f"  VmSize {base['VmSize']:.0f} -> {held['VmSize']:.0f} MiB, "
                  f"RSS {base['VmRSS']:.0f} -> {held['VmRSS']:.0f} MiB")
            for c in clients:
                c.s.close()
        finally:
            proc.kill()
            proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/debug/smtp-once")
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--size", type=int, default=24 * 2**20)
    ap.add_argument("--bdat-conns", type=int, default=200)
    ap.add_argument("--only", choices=["trusted", "account", "bdat"])
    a = ap.parse_args()
    print(f"binary: {a.bin}")
    if a.only in (None, "trusted"):
        hold(a.bin, a.conns, a.size, trusted=True)
    if a.only in (None, "account"):
        hold(a.bin, a.conns, a.size, trusted=False)
    if a.only in (None, "bdat"):
        bdat(a.bin, a.bdat_conns)


if __name__ == "__main__":
    sys.exit(main())
