#!/usr/bin/env python3
"""An example receiver for smtp-once's delivery-status webhooks.

    python3 examples/webhook_receiver.py --secret whsec_... --db receiver.db

smtp-once delivers each event AT LEAST once: a lost answer, a crash or an
operator's `smtp-once webhooks redeliver` sends it again with the same
`webhook-id`. This receiver turns that into exactly-once processing:

1. Verify the signature and timestamp with the reference `standardwebhooks`
   package (pip3 install standardwebhooks). Unverified: 401, nothing stored.
2. In ONE SQLite transaction: record the webhook-id (PRIMARY KEY, so a
   duplicate fails the insert), do the work (here: a `job` row), and move
   `message_state` forward only if the event is newer than what is stored:
   events can arrive out of order (a retried `accepted` after `delivered`).
3. Answer 2xx only after COMMIT. A crash before COMMIT stores nothing and
   smtp-once retries; a crash after COMMIT but before the answer makes
   smtp-once retry an event we already have: the duplicate is answered 200.

Needs: Python 3.11+, standardwebhooks (tested with 1.1.0).
"""

import argparse
import json
import sqlite3
import sys
import threading
import time
from contextlib import closing
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook

SCHEMA = """
CREATE TABLE IF NOT EXISTS processed (webhook_id TEXT PRIMARY KEY, processed_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS job (
    id INTEGER PRIMARY KEY, webhook_id TEXT NOT NULL UNIQUE, event_type TEXT NOT NULL,
    queue_id TEXT, recipient TEXT, event_time INTEGER NOT NULL, payload TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS message_state (
    queue_id TEXT NOT NULL, recipient TEXT NOT NULL, state TEXT NOT NULL,
    event_time INTEGER NOT NULL, rank INTEGER NOT NULL, PRIMARY KEY (queue_id, recipient));
CREATE TABLE IF NOT EXISTS receipt (webhook_id TEXT, received_at REAL NOT NULL, status INTEGER NOT NULL);
"""

# Tie-break for two events of the same millisecond: a final outcome wins
# over `deferred`, which wins over `accepted`.
RANK = {"message.accepted": 0, "message.deferred": 1}


def event_millis(text):
    """RFC 3339 (`2026-12-01T10:00:00.123Z`) to Unix milliseconds."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        webhook_id = self.headers.get("webhook-id")
        try:
            status = self.handle_event(body, webhook_id)
        except Exception as e:  # a bug or a full disk: nothing stored, retry later
            log(f"error {webhook_id}: {e!r}")
            status = 500
        # The attempt log lives outside the event's transaction (its own
        # autocommit), so it also counts attempts that stored nothing. It is
        # written before the answer: once smtp-once has its answer, the
        # receipt is there.
        with closing(db()) as conn:
            conn.execute("INSERT INTO receipt VALUES (?, ?, ?)", (webhook_id, time.time(), status))
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def handle_event(self, body, webhook_id):
        opts = self.server.opts
        # --- test-only knobs: misbehave before doing anything ---
        if opts.status_always:
            return opts.status_always
        with self.server.lock:
            if self.server.failures_left > 0:
                self.server.failures_left -= 1
                return 500
        # --- the real work ---
        try:
            event = Webhook(opts.secret).verify(body, dict(self.headers))
        except Exception as e:  # bad/missing signature, stale timestamp, junk header
            log(f"rejected {webhook_id}: {e}")
            return 401
        data = event["data"]
        at = event_millis(event["timestamp"])
        rank = RANK.get(event["type"], 2)
        recipients = data.get("recipients") or [r for r in [data.get("recipient")] if r]
        conn = db()
        try:
            # IMMEDIATE: take the write lock now, so concurrent requests
            # serialize here instead of failing at COMMIT.
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO processed VALUES (?, ?)", (webhook_id, time.time()))
            conn.execute(
                "INSERT INTO job (webhook_id, event_type, queue_id, recipient, event_time, payload)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (webhook_id, event["type"], data.get("queue_id"), ",".join(recipients), at, body.decode()),
            )
            for rcpt in recipients:
                # Ordered by the event's own time, not by arrival.
                conn.execute(
                    "INSERT INTO message_state VALUES (?, ?, ?, ?, ?)"
                    " ON CONFLICT (queue_id, recipient) DO UPDATE"
                    " SET state = excluded.state, event_time = excluded.event_time, rank = excluded.rank"
                    " WHERE (excluded.event_time, excluded.rank) > (message_state.event_time, message_state.rank)",
                    (data.get("queue_id"), rcpt, event["type"], at, rank),
                )
            conn.execute("COMMIT")
        except sqlite3.IntegrityError:
            # Seen this webhook-id before: the work is done, say so.
            conn.execute("ROLLBACK")
            log(f"duplicate {webhook_id}")
            return 200
        except BaseException:
            if conn.in_transaction:  # nothing stored; 500 and smtp-once retries
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()
        log(f"committed {webhook_id}")
        if opts.hold_after_commit:
            with self.server.lock:  # test-only: hold one answer, once
                hold, opts.hold_after_commit = opts.hold_after_commit, 0
            time.sleep(hold)
        return 204

    def log_message(self, format, *args):  # quiet: our own lines only
        pass


def log(line):
    print(line, flush=True)


def db():
    # isolation_level=None: we issue BEGIN/COMMIT ourselves.
    conn = sqlite3.connect(ARGS.db, timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    return conn


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--secret", required=True, help="the endpoint's whsec_... secret")
    p.add_argument("--db", required=True, help="SQLite file (created if missing)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    test = p.add_argument_group("test-only knobs (never in production)")
    test.add_argument("--fail-first", type=int, default=0, metavar="N", help="answer 500 to the first N requests")
    test.add_argument("--status-always", type=int, default=0, metavar="CODE", help="answer CODE to everything")
    test.add_argument(
        "--hold-after-commit", type=float, default=0, metavar="SECONDS",
        help="after the first COMMIT, wait this long before answering (prints 'committed ID' first)",
    )
    p.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--tls-key", help="and this private key (PEM)")
    ARGS = p.parse_args()
    with closing(db()) as conn:
        conn.executescript(SCHEMA)
    server = ThreadingHTTPServer((ARGS.host, ARGS.port), Receiver)
    if ARGS.tls_cert:
        import ssl

        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(ARGS.tls_cert, ARGS.tls_key)
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    server.opts, server.lock, server.failures_left = ARGS, threading.Lock(), ARGS.fail_first
    host, port = server.server_address[:2]
    log(f"listening on {host}:{port}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
