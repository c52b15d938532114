#!/usr/bin/env python3
"""Daemon memory under a wrong-password storm (issue 8), printed, never asserted.

  benches/auth_memory.py [--bin target/debug/smtp-once] [--clients 200] [--guesses 3]
                         [--distinct-ips] [--auth-extra 'failure_delay = "0s"']

Starts the real daemon on 127.0.0.1 with one account and a plaintext
listener (allow_plaintext), then:
1. idle:  VmRSS once it is listening and settled;
2. storm: --clients connections at once, each sending --guesses wrong
   passwords (AUTH PLAIN) and reading each reply (a 421 ends it);
3. after: VmRSS a few seconds after the last client has gone.
Peak is VmHWM. --distinct-ips gives each client its own source address in
127.0.0.0/8, so a per-address ban does not stop the storm early (the hashing
pool, not the throttle, is what is measured). --auth-extra adds lines to
[auth] (leave it empty for a daemon that predates those keys).
Target (issue 8): peak < idle + 64 MiB, after < idle + 16 MiB.
"""
import argparse, base64, os, socket, subprocess, sys, tempfile, threading, time, collections

def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) / 1024
    return out

def reply(f):
    while True:
        line = f.readline()
        if not line:
            return b"EOF"
        if line[3:4] != b"-":
            return line

def client(i, port, guesses, distinct, codes, start):
    try:
        s = socket.socket()
        if distinct:
            s.bind((f"127.0.{1 + i // 250}.{1 + i % 250}", 0))
        s.connect(("127.0.0.1", port))
        f = s.makefile("rb")
        greeting = reply(f)
        if not greeting.startswith(b"220"):
            codes[greeting[:3].decode(errors="replace")] += 1
            return
        s.sendall(b"EHLO storm.test\r\n")
        reply(f)
        start.wait()
        token = base64.b64encode(b"\0alice\0wrong-password")
        for _ in range(guesses):
            s.sendall(b"AUTH PLAIN " + token + b"\r\n")
            r = reply(f)
            codes[r[:3].decode(errors="replace")] += 1
            if not r.startswith((b"535", b"454")):
                break
        s.close()
    except OSError as e:
        codes[f"error {e.__class__.__name__}"] += 1

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/debug/smtp-once")
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--guesses", type=int, default=3)
    ap.add_argument("--distinct-ips", action="store_true")
    ap.add_argument("--auth-extra", default="")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds before the 'after' reading")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="auth-memory-")
    hashed = subprocess.run([a.bin, "hash-password"], input=b"alice-pw\n",
                            capture_output=True, check=True).stdout.decode().strip()
    config = os.path.join(tmp, "smtp-once.toml")
    with open(config, "w") as f:
        f.write(f"""[server]
hostname = "bench.test"
data_dir = "{tmp}/data"
max_connections = {a.clients + 50}

[[listener]]
addr = "127.0.0.1:0"
tls = "none"

[auth]
allow_plaintext = true
{a.auth_extra}

[[user]]
name = "alice"
password_hash = "{hashed}"
workspace = "bench"

[relay]
mode = "file"
dir = "{tmp}/outbox"

[limits]
max_connections_per_ip = {a.clients + 50}
""")
    log = open(os.path.join(tmp, "daemon.log"), "w")
    daemon = subprocess.Popen([a.bin, "serve", "--config", config], stdout=subprocess.PIPE,
                              stderr=log, env={**os.environ, "RUST_LOG": "warn"})
    try:
        port = None
        for line in daemon.stdout:
            line = line.decode()
            if line.startswith("smtp-once listening on "):
                port = int(line.split()[3].rsplit(":", 1)[1])
                break
        if port is None:
            sys.exit(f"daemon did not start; see {tmp}/daemon.log")
        time.sleep(1.0)
        idle = status(daemon.pid)["VmRSS"]
        codes = collections.Counter()
        start = threading.Event()
        threads = [threading.Thread(target=client, args=(i, port, a.guesses, a.distinct_ips, codes, start))
                   for i in range(a.clients)]
        t0 = time.time()
        for t in threads:
            t.start()
        time.sleep(0.5)
        start.set()
        for t in threads:
            t.join()
        storm = time.time() - t0
        peak = status(daemon.pid)["VmHWM"]
        time.sleep(a.settle)
        after = status(daemon.pid)["VmRSS"]
        print(f"binary   {a.bin}")
        print(f"clients  {a.clients} x {a.guesses} wrong passwords, distinct source IPs: {a.distinct_ips}")
        print(f"[auth]   {a.auth_extra.strip() or '(defaults)'}")
        print(f"replies  {dict(sorted(codes.items()))} in {storm:.1f} s")
        print(f"idle RSS {idle:7.1f} MiB")
        print(f"peak HWM {peak:7.1f} MiB  (+{peak - idle:.1f}, target < +64)")
        print(f"after    {after:7.1f} MiB  (+{after - idle:.1f}, target < +16), {a.settle:.0f} s after the storm")
    finally:
        daemon.terminate()
        daemon.wait()

if __name__ == "__main__":
    main()
