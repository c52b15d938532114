#!/usr/bin/env python3
"""Memory an unauthenticated HTTP client can make the daemon hold (issue 20,
finding 3), printed, never asserted.

  benches/http_unauth_memory.py [--bin target/release/smtp-once] [--conns 8]
                                [--size 26214400]

Starts the daemon itself (max_message_size 25 MiB, [http] on loopback, the
delivery worker paused), reads its RSS (VmRSS, peak VmHWM from
/proc/PID/status), then opens --conns connections that each POST
/v1/messages with no Authorization header and send --size bytes of body as
fast as the daemon takes them, and reads the RSS again while they are
connected and after they are done. Prints one line per phase, and what each
client got back (a 401 before its body is read, or after).
"""
import argparse, os, socket, subprocess, tempfile, threading, time


def status(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                fields[k] = int(v.split()[0]) / 1024
    return fields


def client(addr, size, results, i):
    s = socket.create_connection(addr)
    s.settimeout(120)
    head = (
        "POST /v1/messages?from=a%40x.test&to=b%40y.test HTTP/1.1\r\nHost: b\r\n"
        f"Content-Type: message/rfc822\r\nContent-Length: {size}\r\n\r\n"
    ).encode()
    s.sendall(head)
    chunk = b"x" * 65536
    sent = 0
    try:
        while sent < size:
            n = s.send(chunk[: min(len(chunk), size - sent)])
            sent += n
    except OSError:
        pass  # the daemon answered and closed: the rest was never read
    try:
        answer = s.recv(200).split(b"\r\n", 1)[0].decode(errors="replace")
    except OSError as e:
        answer = f"({e})"
    results[i] = (sent, answer)
    s.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/smtp-once")
    ap.add_argument("--conns", type=int, default=8)
    ap.add_argument("--size", type=int, default=25 * 1024 * 1024)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="smtp-once-unauth-")
    config = os.path.join(work, "smtp-once.toml")
    hash_ = subprocess.run(
        [a.bin, "hash-password"], input=b"pw", capture_output=True, check=True
    ).stdout.decode().strip()
    with open(config, "w") as f:
        f.write(f"""[server]
hostname = "mem.test"
data_dir = "{work}/data"
max_message_size = {a.size}
[[listener]]
addr = "127.0.0.1:0"
tls = "none"
[[user]]
name = "u"
password_hash = "{hash_}"
workspace = "w"
[http]
addr = "127.0.0.1:0"
[relay]
mode = "file"
dir = "{work}/outbox"
paused = true
""")
    out = open(os.path.join(work, "stdout"), "w+")
    daemon = subprocess.Popen(
        [a.bin, "serve", "--config", config], stdout=out, stderr=subprocess.DEVNULL
    )
    try:
        addr = None
        for _ in range(200):
            out.seek(0)
            for line in out.read().splitlines():
                if line.startswith("smtp-once http on "):
                    host, port = line.rsplit(" ", 1)[1].rsplit(":", 1)
                    addr = (host, int(port))
            if addr:
                break
            time.sleep(0.05)
        assert addr, "the daemon did not start"
        time.sleep(0.5)
        idle = status(daemon.pid)
        results = [None] * a.conns
        threads = [
            threading.Thread(target=client, args=(addr, a.size, results, i))
            for i in range(a.conns)
        ]
        peak_during = 0.0
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            peak_during = max(peak_during, status(daemon.pid)["VmRSS"])
            time.sleep(0.05)
        after = status(daemon.pid)
        print(f"binary {a.bin}: {a.conns} unauthenticated clients x {a.size / 2**20:.0f} MiB")
        print(f"  RSS idle {idle['VmRSS']:.0f} MiB; highest while they sent {peak_during:.0f} MiB; "
              f"after {after['VmRSS']:.0f} MiB (peak VmHWM {after['VmHWM']:.0f} MiB)")
        sent = sum(r[0] for r in results if r)
        answers = sorted({r[1] for r in results if r})
        print(f"  bytes the clients got to send: {sent / 2**20:.1f} MiB; answers: {answers}")
    finally:
        daemon.terminate()
        daemon.wait()


if __name__ == "__main__":
    main()
