#!/usr/bin/env python3
"""Latency of POST /v1/messages seen by a plain keep-alive client (Python's
http.client), beside wrk's figure in benches/http.sh: CONNS threads, each
sending N raw 4 KiB messages with their own Idempotency-Key, one at a time.

  benches/http_latency.py URL TOKEN [CONNS] [N]

Prints one line: requests, p50/p90/p99/max in ms, and how many took over
100 ms. Exits 1 if any answer is not 202."""

import http.client
import sys
import threading
import time
import urllib.parse
import uuid

url, token = sys.argv[1], sys.argv[2]
conns = int(sys.argv[3]) if len(sys.argv) > 3 else 8
per_conn = int(sys.argv[4]) if len(sys.argv) > 4 else 400
target = urllib.parse.urlsplit(url)
body = ("From: bench@example.test\r\nTo: sink@example.test\r\nSubject: latency\r\n\r\n"
        + "x" * 4000 + "\r\n").encode()
latencies, failures, lock = [], [], threading.Lock()


def run():
    c = http.client.HTTPConnection(target.hostname, target.port)
    mine, bad = [], 0
    for _ in range(per_conn):
        t = time.perf_counter()
        c.request("POST", "/v1/messages?from=bench%40example.test&to=sink%40example.test", body,
                  {"Authorization": "Bearer " + token, "Content-Type": "message/rfc822",
                   "Idempotency-Key": str(uuid.uuid4())})
        r = c.getresponse()
        r.read()
        mine.append(time.perf_counter() - t)
        bad += r.status != 202
    with lock:
        latencies.extend(mine)
        failures.append(bad)


threads = [threading.Thread(target=run) for _ in range(conns)]
for t in threads:
    t.start()
for t in threads:
    t.join()
latencies.sort()
n = len(latencies)
ms = [latencies[n // 2], latencies[int(n * 0.9)], latencies[int(n * 0.99)], latencies[-1]]
print("http.client x%d: %d requests, p50 %.2f p90 %.2f p99 %.2f max %.2f ms, over 100 ms: %d, non-202: %d"
      % (conns, n, *(x * 1000 for x in ms), sum(x > 0.1 for x in latencies), sum(failures)))
sys.exit(1 if sum(failures) else 0)
