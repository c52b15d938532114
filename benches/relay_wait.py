#!/usr/bin/env python3
"""Waits until a relaying peer has relayed a run's messages to its smtp-sink.

Used by benches/compare.sh for the end-to-end peers (smtp-once-relay,
postfix-relay). The sink appends every transaction it receives to a dump
file (`smtp-sink -D`); this script reads what was added since the last call
(the offset is kept in STATE), takes each `X-Bird-Idempotency-Key` header
from it, appends the keys to KEYS (one a line, the whole benchmark's tally)
and frees the bytes it has read (FALLOC_FL_PUNCH_HOLE), so the dump file
never holds more than a few runs' worth of memory or disk.

A run is done when the sink has received EXPECT messages (or the number
in --expect-file, once that exists) since the last
call and the peer has recorded them as relayed:
  --smtp-once-db DB      rows in state 'delivered' grew by EXPECT and no row
                         is queued, deferred or delivering
  --postfix-queue DIR    Postfix logged EXPECT more `status=sent` lines in
                         --postfix-log and its incoming/active/deferred/hold
                         queues are empty

It prints one JSON object: done (bool), t_done (epoch seconds when both were
first seen, polled every 20 ms), sink (messages this run), sink_keys (key
headers this run), recorded (the peer's count this run), waited (seconds).

`--final` reads what is left and prints the whole tally instead: received
(key headers in KEYS), distinct (distinct keys), duplicates.
"""

import argparse
import ctypes
import json
import os
import re
import sqlite3
import sys
import time

# Both start with a literal newline rather than `^` under re.M, so the regex
# engine scans for the literal prefix: several times faster, which matters
# because this runs on the same 2 cores as the relay it measures.
KEY_RE = re.compile(rb"\nX-Bird-Idempotency-Key:[ \t]*(\S+)[ \t]*\r?\n")
# smtp-sink starts every dumped transaction with this header.
TXN_MARK = b"\nX-Client-Addr: "
SENT_RE = re.compile(rb" status=sent ")
POLL = 0.02
CHUNK = 8 << 20
FALLOC_FL_KEEP_SIZE = 1
FALLOC_FL_PUNCH_HOLE = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def punch(fd, start, end):
    if end > start:
        # Best effort: a filesystem without hole punching just keeps the bytes.
        _libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, start, end - start)


class Dump:
    """Incremental reader of the sink's dump file (only whole lines)."""

    def __init__(self, path, offset, keys_path):
        self.path = path
        self.offset = offset
        self.fd = None
        self.keys = open(keys_path, "ab")
        self.txns = 0
        self.nkeys = 0

    def poll(self):
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDWR)
            except FileNotFoundError:
                return
        start = self.offset
        while True:
            data = os.pread(self.fd, CHUNK, self.offset)
            if not data:
                break
            end = data.rfind(b"\n") + 1
            if end == 0:
                break  # a partial line: the rest comes later
            # The line before (or the file's start) ends in a newline.
            data = b"\n" + data[:end]
            self.txns += data.count(TXN_MARK)
            keys = KEY_RE.findall(data)
            self.nkeys += len(keys)
            if keys:
                self.keys.write(b"\n".join(keys) + b"\n")
            self.offset += end
        if self.offset > start:
            self.keys.flush()
            punch(self.fd, start, self.offset)


def smtp_once_counts(db):
    delivered = db.execute("SELECT COUNT(*) FROM queue WHERE state = 'delivered'").fetchone()[0]
    pending = db.execute(
        "SELECT COUNT(*) FROM queue WHERE state IN ('queued', 'deferred', 'delivering')"
    ).fetchone()[0]
    return delivered, pending


def postfix_pending(qdir):
    n = 0
    for sub in ("maildrop", "incoming", "active", "deferred", "hold"):
        for _root, _dirs, files in os.walk(os.path.join(qdir, sub)):
            n += len(files)
    return n


class SentLog:
    def __init__(self, path, offset):
        self.path, self.offset, self.sent = path, offset, 0

    def poll(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self.sent += len(SENT_RE.findall(data[:end]))
        self.offset += end


def load_state(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--keys", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--expect", type=int, default=0)
    # Written once the load is over: the number of 250s, which replaces --expect.
    ap.add_argument("--expect-file")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--smtp-once-db")
    ap.add_argument("--postfix-queue")
    ap.add_argument("--postfix-log")
    ap.add_argument("--final", action="store_true")
    a = ap.parse_args()

    state = load_state(a.state)
    dump = Dump(a.dump, state.get("dump_offset", 0), a.keys)

    if a.final:
        dump.poll()
        with open(a.keys, "rb") as f:
            keys = f.read().split()
        state["dump_offset"] = dump.offset
        save_state(a.state, state)
        print(json.dumps({"received": len(keys), "distinct": len(set(keys)),
                          "duplicates": len(keys) - len(set(keys))}))
        return

    db = sentlog = None
    if a.smtp_once_db:
        db = sqlite3.connect(f"file:{a.smtp_once_db}?mode=ro", uri=True, timeout=30)
        delivered0 = state.get("delivered", 0)
    else:
        sentlog = SentLog(a.postfix_log, state.get("log_offset", 0))

    t_start = time.time()
    deadline = t_start + a.timeout
    t_done = None
    recorded = 0
    expect = a.expect
    expect_known = a.expect_file is None
    while True:
        if not expect_known:
            try:
                with open(a.expect_file) as f:
                    expect = int(f.read())
                expect_known = True
            except (FileNotFoundError, ValueError):
                pass
        dump.poll()
        if dump.txns >= expect:
            if db is not None:
                delivered, pending = smtp_once_counts(db)
                recorded = delivered - delivered0
                ok = recorded >= expect and pending == 0
            else:
                sentlog.poll()
                recorded = sentlog.sent
                ok = recorded >= expect and postfix_pending(a.postfix_queue) == 0
            if ok:
                t_done = time.time()
                break
        if time.time() > deadline:
            break
        time.sleep(POLL)

    state["dump_offset"] = dump.offset
    if db is not None:
        state["delivered"] = delivered0 + recorded
    else:
        state["log_offset"] = sentlog.offset
    save_state(a.state, state)
    print(json.dumps({"done": t_done is not None, "t_done": t_done, "sink": dump.txns,
                      "sink_keys": dump.nkeys, "recorded": recorded,
                      "waited": time.time() - t_start}))


def save_state(path, state):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
