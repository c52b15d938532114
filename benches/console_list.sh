#!/usr/bin/env bash
# benches/console_list.sh: the console's message list with 1,000,000
# messages in the store (issue 25: "the list page answers in < 100 ms with
# 1,000,000 messages, on both backends").
#
# Per backend: the daemon creates its schema, stops; the queue is filled
# directly (SQLite: sqlite3 and a recursive CTE; PostgreSQL: generate_series
# into a fresh database), 90% in workspace "acme", 10% in "globex"; states
# ~96.5% delivered, 2% deferred, 1% queued, 0.5% failed; accepted over the
# last 30 days (the newest now); keys bench-key-N; recipients userN%50000@exampleN%100.net.
# SQLite gets no ANALYZE (the daemon never runs one); PostgreSQL gets
# VACUUM ANALYZE, as autovacuum would after such an insert.
# The daemon starts again (relay paused: it only serves), the script signs
# in to the console with curl (GET the form for its token, POST) as a
# workspace account and as an operator, and times each query
# (after WARMUP untimed requests) ROUNDS times: min, median and p95 in ms,
# as curl sees the whole answer (connect to last byte) on loopback. Every
# answer is checked: status 200 and the rows it should have.
# Prints figures; no pass/fail thresholds.
#
#   benches/console_list.sh                       # both backends
#   BENCH_STORE=sqlite benches/console_list.sh    # one
#   ROWS=100000 ROUNDS=5 benches/console_list.sh  # quick
#   SMTP_ONCE_BIN=target/release/smtp-once benches/console_list.sh   # no cargo build
#
# PostgreSQL: PG_URL (default postgres://postgres@127.0.0.1:5432), a role
# that may create databases; the database bench_console_list_<pid> is
# created and dropped.
set -euo pipefail
ROWS=${ROWS:-1000000}
ROUNDS=${ROUNDS:-20}
WARMUP=${WARMUP:-2}
BENCH_STORE=${BENCH_STORE:-both}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432}
WORKDIR=${WORKDIR:-/tmp/smtp-once-console-bench}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=${SMTP_ONCE_BIN:-${CARGO_TARGET_DIR:-target}/release/smtp-once}
[ -n "${SMTP_ONCE_BIN:-}" ] || cargo build --release --quiet
for tool in curl sqlite3 python3; do
  command -v "$tool" >/dev/null || { echo "console_list.sh: $tool is needed" >&2; exit 1; }
done

PID=""
PG_DB="bench_console_list_$$"
cleanup() {
  [ -z "$PID" ] || { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; }
  if [ "$BENCH_STORE" != sqlite ]; then
    psql "$PG_URL/postgres" -qAtc "DROP DATABASE IF EXISTS $PG_DB" >/dev/null 2>&1 || true
  fi
  rm -rf "$WORKDIR"
}
trap cleanup EXIT

hash() { echo -n "$1" | "$BIN" hash-password; }
ALICE_HASH=$(hash alice-bench-pw)
OLGA_HASH=$(hash olga-bench-pw)

# $1: the [store] section (empty: SQLite in data_dir).
write_config() {
  cat > "$WORKDIR/smtp-once.toml" <<TOML
[server]
hostname = "bench.test"
data_dir = "$WORKDIR/data"
[[listener]]
addr = "127.0.0.1:0"
tls = "none"
[[user]]
name = "alice"
password_hash = "$ALICE_HASH"
workspace = "acme"
[[user]]
name = "olga"
password_hash = "$OLGA_HASH"
workspace = "ops"
role = "operator"
[http]
addr = "127.0.0.1:0"
console = true
[relay]
mode = "file"
dir = "$WORKDIR/outbox"
paused = true
$1
TOML
}

HTTP=""
start() {
  : > "$WORKDIR/stdout"
  "$BIN" serve --config "$WORKDIR/smtp-once.toml" > "$WORKDIR/stdout" 2>> "$WORKDIR/server.log" &
  PID=$!
  HTTP=""
  for _ in $(seq 300); do
    HTTP=$(sed -n 's/^smtp-once http on //p' "$WORKDIR/stdout")
    [ -n "$HTTP" ] && return 0
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "console_list.sh: the daemon did not start:" >&2
  tail -20 "$WORKDIR/server.log" >&2
  exit 1
}
stop() {
  kill -TERM "$PID"
  wait "$PID" || true
  PID=""
}

# The rows: n = 1..ROWS, in acceptance order, created_at spread over the
# last 30 days. Ids as the daemon makes them (src/store/queue_id.rs): 11
# Crockford base32 characters of the acceptance time in microseconds, then
# a 4-character process tag ("BNCH"), so they sort by time as real ones do.
ALPHABET=0123456789ABCDEFGHJKMNPQRSTVWXYZ
# id_sql MICROS_EXPR CAST: the SQL expression of the id.
id_sql() {
  local k expr=""
  for k in 10 9 8 7 6 5 4 3 2 1 0; do
    expr+="substr('$ALPHABET', CAST((($1) >> $((5 * k))) & 31 AS $2) + 1, 1) || "
  done
  echo "${expr}'BNCH'"
}
# The messages of the last 3 hours (what the ledger holds), and the key the
# key filter looks for: one of them, as a key search is for recent mail.
LEDGER_ROWS=$(( ROWS * 3 / (30 * 24) + 1 ))
KEY_ROW=$(( ROWS - LEDGER_ROWS / 2 ))
[ $((KEY_ROW % 10)) -ne 0 ] || KEY_ROW=$((KEY_ROW - 1))   # alice's workspace
KEY_HASH=$(python3 -c 'import hashlib, struct, sys; print(struct.unpack(">q", hashlib.sha256(sys.argv[1].encode()).digest()[:8])[0])' "bench-key-$KEY_ROW")
FILL_COLUMNS="id, workspace, account, reverse_path, recipients, idempotency_key, size, state, attempts, next_attempt_at, last_error, created_at, updated_at"
# queue_fill_select CAST: the SELECT of row i's FILL_COLUMNS, the same on
# both backends (CAST names the integer type of the id's arithmetic); the
# caller gives the rows (i) and "now" in ms (now).
queue_fill_select() {
  cat <<SQL
SELECT $(id_sql "(now - ($ROWS - i) * (2592000000 / $ROWS)) * 1000" "$1"),
       CASE WHEN i % 10 = 0 THEN 'globex' ELSE 'acme' END,
       CASE WHEN i % 10 = 0 THEN 'carol' ELSE 'alice' END,
       'sender' || (i % 7) || '@example.test',
       'user' || (i % 50000) || '@example' || (i % 100) || '.net',
       'bench-key-' || i,
       4096,
       CASE WHEN i % 100 IN (1, 2) THEN 'deferred' WHEN i % 100 = 3 THEN 'queued'
            WHEN i % 200 = 4 THEN 'failed' ELSE 'delivered' END,
       CASE WHEN i % 100 = 3 THEN 0 ELSE 1 END,
       CASE WHEN i % 100 IN (1, 2, 3) THEN now + 3600000 ELSE NULL END,
       CASE WHEN i % 100 IN (1, 2) THEN '451 4.7.1 try again later' ELSE NULL END,
       now - ($ROWS - i) * (2592000000 / $ROWS),
       now - ($ROWS - i) * (2592000000 / $ROWS)
SQL
}
# The four hour partitions the last 3 hours' entries expire in, filled
# from ledger_fill in acceptance order, each with its key index.
ledger_partitions_sql() {
  local hour span
  hour=$(( $(date +%s) / 3600 ))
  for span in $hour $((hour + 1)) $((hour + 2)) $((hour + 3)); do
    cat <<SQL
CREATE TABLE ledger_p3600_$span (id INTEGER PRIMARY KEY, key_hash INTEGER NOT NULL,
  workspace TEXT NOT NULL, key TEXT NOT NULL, fingerprint BLOB NOT NULL, reply BLOB NOT NULL,
  queue_id TEXT, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL);
INSERT INTO ledger_p3600_$span (key_hash, workspace, key, fingerprint, reply, queue_id, created_at, expires_at)
SELECT * FROM ledger_fill
WHERE expires_at >= $span * 3600000 AND expires_at < ($span + 1) * 3600000 ORDER BY created_at;
CREATE INDEX ledger_p3600_${span}_key ON ledger_p3600_$span(key_hash);
SQL
  done
}
fill_sqlite() {
  sqlite3 "$WORKDIR/data/smtp-once.db" <<SQL
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $ROWS),
  t(now) AS (SELECT CAST(strftime('%s', 'now') AS INTEGER) * 1000)
INSERT INTO queue ($FILL_COLUMNS)
$(queue_fill_select INTEGER)
FROM n, t;
-- The ledger as acceptance leaves it: an entry for each message of the
-- last 3 hours (the retention), older ones purged. SQLite finds a key
-- through it (src/store/sqlite/ledger_key.rs): random hashes, except the
-- searched key's, which is the daemon's own. Entries live in hour-long
-- partitions by expiry (src/store/sqlite/ledger_partition.rs), which the
-- daemon puts in its view (ledger) when it opens.
-- (queue rows were written in order into an empty table: rowid i is row i)
CREATE TEMP TABLE ledger_fill AS
WITH RECURSIVE n(i) AS (SELECT $((ROWS - LEDGER_ROWS + 1)) UNION ALL SELECT i + 1 FROM n WHERE i < $ROWS)
SELECT CASE WHEN i = $KEY_ROW THEN $KEY_HASH ELSE random() END AS key_hash,
       CASE WHEN i % 10 = 0 THEN 'globex' ELSE 'acme' END AS workspace, 'bench-key-' || i AS key,
       randomblob(32) AS fingerprint, CAST('250 2.0.0 Ok: queued' AS BLOB) AS reply, q.id AS queue_id,
       q.created_at AS created_at, q.created_at + 10800000 AS expires_at
FROM n JOIN queue q ON q.rowid = n.i;
$(ledger_partitions_sql)
COMMIT;
SQL
}
fill_postgres() {
  psql "$PG_URL/$PG_DB" -qAt -v ON_ERROR_STOP=1 <<SQL
INSERT INTO queue ($FILL_COLUMNS)
$(queue_fill_select int)
FROM generate_series(1, $ROWS) AS i,
     (SELECT (extract(epoch FROM now()) * 1000)::bigint AS now) AS t;
VACUUM ANALYZE queue;
SQL
}

# Signs in as $1 with password $2; the cookie jar is $WORKDIR/$1.jar.
sign_in() {
  local jar="$WORKDIR/$1.jar" token status
  rm -f "$jar"
  token=$(curl -sS -c "$jar" "http://$HTTP/console/login" | sed -n 's/.*name="csrf" value="\([^"]*\)".*/\1/p' | head -1)
  [ -n "$token" ] || { echo "console_list.sh: no form token on the sign-in page" >&2; exit 1; }
  status=$(curl -sS -o /dev/null -w '%{http_code}' -b "$jar" -c "$jar" \
    --data-urlencode "csrf=$token" --data-urlencode "account=$1" --data-urlencode "password=$2" \
    "http://$HTTP/console/login")
  [ "$status" = 303 ] || { echo "console_list.sh: sign-in as $1 answered $status" >&2; exit 1; }
}

# time_query LABEL ACCOUNT PATH MIN_ROWS MAX_ROWS
time_query() {
  local label=$1 jar="$WORKDIR/$2.jar" url="http://$HTTP$3" min=$4 max=$5 out rows i
  out="$WORKDIR/page.html"
  for _ in $(seq "$WARMUP"); do curl -sS -o /dev/null -b "$jar" "$url"; done
  : > "$WORKDIR/times"
  for i in $(seq "$ROUNDS"); do
    curl -sS -o "$out" -b "$jar" -w '%{http_code} %{time_total}\n' "$url" >> "$WORKDIR/times"
    if [ "$i" = 1 ]; then
      rows=$({ grep -o '<tr class="message"' "$out" || true; } | wc -l)
      if [ "$rows" -lt "$min" ] || [ "$rows" -gt "$max" ]; then
        echo "console_list.sh: $label shows $rows rows, expected $min..$max" >&2
        exit 1
      fi
    fi
  done
  python3 - "$label" "$rows" "$WORKDIR/times" <<'PY'
import statistics, sys
label, rows, path = sys.argv[1], sys.argv[2], sys.argv[3]
lines = [l.split() for l in open(path) if l.strip()]
bad = [s for s, _ in lines if s != "200"]
if bad:
    sys.exit(f"console_list.sh: {label}: statuses {sorted(set(bad))}")
ms = sorted(float(t) * 1000 for _, t in lines)
p95 = ms[min(len(ms) - 1, max(0, round(0.95 * len(ms)) - 1))]
print(f"| {label} | {rows} | {ms[0]:.1f} | {statistics.median(ms):.1f} | {p95:.1f} |")
PY
}

run_queries() {
  local store=$1 middle
  if [ "$store" = sqlite ]; then
    middle=$(sqlite3 "$WORKDIR/data/smtp-once.db" \
      "SELECT id FROM queue WHERE workspace = 'acme' ORDER BY id DESC LIMIT 1 OFFSET $((ROWS * 9 / 20))")
  else
    middle=$(psql "$PG_URL/$PG_DB" -qAtc \
      "SELECT id FROM queue WHERE workspace = 'acme' ORDER BY id DESC LIMIT 1 OFFSET $((ROWS * 9 / 20))")
  fi
  sign_in alice alice-bench-pw
  sign_in olga olga-bench-pw
  echo
  echo "$store, $ROWS messages, $ROUNDS timed requests each (after $WARMUP), $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "| query ($store) | rows shown | min ms | median ms | p95 ms |"
  echo "|---|---|---|---|---|"
  time_query "first page (workspace account)" alice "/console/messages" 50 50
  time_query "first page, fragment (the refresh)" alice "/console/messages?fragment=1" 50 50
  time_query "deep page (after= the middle)" alice "/console/messages?after=$middle" 50 50
  time_query "state = deferred" alice "/console/messages?state=deferred" 50 50
  time_query "state = failed, deep page" alice "/console/messages?state=failed&after=$middle" 50 50
  time_query "key (one message)" alice "/console/messages?key=bench-key-$KEY_ROW" 1 1
  time_query "recipient, a domain (1% of rows)" alice "/console/messages?recipient=%40example7.net" 50 50
  time_query "recipient, one address (rare)" alice "/console/messages?recipient=user4241%40example41.net" 1 50
  time_query "sender" alice "/console/messages?sender=sender3%40" 50 50
  time_query "age 1h" alice "/console/messages?age=1h" 1 50
  time_query "age 1m" alice "/console/messages?age=1m" 0 50
  time_query "first page (operator, all workspaces)" olga "/console/messages" 50 50
  time_query "operator, workspace globex" olga "/console/messages?workspace=globex" 50 50
}

bench_sqlite() {
  rm -rf "$WORKDIR" && mkdir -p "$WORKDIR"
  write_config ""
  start && stop
  local t0=$SECONDS
  fill_sqlite
  echo "sqlite: $ROWS rows written in $((SECONDS - t0)) s ($(du -h "$WORKDIR/data/smtp-once.db" | cut -f1))" >&2
  start
  run_queries sqlite
  stop
}

bench_postgres() {
  rm -rf "$WORKDIR" && mkdir -p "$WORKDIR"
  command -v psql >/dev/null || { echo "console_list.sh: psql is needed" >&2; exit 1; }
  psql "$PG_URL/postgres" -qAtc "DROP DATABASE IF EXISTS $PG_DB" >/dev/null 2>&1
  psql "$PG_URL/postgres" -qAtc "CREATE DATABASE $PG_DB" >/dev/null
  write_config "[store]
backend = \"postgres\"
url = \"$PG_URL/$PG_DB\"
pool_size = 8"
  start && stop
  local t0=$SECONDS
  fill_postgres
  echo "postgres: $ROWS rows written in $((SECONDS - t0)) s" >&2
  start
  run_queries postgres
  stop
  psql "$PG_URL/postgres" -qAtc "DROP DATABASE IF EXISTS $PG_DB" >/dev/null
}

echo "smtp-once console list benchmark: $("$BIN" --version 2>/dev/null || echo smtp-once), $(nproc) cores, $(uname -m)"
case "$BENCH_STORE" in
  sqlite) bench_sqlite ;;
  postgres) bench_postgres ;;
  both) bench_sqlite; bench_postgres ;;
  *) echo "console_list.sh: BENCH_STORE is sqlite, postgres or both" >&2; exit 1 ;;
esac
