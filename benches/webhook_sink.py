#!/usr/bin/env python3
"""A fast webhook endpoint for benches/webhooks.sh: answers every POST 204
at once over keep-alive HTTP/1.1 and measures, per event, the time from the
state change (the payload's `timestamp`) to its arrival here.

    python3 benches/webhook_sink.py --port 0 --stats stats.json

Prints `listening on HOST:PORT`; writes the stats as JSON on SIGTERM/SIGINT
(events, distinct webhook-ids, per type, latency p50/p90/p99/max in ms).
No signature check: this measures the sender, not a receiver.
"""
import argparse
import asyncio
import json
import signal
import time
from datetime import datetime

latencies = []
ids = set()
per_type = {}


def event_time(ts):
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            webhook_id = None
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value.strip())
                elif name == b"webhook-id":
                    webhook_id = value.strip()
            body = await reader.readexactly(length)
            now = time.time()
            writer.write(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
            try:
                event = json.loads(body)
                latencies.append((now - event_time(event["timestamp"])) * 1000.0)
                per_type[event["type"]] = per_type.get(event["type"], 0) + 1
            except (ValueError, KeyError):
                pass
            if webhook_id:
                ids.add(webhook_id)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


def pct(sorted_values, p):
    if not sorted_values:
        return None
    return round(sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * p))], 1)


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--stats", required=True)
    args = ap.parse_args()
    server = await asyncio.start_server(handle, args.host, args.port, backlog=1024)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"listening on {host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    values = sorted(latencies)
    with open(args.stats, "w") as f:
        json.dump(
            {
                "events": len(values),
                "distinct_ids": len(ids),
                "per_type": per_type,
                "latency_ms": {
                    "p50": pct(values, 0.50),
                    "p90": pct(values, 0.90),
                    "p99": pct(values, 0.99),
                    "max": round(values[-1], 1) if values else None,
                },
            },
            f,
        )


asyncio.run(main())
