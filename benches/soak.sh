#!/usr/bin/env bash
# benches/soak.sh: one smtp-once daemon under sustained load (issue 24):
# minutes of `smtp-once bench` against one store, a line per window.
#
# The daemon (SQLite, or PostgreSQL with SOAK_STORE=postgres) accepts from
# 127.0.0.0/8 without AUTH and relays (smarthost, no TLS) to a local
# `smtp-sink` (postfix package), or with SOAK_RELAY=paused only queues. The
# load is one `smtp-once bench --json --duration SOAK_WINDOW` per window (or
# `-n SOAK_WINDOW_MESSAGES` with SOAK_MESSAGES), back to back, each with a
# fresh random key prefix, so no key repeats across the run. After each
# window it prints:
#
#   accepted/s  bench's accepted (2xx) / bench's seconds
#   relayed/s   growth of smtp_once_delivery_attempts_total{outcome="delivered"}
#               over the window's wall time (one recipient per message)
#   p99 ms      bench's end-of-data-to-reply p99 for the window
#   rss MiB     the daemon's VmRSS
#   db MiB      SQLite: smtp-once.db + -wal (the WAL separately);
#               PostgreSQL: pg_database_size (its WAL is server-wide: not shown)
#   queue       queued + deferred + delivering + held (smtp_once_queue_messages,
#               counted every 2 s by the daemon: up to 2 s old)
#   relayed     delivered so far
#   wr KiB/msg  bytes the daemon wrote to disk in the window (/proc/PID/io
#               write_bytes: WAL, checkpoints, fsynced pages) / accepted;
#               SQLite only (PostgreSQL writes in its own processes: 0)
#   jobs/commit mean jobs per group commit in the window
#               (smtp_once_commit_batch_jobs_sum / _count)
#   cpu us/msg  the daemon's CPU time (user + system, /proc/PID/stat) in the
#               window / accepted: what a message costs, whatever the rate
#   steal %     the machine's steal time in the window (/proc/stat): CPU the
#               hypervisor gave to others; a window with much of it is slow
#               for reasons outside the daemon
#
# At the end: totals, relayed/accepted when the load stopped, then (relay
# mode) the wait for the backlog to drain (SOAK_DRAIN_TIMEOUT), and the disk
# the store keeps per delivered message after a checkpoint (SQLite: the
# daemon stopped, `PRAGMA wal_checkpoint(TRUNCATE)`, data dir bytes;
# PostgreSQL: CHECKPOINT, pg_database_size).
#
#   benches/soak.sh                                  # 10 min, SQLite, relaying
#   SOAK_RELAY=paused SOAK_KEYS=sequential SOAK_MINUTES=3 SOAK_WINDOW=30 benches/soak.sh
#   SOAK_STORE=postgres benches/soak.sh
#   SOAK_MESSAGES=2000000 SOAK_WINDOW_MESSAGES=300000 SOAK_RELAY=paused benches/soak.sh
#   SOAK_EXPIRED=10000000 SOAK_RELAY=paused SOAK_MINUTES=5 SOAK_WINDOW=30 benches/soak.sh
#
# Settings (environment):
#   SOAK_MINUTES=10        run length (ignored when SOAK_MESSAGES is set)
#   SOAK_WINDOW=60         seconds per window (a line each)
#   SOAK_MESSAGES=         total messages instead of minutes; windows of
#   SOAK_WINDOW_MESSAGES=  (default SOAK_MESSAGES / 10) messages each
#   SOAK_STORE=sqlite      or postgres: a fresh database on PG_URL, dropped at exit
#   SOAK_RELAY=sink        or paused: [relay] paused = true, acceptance only
#   SOAK_KEYS=uuid         or sequential: bench --key-style
#   SOAK_CONNS=32          bench connections
#   SOAK_SIZE=1024         message size in bytes
#   SOAK_RELAY_EXTRA=      more TOML lines for [relay], e.g. 'workers = 200'
#   SOAK_EXPIRED=0         expired ledger entries written before the load
#                          (e.g. 10000000): the purge (every 1 s) removes them
#                          while the load runs; purged/s shows its rate
#   SOAK_DRAIN_TIMEOUT=600 seconds to wait for the backlog after the load (0: don't)
#   SOAK_RESULTS=file      also append the window lines (TSV) there
#   BIN=target/release/smtp-once   (built by you: the script does not build)
#   PG_URL=postgres://postgres@127.0.0.1:5432   a role that may CREATE DATABASE
#   KEEP=1                 keep the work directory (and the database)
# Needs curl, jq, sqlite3 (SQLite) or psql (PostgreSQL), /usr/sbin/smtp-sink
# (relay mode). The daemon's pid is printed first: attach `perf record -g -p`.
set -euo pipefail

# Read in full before running: editing the file mid-run cannot derail it.
{
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-$ROOT/target/release/smtp-once}
SOAK_MINUTES=${SOAK_MINUTES:-10}
SOAK_WINDOW=${SOAK_WINDOW:-60}
SOAK_MESSAGES=${SOAK_MESSAGES:-}
SOAK_STORE=${SOAK_STORE:-sqlite}
SOAK_RELAY=${SOAK_RELAY:-sink}
SOAK_KEYS=${SOAK_KEYS:-uuid}
SOAK_CONNS=${SOAK_CONNS:-32}
SOAK_SIZE=${SOAK_SIZE:-1024}
SOAK_RELAY_EXTRA=${SOAK_RELAY_EXTRA:-}
SOAK_EXPIRED=${SOAK_EXPIRED:-0}
SOAK_DRAIN_TIMEOUT=${SOAK_DRAIN_TIMEOUT:-600}
SOAK_RESULTS=${SOAK_RESULTS:-}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432}
PG_URL=${PG_URL%/}
PG_DB=smtp_once_soak_$$
WORKDIR=$(mktemp -d "${TMPDIR:-/tmp}/smtp-once-soak.XXXXXX")
DAEMON_PID=""
SINK_PID=""

say() { printf '[soak %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }
is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }

for v in SOAK_MINUTES SOAK_WINDOW SOAK_CONNS SOAK_SIZE SOAK_DRAIN_TIMEOUT SOAK_EXPIRED; do
  is_uint "${!v}" || die "$v must be a whole number, got '${!v}'"
done
[ "$SOAK_WINDOW" -gt 0 ] || die "SOAK_WINDOW must be at least 1"
if [ -n "$SOAK_MESSAGES" ]; then
  is_uint "$SOAK_MESSAGES" && [ "$SOAK_MESSAGES" -gt 0 ] || die "SOAK_MESSAGES must be a positive number"
  SOAK_WINDOW_MESSAGES=${SOAK_WINDOW_MESSAGES:-$(( (SOAK_MESSAGES + 9) / 10 ))}
  is_uint "$SOAK_WINDOW_MESSAGES" && [ "$SOAK_WINDOW_MESSAGES" -gt 0 ] || die "SOAK_WINDOW_MESSAGES must be a positive number"
fi
case $SOAK_STORE in sqlite|postgres) ;; *) die "SOAK_STORE must be sqlite or postgres" ;; esac
case $SOAK_RELAY in sink|paused) ;; *) die "SOAK_RELAY must be sink or paused" ;; esac
case $SOAK_KEYS in uuid|sequential) ;; *) die "SOAK_KEYS must be uuid or sequential" ;; esac
[ -x "$BIN" ] || die "no binary at $BIN (cargo build --release, or set BIN)"
tools="curl jq"
[ "$SOAK_STORE" = sqlite ] && tools+=" sqlite3" || tools+=" psql"
for tool in $tools; do command -v "$tool" >/dev/null || die "$tool is missing"; done
[ "$SOAK_RELAY" = paused ] || [ -x /usr/sbin/smtp-sink ] || die "/usr/sbin/smtp-sink is missing (apt-get install postfix)"

cleanup() {
  stop_daemon
  if [ -n "$SINK_PID" ]; then kill -TERM "$SINK_PID" 2>/dev/null || true; wait "$SINK_PID" 2>/dev/null || true; fi
  if [ "$SOAK_STORE" = postgres ] && [ "${KEEP:-0}" != 1 ]; then
    psql "$PG_URL/postgres" -X -q -c "DROP DATABASE IF EXISTS \"$PG_DB\" WITH (FORCE)" >/dev/null 2>&1 || true
  fi
  if [ "${KEEP:-0}" = 1 ]; then say "kept $WORKDIR${PG_DB:+ (database $PG_DB if PostgreSQL)}"; else rm -rf "$WORKDIR"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A free loopback port (the kernel's choice, released at once).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

SMTP_PORT=$(free_port)
METRICS_PORT=$(free_port)
SINK_PORT=$(free_port)
DATA=$WORKDIR/data

start_sink() {
  # No -c (its counter costs a terminal write per message), no -D: the
  # daemon's delivered counter is the relayed count.
  /usr/sbin/smtp-sink -u nobody -m 1000 "127.0.0.1:$SINK_PORT" 1000 > "$WORKDIR/sink.log" 2>&1 &
  SINK_PID=$!
  for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$SINK_PORT") 2>/dev/null && return 0
    sleep 0.1
  done
  die "smtp-sink did not listen on $SINK_PORT"
}

write_config() {
  local store="" server_extra="" relay
  mkdir -p "$DATA" "$WORKDIR/outbox"
  if [ "$SOAK_STORE" = postgres ]; then
    psql "$PG_URL/postgres" -X -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE \"$PG_DB\"" >/dev/null
    store=$(printf '[store]\nbackend = "postgres"\nurl = "%s"\npool_size = 8' "$PG_URL/$PG_DB")
    server_extra='node_id = "soak"'
  fi
  if [ "$SOAK_RELAY" = paused ]; then
    relay=$(printf 'mode = "file"\ndir = "%s"\npaused = true' "$WORKDIR/outbox")
  else
    relay=$(printf 'mode = "smarthost"\nsmarthost = "127.0.0.1:%s"\ntls = "none"\npoll_interval = "100ms"' "$SINK_PORT")
  fi
  cat > "$WORKDIR/smtp-once.toml" <<EOF
# Written by benches/soak.sh
[server]
hostname = "soak.bench.test"
data_dir = "$DATA"
max_connections = 1000
shutdown_grace = "5s"
$server_extra

[idempotency]
purge_interval = "1s"

[[listener]]
addr = "127.0.0.1:$SMTP_PORT"
tls = "none"

[[trusted_network]]
cidr = "127.0.0.0/8"
workspace = "bench"

[relay]
$relay
$SOAK_RELAY_EXTRA

[metrics]
addr = "127.0.0.1:$METRICS_PORT"
$store
EOF
  "$BIN" check-config --config "$WORKDIR/smtp-once.toml" >/dev/null
}

start_daemon() {
  RUST_LOG=${RUST_LOG:-warn} "$BIN" serve --config "$WORKDIR/smtp-once.toml" >> "$WORKDIR/server.log" 2>&1 &
  DAEMON_PID=$!
  for _ in $(seq 1 600); do
    if curl -sf -o /dev/null "http://127.0.0.1:$METRICS_PORT/healthz"; then return 0; fi
    kill -0 "$DAEMON_PID" 2>/dev/null || { tail -20 "$WORKDIR/server.log" >&2; die "the daemon died"; }
    sleep 0.1
  done
  die "the daemon did not answer on /healthz in 60 s"
}

stop_daemon() {
  [ -n "$DAEMON_PID" ] || return 0
  kill -TERM "$DAEMON_PID" 2>/dev/null || true
  wait "$DAEMON_PID" 2>/dev/null || true
  DAEMON_PID=""
}

# One scrape into SCRAPE; metric NAME reads a value from it (0 if absent).
scrape() { SCRAPE=$(curl -sf "http://127.0.0.1:$METRICS_PORT/metrics") || die "cannot scrape /metrics"; }
metric() { awk -v n="$1" '$1 == n { v = $2 } END { printf "%d\n", v + 0 }' <<< "$SCRAPE"; }
delivered() { metric 'smtp_once_delivery_attempts_total{outcome="delivered"}'; }
queue_depth() {
  awk '$1 ~ /^smtp_once_queue_messages\{/ { s += $2 } END { printf "%d\n", s + 0 }' <<< "$SCRAPE"
}
written_bytes() { awk '/^write_bytes:/ { print $2 }' "/proc/$DAEMON_PID/io"; }
# The daemon's user + system CPU in microseconds (fields 14 and 15, after the
# parenthesised name, which may hold spaces).
cpu_us() {
  awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.0f\n", ($12 + $13) * 1000000 / hz }' "/proc/$DAEMON_PID/stat"
}
# "steal total" jiffies of the whole machine (the first line of /proc/stat):
# user to steal only, as guest and guest_nice are already counted in user
# and nice.
cpu_ticks() { awk '$1 == "cpu" { t = 0; for (i = 2; i <= 9; i++) t += $i; print $9, t; exit }' /proc/stat; }
rss_mib() { awk '/^VmRSS:/ { printf "%.0f\n", $2 / 1024 }' "/proc/$DAEMON_PID/status"; }

file_bytes() { if [ -f "$1" ]; then stat -c %s "$1"; else echo 0; fi; }
# "database MiB, WAL MiB" (PostgreSQL: the database only, WAL "-").
store_size() {
  if [ "$SOAK_STORE" = sqlite ]; then
    awk -v d="$(file_bytes "$DATA/smtp-once.db")" -v w="$(file_bytes "$DATA/smtp-once.db-wal")" \
      'BEGIN { printf "%.0f %.0f\n", (d + w) / 1048576, w / 1048576 }'
  else
    psql "$PG_URL/$PG_DB" -X -Atc "SELECT round(pg_database_size(current_database()) / 1048576.0)" | awk '{ print $1, "-" }'
  fi
}

now_s() { date +%s.%N; }

# SOAK_EXPIRED ledger entries that expired hours ago, written straight into
# the store the daemon made (stopped meanwhile), as three hours of traffic
# leave them: random keys, a stored reply each. SQLite: three hour-long
# partitions of the ledger (src/store/sqlite/ledger_partition.rs) whose
# spans ended 1-3 hours ago, each with its key index built after the insert
# (minutes, not hours); the daemon puts them in its view when it opens.
write_expired() {
  say "writing $SOAK_EXPIRED expired ledger entries"
  if [ "$SOAK_STORE" = sqlite ]; then
    local hour_now=$(( $(date +%s) / 3600 )) per=$(( (SOAK_EXPIRED + 2) / 3 )) sql="PRAGMA journal_mode = WAL;"
    local span name from
    for span in $((hour_now - 4)) $((hour_now - 3)) $((hour_now - 2)); do
      name="ledger_p3600_$span" from=$(( span * 3600000 ))
      sql+="
CREATE TABLE $name (id INTEGER PRIMARY KEY, key_hash INTEGER NOT NULL, workspace TEXT NOT NULL,
  key TEXT NOT NULL, fingerprint BLOB NOT NULL, reply BLOB NOT NULL, queue_id TEXT,
  created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $per)
INSERT INTO $name (key_hash, workspace, key, fingerprint, reply, queue_id, created_at, expires_at)
SELECT random(), 'bench', lower(hex(randomblob(16))), randomblob(32),
       CAST('250 2.0.0 Ok: queued as EXPIRED' || i AS BLOB), 'EXPIRED' || i,
       $from - 10800000 + i * 3600000 / $per, $from + i * 3600000 / $per FROM n;
CREATE INDEX ${name}_key ON $name(key_hash);"
    done
    sqlite3 "$DATA/smtp-once.db" <<< "$sql
PRAGMA wal_checkpoint(TRUNCATE);" >/dev/null
  else
    psql "$PG_URL/$PG_DB" -X -q -v ON_ERROR_STOP=1 <<SQL >/dev/null
INSERT INTO ledger (workspace, key, fingerprint, reply, queue_id, created_at, expires_at)
SELECT 'bench', md5(random()::text), decode(md5(i::text) || md5(i::text), 'hex'),
       convert_to('250 2.0.0 Ok: queued as EXPIRED' || i, 'UTF8'), 'EXPIRED' || i, 1000000 + i, 2000000 + i
FROM generate_series(1, $SOAK_EXPIRED) AS i;
VACUUM ANALYZE ledger;
SQL
  fi
}

say "smtp-once: $BIN; store $SOAK_STORE, relay $SOAK_RELAY, keys $SOAK_KEYS, $SOAK_CONNS connections, $SOAK_SIZE-byte messages"
say "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg): other work on it shows in every figure"
[ "$SOAK_RELAY" = paused ] || start_sink
write_config
start_daemon
if [ "$SOAK_EXPIRED" -gt 0 ]; then
  stop_daemon
  started=$(now_s)
  write_expired
  say "written in $(awk -v a="$(now_s)" -v b="$started" 'BEGIN { printf "%.0f", a - b }') s"
  start_daemon
fi
say "daemon pid $DAEMON_PID (perf record -g -p $DAEMON_PID), work dir $WORKDIR"

if [ -n "$SOAK_MESSAGES" ]; then
  windows=$(( (SOAK_MESSAGES + SOAK_WINDOW_MESSAGES - 1) / SOAK_WINDOW_MESSAGES ))
  say "$SOAK_MESSAGES messages in $windows windows of up to $SOAK_WINDOW_MESSAGES"
else
  windows=$(( (SOAK_MINUTES * 60 + SOAK_WINDOW - 1) / SOAK_WINDOW ))
  say "$SOAK_MINUTES min in $windows windows of $SOAK_WINDOW s"
fi

LINE='%-6s %9s %9s %9s %7s %7s %7s %9s %10s %10s %10s %11s %9s %10s %7s\n'
# shellcheck disable=SC2059 # LINE is the format
HEADER=$(printf "$LINE" \
  window 'accept/s' 'relay/s' 'p99 ms' 'rss MiB' 'db MiB' 'wal MiB' queue accepted relayed 'wr KiB/msg' 'jobs/commit' 'purged/s' 'cpu us/msg' 'steal %')
echo "$HEADER"
[ -z "$SOAK_RESULTS" ] || printf 'store\trelay\tkeys\twindow\tseconds\taccepted_per_s\trelayed_per_s\tp99_ms\trss_mib\tdb_mib\twal_mib\tqueue\taccepted\trelayed\twritten_kib_per_msg\tjobs_per_commit\tpurged_per_s\tcpu_us_per_msg\tsteal_pct\n' >> "$SOAK_RESULTS"

scrape
relayed0=$(delivered)
total_accepted=0
total_errors=0
run_start=$(now_s)
prev_t=$run_start
prev_relayed=$relayed0
prev_written=$(written_bytes)
prev_jobs=$(metric smtp_once_commit_batch_jobs_sum)
prev_commits=$(metric smtp_once_commit_batch_jobs_count)
prev_purged=$(metric smtp_once_ledger_purged_total)
prev_cpu=$(cpu_us)
read -r prev_steal prev_ticks < <(cpu_ticks)
purged0=$prev_purged
purge_done=""
sent=0
for w in $(seq 1 "$windows"); do
  if [ -n "$SOAK_MESSAGES" ]; then
    n=$(( SOAK_MESSAGES - sent < SOAK_WINDOW_MESSAGES ? SOAK_MESSAGES - sent : SOAK_WINDOW_MESSAGES ))
    load=(-n "$n")
  else
    load=(--duration "$SOAK_WINDOW")
  fi
  report=$("$BIN" bench --server "127.0.0.1:$SMTP_PORT" -c "$SOAK_CONNS" --size "$SOAK_SIZE" \
    --key-style "$SOAK_KEYS" --json --quiet "${load[@]}") || die "bench failed in window $w"
  t=$(now_s)
  scrape
  relayed=$(delivered)
  read -r accepted messages seconds p99 errors < <(jq -r '"\(.accepted) \(.messages) \(.seconds) \(.latency_ms.p99) \(.errors)"' <<< "$report")
  sent=$((sent + messages))
  total_accepted=$((total_accepted + accepted))
  total_errors=$((total_errors + errors))
  read -r db wal < <(store_size)
  written=$(written_bytes)
  jobs=$(metric smtp_once_commit_batch_jobs_sum)
  commits=$(metric smtp_once_commit_batch_jobs_count)
  purged=$(metric smtp_once_ledger_purged_total)
  cpu=$(cpu_us)
  read -r steal ticks < <(cpu_ticks)
  if [ "$SOAK_EXPIRED" -gt 0 ] && [ -z "$purge_done" ] && [ $((purged - purged0)) -ge "$SOAK_EXPIRED" ]; then
    purge_done=$(awk -v a="$t" -v b="$run_start" 'BEGIN { print a - b }')
  fi
  # Every field of the window, tab-separated: the TSV row and the printed line.
  row=$(awk -v w="$w" -v a="$accepted" -v s="$seconds" -v r=$((relayed - prev_relayed)) \
    -v t="$t" -v t0="$prev_t" -v p="$p99" -v rss="$(rss_mib)" \
    -v db="$db" -v wal="$wal" -v q="$(queue_depth)" -v ta="$total_accepted" -v tr=$((relayed - relayed0)) -v wb=$((written - prev_written)) \
    -v jb=$((jobs - prev_jobs)) -v cm=$((commits - prev_commits)) -v pg=$((purged - prev_purged)) \
    -v cu=$((cpu - prev_cpu)) -v st=$((steal - prev_steal)) -v tk=$((ticks - prev_ticks)) \
    'BEGIN { OFS = "\t"; print w, s, sprintf("%.0f", a / s), sprintf("%.0f", r / (t - t0)), sprintf("%.1f", p), rss, db, wal, q, ta, tr,
             sprintf("%.1f", a ? wb / a / 1024 : 0), sprintf("%.1f", cm ? jb / cm : 0), sprintf("%.0f", pg / (t - t0)),
             sprintf("%.1f", a ? cu / a : 0), sprintf("%.1f", tk ? 100 * st / tk : 0) }')
  IFS=$'\t' read -r -a f <<< "$row"
  # shellcheck disable=SC2059 # LINE is the format
  printf "$LINE" "${f[0]}" "${f[@]:2}"
  [ -z "$SOAK_RESULTS" ] || printf '%s\t%s\t%s\t%s\n' "$SOAK_STORE" "$SOAK_RELAY" "$SOAK_KEYS" "$row" >> "$SOAK_RESULTS"
  [ "$errors" = 0 ] || say "window $w: $errors connection errors"
  [ "$accepted" = "$messages" ] || say "window $w: $((messages - accepted)) of $messages refused"
  prev_t=$t
  prev_relayed=$relayed
  prev_written=$written
  prev_jobs=$jobs
  prev_commits=$commits
  prev_purged=$purged
  prev_cpu=$cpu
  prev_steal=$steal
  prev_ticks=$ticks
done
load_end=$(now_s)
scrape
relayed_at_end=$(( $(delivered) - relayed0 ))
elapsed=$(awk -v a="$load_end" -v b="$run_start" 'BEGIN { print a - b }')
echo
awk -v a="$total_accepted" -v r="$relayed_at_end" -v s="$elapsed" -v e="$total_errors" 'BEGIN {
  printf "load: %.0f s, %d accepted (%.0f/s), %d connection errors\n", s, a, a / s, e
  printf "relayed when the load stopped: %d (%.0f/s), relayed/accepted %.3f\n", r, r / s, (a ? r / a : 0) }'
if [ "$SOAK_EXPIRED" -gt 0 ]; then
  if [ -n "$purge_done" ]; then
    awk -v n="$SOAK_EXPIRED" -v s="$purge_done" -v a="$total_accepted" -v l="$elapsed" 'BEGIN {
      printf "purge: %d expired entries gone within %.0f s (the window that saw the last): %.0f/s, %.1fx the acceptance rate of the run\n", n, s, n / s, (n / s) / (a / l) }'
  else
    say "purge: $(( prev_purged - purged0 )) of $SOAK_EXPIRED expired entries removed when the load stopped"
  fi
fi

if [ "$SOAK_RELAY" = sink ] && [ "$SOAK_DRAIN_TIMEOUT" -gt 0 ]; then
  say "waiting up to $SOAK_DRAIN_TIMEOUT s for the backlog ($((total_accepted - relayed_at_end)) messages) to reach the sink"
  deadline=$(( $(date +%s) + SOAK_DRAIN_TIMEOUT ))
  while :; do
    scrape
    [ $(( $(delivered) - relayed0 )) -ge "$total_accepted" ] && break
    [ "$(date +%s)" -lt "$deadline" ] || { say "backlog not drained after $SOAK_DRAIN_TIMEOUT s"; break; }
    sleep 1
  done
  done_t=$(now_s)
  awk -v a="$total_accepted" -v r=$(( $(delivered) - relayed0 )) -v s="$(awk -v a="$done_t" -v b="$run_start" 'BEGIN { print a - b }')" \
    'BEGIN { printf "drained: %d of %d relayed after %.0f s: end to end %.0f msgs/s\n", r, a, s, r / s }'
fi
relayed_total=$(( $(delivered) - relayed0 ))

# Disk per delivered message, after a checkpoint.
if [ "$SOAK_STORE" = sqlite ]; then
  stop_daemon
  sqlite3 "$DATA/smtp-once.db" 'PRAGMA wal_checkpoint(TRUNCATE);' >/dev/null
  read -r free_pages page_size < <(sqlite3 "$DATA/smtp-once.db" 'PRAGMA freelist_count; PRAGMA page_size;' | paste -sd' ')
  bytes=$(du -sb "$DATA" | cut -f1)
  awk -v b="$bytes" -v d="$relayed_total" -v a="$total_accepted" -v f=$((free_pages * page_size)) 'BEGIN {
    printf "disk after checkpoint: data dir %.1f MiB (%.1f MiB of it free pages), %.0f bytes per accepted message", b / 1048576, f / 1048576, b / a
    if (d > 0) printf ", %.0f per delivered", b / d
    printf "\n" }'
else
  psql "$PG_URL/$PG_DB" -X -q -c CHECKPOINT >/dev/null 2>&1 || say "CHECKPOINT needs superuser: skipped"
  bytes=$(psql "$PG_URL/$PG_DB" -X -Atc "SELECT pg_database_size(current_database())")
  awk -v b="$bytes" -v d="$relayed_total" -v a="$total_accepted" 'BEGIN {
    printf "disk after checkpoint: database %.1f MiB, %.0f bytes per accepted message", b / 1048576, b / a
    if (d > 0) printf ", %.0f per delivered", b / d
    printf "\n" }'
fi
exit 0
}
