#!/usr/bin/env python3
"""Waits until an mx.sh run's relay has relayed every acknowledged message.

Used by benches/mx.sh. Both ends are smtp-once on SQLite: the relay under
test (--relay-db) and the next hop it relays to, a second smtp-once with
`[relay] paused = true` that only queues (--sink-db). Once the load is over
(--expect-file exists and holds the load's 250 replies; without it,
--expect) it reads the relay's queue every 20 ms (read-only): the run is
done when no row is queued, deferred or delivering and the rows in state
'delivered' reached that number. It then counts the sink's queue rows
once: the relay records a recipient as delivered only after the sink's
250, which the sink sends only after its commit, so by then the sink holds
every message.

Prints one JSON object: done (bool), t_done (epoch seconds when the relay
was first seen done), relayed (delivered rows), pending (whether a row was
still queued, deferred or delivering at the end), sink (the sink's queue
rows), waited (seconds). Each run of mx.sh has fresh data directories, so
every count starts at 0.
"""

import argparse
import json
import sqlite3
import sys
import time

POLL = 0.02


def connect(path):
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)


def pending(db):
    """Any row still queued, deferred or delivering (the queue_due index)."""
    return db.execute(
        "SELECT EXISTS (SELECT 1 FROM queue WHERE state IN ('queued', 'deferred', 'delivering'))"
    ).fetchone()[0]


def delivered(db):
    return db.execute("SELECT COUNT(*) FROM queue WHERE state = 'delivered'").fetchone()[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--relay-db", required=True)
    ap.add_argument("--sink-db", required=True)
    ap.add_argument("--expect", type=int, default=0)
    ap.add_argument("--expect-file")
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()

    relay = connect(a.relay_db)
    t_start = time.time()
    deadline = t_start + a.timeout
    expect, expect_known = a.expect, a.expect_file is None
    t_done = None
    relayed, busy = 0, True
    while True:
        if not expect_known:
            try:
                with open(a.expect_file) as f:
                    expect = int(f.read())
                expect_known = True
            except (FileNotFoundError, ValueError):
                pass
        # Nothing to ask the relay before the load is over (the run cannot
        # be done before the last 250), and afterwards only whether a row
        # is pending, an index lookup: this poll shares the 2 cores.
        if expect_known:
            try:
                busy = pending(relay)
                if not busy:
                    relayed = delivered(relay)
            except sqlite3.OperationalError:
                busy = True  # a lock: the next poll
            if not busy and relayed >= expect:
                t_done = time.time()
                break
        if time.time() > deadline:
            break
        time.sleep(POLL)

    sink = connect(a.sink_db).execute("SELECT COUNT(*) FROM queue").fetchone()[0]
    if t_done is None:
        try:
            relayed, busy = delivered(relay), pending(relay)
        except sqlite3.OperationalError:
            pass
    print(json.dumps({"done": t_done is not None, "t_done": t_done, "relayed": relayed,
                      "pending": bool(busy), "sink": sink, "waited": time.time() - t_start}))


if __name__ == "__main__":
    sys.exit(main())
