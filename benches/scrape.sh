#!/usr/bin/env bash
# benches/scrape.sh: what a /metrics scrape costs with a big queue, on SQLite
# and on PostgreSQL (issue 22 item 5).
#
# For each backend: a fresh store whose schema the daemon creates (start it
# once, stop it), ROWS queued messages inserted straight with SQL (sqlite3,
# psql generate_series), the daemon started again with `[relay] paused =
# true` so nothing is delivered, then SCRAPES scrapes of /metrics timed by
# curl, INTERVAL seconds apart so that they span several counts (min /
# median / p99 / max; with 50 scrapes p99 is the slowest), and the
# time the background count of the queue took (the
# smtp_once_queue_count_seconds gauge, read after a few refreshes).
#
#   benches/scrape.sh                       # 1,000,000 rows, 50 scrapes, both backends
#   ROWS=100000 benches/scrape.sh           # smaller
#   BACKENDS=sqlite benches/scrape.sh       # one backend
#
# Settings (environment): BIN (default target/release/smtp-once), ROWS,
# SCRAPES, INTERVAL (0.2), BACKENDS ("sqlite postgres"), PG_URL (a server whose role may
# CREATE DATABASE; default postgres://postgres@127.0.0.1:5432), KEEP=1 to
# keep the work directory and the database (to EXPLAIN the count). Needs curl, sqlite3 and psql.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-$ROOT/target/release/smtp-once}
ROWS=${ROWS:-1000000}
SCRAPES=${SCRAPES:-50}
INTERVAL=${INTERVAL:-0.2}
BACKENDS=${BACKENDS:-"sqlite postgres"}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432}
PG_DB=smtp_once_scrape_bench_$$
WORKDIR=$(mktemp -d "${TMPDIR:-/tmp}/smtp-once-scrape.XXXXXX")
DAEMON_PID=""

say() { printf '%s\n' "$*" >&2; }

cleanup() {
  stop_daemon
  if [[ $BACKENDS == *postgres* ]] && [ "${KEEP:-0}" != 1 ]; then
    psql "$PG_URL/postgres" -X -q -c "DROP DATABASE IF EXISTS \"$PG_DB\" WITH (FORCE)" >/dev/null 2>&1 || true
  fi
  if [ "${KEEP:-0}" = 1 ]; then say "kept $WORKDIR (and database $PG_DB)"; else rm -rf "$WORKDIR"; fi
}
trap cleanup EXIT

[ -x "$BIN" ] || { say "no binary at $BIN (cargo build --release, or set BIN)"; exit 1; }
for tool in curl sqlite3 psql; do
  command -v "$tool" >/dev/null || { say "$tool is missing"; exit 1; }
done

# A free loopback port (the kernel's choice, released at once).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

write_config() { # dir store-section
  local d=$1 store=$2
  mkdir -p "$d/data" "$d/outbox"
  METRICS_PORT=$(free_port)
  cat > "$d/smtp-once.toml" <<EOF
# Written by benches/scrape.sh
[server]
hostname = "scrape.bench.test"
data_dir = "$d/data"
shutdown_grace = "5s"

[[listener]]
addr = "127.0.0.1:$(free_port)"
tls = "none"

[[trusted_network]]
cidr = "127.0.0.0/8"
workspace = "bench"

[relay]
mode = "file"
dir = "$d/outbox"
paused = true

[metrics]
addr = "127.0.0.1:$METRICS_PORT"
$store
EOF
  "$BIN" check-config --config "$d/smtp-once.toml" >/dev/null
}

start_daemon() { # dir
  local d=$1
  RUST_LOG=info "$BIN" serve --config "$d/smtp-once.toml" >> "$d/server.log" 2>&1 &
  DAEMON_PID=$!
  for _ in $(seq 1 600); do
    if curl -sf -o /dev/null "http://127.0.0.1:$METRICS_PORT/healthz"; then return 0; fi
    kill -0 "$DAEMON_PID" 2>/dev/null || { say "the daemon died:"; tail -20 "$d/server.log" >&2; exit 1; }
    sleep 0.1
  done
  say "the daemon did not answer on /healthz in 60 s"; exit 1
}

stop_daemon() {
  [ -n "$DAEMON_PID" ] || return 0
  kill -TERM "$DAEMON_PID" 2>/dev/null || true
  wait "$DAEMON_PID" 2>/dev/null || true
  DAEMON_PID=""
}

metric() { # name: its value on one scrape
  curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" | awk -v n="$1" '$1 == n { print $2 }'
}

# min / median / p99 in milliseconds of the seconds on stdin.
summary() {
  sort -g | awk '{ v[NR] = $1 * 1000 }
    END { p99 = int(NR * 0.99 + 0.999); if (p99 > NR) p99 = NR
          printf "min %.2f ms, median %.2f ms, p99 %.2f ms, max %.2f ms (%d scrapes)", v[1], v[int((NR + 1) / 2)], v[p99], v[NR], NR }'
}

measure() { # backend
  local queued count
  queued=$(metric 'smtp_once_queue_messages{state="queued"}')
  [ "${queued%.*}" = "$ROWS" ] || { say "$1: the gauge says $queued queued, want $ROWS"; exit 1; }
  # Two refreshes (5 s apart) so the count below is one done while running.
  sleep 11
  count=$(metric smtp_once_queue_count_seconds)
  local times
  times=$(for _ in $(seq 1 "$SCRAPES"); do
    curl -sf -o /dev/null -w '%{time_total}\n' "http://127.0.0.1:$METRICS_PORT/metrics"
    sleep "$INTERVAL"
  done)
  printf '%-10s scrape: %s; background count: %.1f ms\n' "$1" "$(summary <<< "$times")" \
    "$(awk -v s="$count" 'BEGIN { print s * 1000 }')"
}

bench_sqlite() {
  local d=$WORKDIR/sqlite
  write_config "$d" ""
  start_daemon "$d"; stop_daemon
  say "sqlite: inserting $ROWS queued rows"
  sqlite3 "$d/data/smtp-once.db" >/dev/null <<EOF
PRAGMA journal_mode = WAL;
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $ROWS)
INSERT INTO queue (id, workspace, account, reverse_path, recipients, size, state,
                   attempts, next_attempt_at, created_at, updated_at)
SELECT printf('bench%09d', i), 'bench', 'bench', 's@bench.test', 'r@bench.test', 1, 'queued',
       0, t0 + i, t0 + i, t0 + i
FROM n, (SELECT CAST(strftime('%s', 'now') AS INTEGER) * 1000 - $ROWS AS t0);
INSERT INTO message_body (queue_id, trace, body) SELECT id, '', x'42' FROM queue;
COMMIT;
EOF
  start_daemon "$d"
  measure sqlite
  stop_daemon
}

bench_postgres() {
  local d=$WORKDIR/postgres
  psql "$PG_URL/postgres" -X -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE \"$PG_DB\"" >/dev/null
  write_config "$d" "[store]
backend = \"postgres\"
url = \"$PG_URL/$PG_DB\""
  start_daemon "$d"; stop_daemon
  say "postgres: inserting $ROWS queued rows"
  psql "$PG_URL/$PG_DB" -X -q -v ON_ERROR_STOP=1 <<EOF
BEGIN;
INSERT INTO queue (id, workspace, account, reverse_path, recipients, size, state,
                   attempts, next_attempt_at, created_at, updated_at)
SELECT 'bench' || lpad(i::text, 9, '0'), 'bench', 'bench', 's@bench.test', 'r@bench.test', 1,
       'queued', 0, t0 + i, t0 + i, t0 + i
FROM generate_series(1, $ROWS) AS i, (SELECT smtp_once_now() - $ROWS AS t0) AS now;
INSERT INTO message_body (queue_id, trace, body) SELECT id, '', '\x42' FROM queue;
COMMIT;
VACUUM ANALYZE queue;
EOF
  start_daemon "$d"
  measure postgres
  stop_daemon
}

say "smtp-once: $BIN; $ROWS queued rows"
for b in $BACKENDS; do
  case $b in
    sqlite) bench_sqlite ;;
    postgres) bench_postgres ;;
    *) say "unknown backend $b"; exit 1 ;;
  esac
done
