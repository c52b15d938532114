#!/usr/bin/env bash
# benches/compare.sh: smtp-once side by side with Postfix, Haraka and
# smtp-sink, in one run on one machine (issue 5, item 4), accept-only and
# end to end through a relay (issue 10, item 5).
#
# Every peer listens on its own loopback port, plaintext, and accepts mail
# from 127.0.0.1 without AUTH. `smtp-once bench` drives each one with the
# same load (4 KiB messages, a unique idempotency key each, persistent
# pipelining connections), runs interleaved A B C D A B C D ... because this
# machine's speed drifts, and after every run the script checks that each
# durable peer really stored as many messages as it acknowledged with 250.
#
#   smtp-once     SQLite WAL, synchronous=FULL (fsync before 250), relay file
#   postfix       Debian's Postfix, private instance, defer_transports = smtp
#   postfix-hold  the same instance, every message to the hold queue
#   haraka        Haraka 3 (npm) + benches/haraka/plugins/queue_fsync.js
#   smtp-sink     from the postfix package: stores nothing, protocol ceiling
# smtp-once on PostgreSQL ([store] backend = "postgres", relay paused and
# every other setting as the smtp-once peer; not in the default PEERS:
# benches/postgres.sh adds them; skipped with a warning when PG_URL does
# not answer):
#   smtp-once-pg   one node on a fresh database (created at start, dropped
#                  at exit), counted as rows in its queue table (psql)
#   smtp-once-pg2  two nodes (own data_dir, port and node_id each) on one
#                  fresh database. The load is split: two `smtp-once bench`
#                  at once, one per node, each with half the connections and
#                  half the messages; msgs/s = all messages / the longer of
#                  the two runs (not the sum of their rates, which would
#                  credit the node that finished first with the time the
#                  other still ran), p50/p90/p99/max the larger of the two
#                  (an upper bound of the combined percentile)
# End to end (each relays to its own smtp-sink, which dumps what it gets):
#   smtp-once-relay  smtp-once, [relay] mode = "smarthost", tls = "none"
#   postfix-relay    a second private Postfix instance, relayhost = its sink
#   smtp-sink-dump   accept-only: a sink like theirs (dumping every message),
#                    driven directly: the ceiling of an end-to-end run
# For these the run lasts until the sink has every acknowledged message and
# the peer has recorded it as relayed (benches/relay_wait.py), and the table
# shows acceptance msgs/s while relaying, end-to-end msgs/s (bench start to
# the last message recorded as relayed), p99, and the sink's count and
# distinct X-Bird-Idempotency-Key values against the peer's delivered count.
#
# Usage: benches/compare.sh [--quick] [--markdown] [--help]
#   --quick               MESSAGES=2000 ROUNDS=1 WARMUP=200 unless set: minutes
# Settings (environment):
#   MESSAGES=20000        messages per run (DURATION=S runs S seconds instead;
#                         relay peers always send MESSAGES)
#   CONNS="8 32"          connection counts
#   RELAY_CONNS="32"      connection counts for the relay peers (within CONNS)
#   ROUNDS=3              interleaved rounds
#   SIZE=4096             message size in bytes
#   PEERS="smtp-once postfix postfix-hold haraka smtp-sink smtp-once-relay postfix-relay smtp-sink-dump"
#   WARMUP=1000           messages per peer before round 1 (0: none)
#   BASE_PORT=25250       peers listen on BASE_PORT+1 .. BASE_PORT+7, +10, +11
#                         (smtp-once-pg), +12 and +13 (smtp-once-pg2's nodes),
#                         the relay peers' sinks on BASE_PORT+8 and +9
#   PG_URL=postgres://postgres@127.0.0.1:5432   the PostgreSQL server of
#                         smtp-once-pg and -pg2, without a database name: the
#                         script creates bench_<WORKDIR name>_pg and _pg2 there
#                         (the role needs CREATEDB) and drops them at exit
#   PG_POOL_SIZE=8        their [store] pool_size (connections per node)
#   RELAY_POLL=100ms      smtp-once-relay's [relay] poll_interval
#   SMTP_ONCE_RELAY_EXTRA=  more TOML lines for smtp-once-relay's [relay] section,
#                         e.g. $'workers = 32\nmax_per_destination = 16'
#   RELAY_TIMEOUT=600     seconds a relay run may take to reach the sink
#   SINK_DUMP_DIR=/dev/shm (if present, else WORKDIR)  where the relay sinks dump
#   SMTP_ONCE_BIN=path    use this binary instead of `cargo build --release`
#   SMTP_ONCE_DELIVER=0   1: smtp-once's delivery worker runs during the benchmark,
#                         copying every accepted message to its file outbox (work
#                         the peers, which only queue, do not do; its backlog also
#                         keeps the CPU busy during the next peers' runs). 0: the
#                         relay is paused ([relay] paused = true), so accepted mail only queues.
#   HARAKA_NODES=1        Haraka smtp.ini nodes (0: no cluster, cpus: one per CPU)
#   HARAKA_NODELAY=1      load benches/haraka/plugins/tcp_nodelay.js (see there)
#   HARAKA_DIR=/tmp/smtp-once-compare-haraka   npm install of Haraka (kept, reused)
#   WORKDIR=/tmp/smtp-once-compare             run folder (removed at exit)
#   KEEP=1                keep WORKDIR (configs, logs, queues) and the PostgreSQL
#                         databases after the run (the next run drops them)
#   RESULTS=file          also write the raw per-run results (TSV) there
#   NO_INSTALL=1          never apt-get/npm install; skip peers that are missing
#
# stdout gets the result table only; progress and warnings go to stderr
# (with --markdown, the plain table goes there too).
# Exit status: 0 ok, 1 error or a peer stored fewer/more messages than it
# acknowledged.
set -euo pipefail

# The whole script is one { ... } block, which bash reads in full before it
# runs any of it: editing this file during a run cannot derail that run.
{
BENCHES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(dirname "$BENCHES_DIR")

MARKDOWN=0
QUICK=0
for arg in "$@"; do
  case "$arg" in
    --markdown) MARKDOWN=1 ;;
    --quick) QUICK=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare.sh: unknown argument $arg (try --help)" >&2; exit 2 ;;
  esac
done

if [ "$QUICK" = 1 ]; then
  MESSAGES=${MESSAGES:-2000}
  ROUNDS=${ROUNDS:-1}
  WARMUP=${WARMUP:-200}
fi
MESSAGES=${MESSAGES:-20000}
DURATION=${DURATION:-}
CONNS=${CONNS:-"8 32"}
RELAY_CONNS=${RELAY_CONNS:-32}
ROUNDS=${ROUNDS:-3}
SIZE=${SIZE:-4096}
PEERS=${PEERS:-"smtp-once postfix postfix-hold haraka smtp-sink smtp-once-relay postfix-relay smtp-sink-dump"}
WARMUP=${WARMUP:-1000}
RELAY_POLL=${RELAY_POLL:-100ms}
SMTP_ONCE_RELAY_EXTRA=${SMTP_ONCE_RELAY_EXTRA:-}
RELAY_TIMEOUT=${RELAY_TIMEOUT:-600}
if [ -z "${SINK_DUMP_DIR:-}" ]; then
  if [ -d /dev/shm ] && [ -w /dev/shm ]; then SINK_DUMP_DIR=/dev/shm; else SINK_DUMP_DIR=${WORKDIR:-/tmp/smtp-once-compare}; fi
fi
BASE_PORT=${BASE_PORT:-25250}
HARAKA_NODES=${HARAKA_NODES:-1}
HARAKA_NODELAY=${HARAKA_NODELAY:-1}
HARAKA_DIR=${HARAKA_DIR:-/tmp/smtp-once-compare-haraka}
WORKDIR=${WORKDIR:-/tmp/smtp-once-compare}
KEEP=${KEEP:-0}
RESULTS=${RESULTS:-}
NO_INSTALL=${NO_INSTALL:-0}
SMTP_ONCE_DELIVER=${SMTP_ONCE_DELIVER:-0}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432}
PG_URL=${PG_URL%/}
PG_POOL_SIZE=${PG_POOL_SIZE:-8}
HARAKA_VERSION_SPEC=Haraka@3
START_TIMEOUT=60      # seconds for a server to answer 220
QUIET_TIMEOUT=180     # seconds for Postfix's queue manager to settle

log() { printf '[compare %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
warn() { printf '[compare %(%H:%M:%S)T] WARNING: %s\n' -1 "$*" >&2; }
die() { printf '[compare %(%H:%M:%S)T] ERROR: %s\n' -1 "$*" >&2; exit 1; }

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
for v in MESSAGES ROUNDS SIZE WARMUP BASE_PORT RELAY_TIMEOUT PG_POOL_SIZE; do
  is_uint "${!v}" || die "$v must be a whole number, got '${!v}'"
done
[ -z "$DURATION" ] || is_uint "$DURATION" || die "DURATION must be whole seconds, got '$DURATION'"
for c in $CONNS $RELAY_CONNS; do is_uint "$c" && [ "$c" -gt 0 ] || die "CONNS and RELAY_CONNS must be positive numbers, got '$CONNS' and '$RELAY_CONNS'"; done
[ "$ROUNDS" -gt 0 ] || die "ROUNDS must be at least 1"
[ "$(id -u)" -eq 0 ] || die "run as root (it installs packages and runs a private Postfix instance)"
case "$WORKDIR" in /tmp/?*|/var/tmp/?*) ;; *) die "WORKDIR must be under /tmp or /var/tmp (it is removed at exit), got $WORKDIR" ;; esac

declare -A PORT=(
  [smtp-once]=$((BASE_PORT + 1)) [postfix]=$((BASE_PORT + 2)) [postfix-hold]=$((BASE_PORT + 3))
  [haraka]=$((BASE_PORT + 4)) [smtp-sink]=$((BASE_PORT + 5))
  [smtp-once-relay]=$((BASE_PORT + 6)) [postfix-relay]=$((BASE_PORT + 7))
  [smtp-sink-dump]=$((BASE_PORT + 10))
  [smtp-once-pg]=$((BASE_PORT + 11)) [smtp-once-pg2]=$((BASE_PORT + 12))
)
# smtp-once-pg2's second node (PORT is its first).
declare -A PORT2=([smtp-once-pg2]=$((BASE_PORT + 13)))
# The smtp-sink each relay peer relays to (not peers themselves).
declare -A RELAY_SINK_PORT=([smtp-once-relay]=$((BASE_PORT + 8)) [postfix-relay]=$((BASE_PORT + 9)))
declare -A DURABLE=([smtp-once]=yes [postfix]=yes [postfix-hold]=yes [haraka]=yes [smtp-sink]=no
  [smtp-once-relay]=yes [postfix-relay]=yes [smtp-sink-dump]=no
  [smtp-once-pg]=yes [smtp-once-pg2]=yes)
# The PostgreSQL peers' databases: named after WORKDIR, so that runs with
# different WORKDIRs do not share one, and recorded in $WORKDIR/pg-databases
# before they are created, so that cleanup finds them.
pg_prefix=$(printf '%s' "$(basename "$WORKDIR")" | tr '[:upper:]' '[:lower:]' | tr -c 'a-z0-9' '_' | cut -c1-40)
declare -A PG_DB=([smtp-once-pg]=bench_${pg_prefix}_pg [smtp-once-pg2]=bench_${pg_prefix}_pg2)
is_relay() { [ -n "${RELAY_SINK_PORT[$1]:-}" ]; }
for p in $PEERS; do
  [ -n "${PORT[$p]:-}" ] || die "unknown peer '$p' in PEERS (known: ${!PORT[*]})"
done
has_peer() { [[ " $ACTIVE " == *" $1 "* ]]; }
ACTIVE=" $PEERS "
SKIPPED=()
skip_peer() { # peer reason
  warn "skipping $1: $2"
  SKIPPED+=("$1 ($2)")
  ACTIVE=${ACTIVE/ $1 / }
}

# ---------------------------------------------------------------------------
# Cleanup: every server this script starts is recorded in $WORKDIR/pids (its
# own process group, started with setsid) or is the Postfix instance under
# $WORKDIR/postfix; both are stopped at exit, and at start when a previous
# run was killed before it could clean up.

stop_group() { # pgid name
  local pgid=$1 name=$2 i cmd
  kill -0 -- "-$pgid" 2>/dev/null || return 0
  # After a crash or a reboot the id may belong to someone else by now:
  # only a group led by one of our servers is ours.
  cmd=$(tr '\0' ' ' < "/proc/$pgid/cmdline" 2>/dev/null || true)
  if [[ $cmd != *"$WORKDIR"* && $cmd != */usr/sbin/smtp-sink* ]]; then
    warn "process group $pgid ($name) is not one of ours any more (${cmd:-gone}): left alone"
    return 0
  fi
  kill -TERM -- "-$pgid" 2>/dev/null || true
  for i in $(seq 1 50); do
    kill -0 -- "-$pgid" 2>/dev/null || return 0
    sleep 0.2
  done
  warn "$name (process group $pgid) ignored SIGTERM for 10 s: SIGKILL"
  kill -KILL -- "-$pgid" 2>/dev/null || true
}

stop_postfix() { # base dir
  local base=$1 pid
  [ -f "$base/etc/main.cf" ] || return 0
  if [ -f "$base/queue/pid/master.pid" ]; then
    pid=$(tr -dc 0-9 < "$base/queue/pid/master.pid")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q master "/proc/$pid/comm" 2>/dev/null; then
      postfix -c "$base/etc" stop >/dev/null 2>&1 || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      if kill -0 "$pid" 2>/dev/null; then
        warn "Postfix master $pid still running: SIGKILL to its process group"
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
      fi
    fi
  fi
}

stop_all() { # workdir
  local dir=$1 pgid name
  if [ -f "$dir/pids" ]; then
    while read -r pgid name; do
      [ -n "$pgid" ] && stop_group "$pgid" "$name"
    done < "$dir/pids"
    : > "$dir/pids"
  fi
  stop_postfix "$dir/postfix"
  stop_postfix "$dir/postfix-relay"
}

# psql on one database of PG_URL's server; -X: no ~/.psqlrc.
pg_psql() { # database psql-args...
  local db=$1
  shift
  PGCONNECT_TIMEOUT=${PGCONNECT_TIMEOUT:-5} PGOPTIONS="-c client_min_messages=warning" psql "$PG_URL/$db" -X -q -t -A -v ON_ERROR_STOP=1 "$@" < /dev/null
}

# Drops the databases a run recorded in its pg-databases (after stop_all:
# DROP ... WITH (FORCE) would end a running node's connections).
drop_pg_databases() { # workdir
  local f=$1/pg-databases db
  [ -s "$f" ] || return 0
  if ! command -v psql >/dev/null 2>&1; then
    warn "psql is missing: cannot drop the PostgreSQL databases $(tr '\n' ' ' < "$f")"
    return 0
  fi
  while read -r db; do
    [[ $db =~ ^bench_[a-z0-9_]+$ ]] || continue
    if pg_psql postgres -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1; then
      log "dropped PostgreSQL database $db"
    else
      warn "could not drop PostgreSQL database $db on ${PG_URL#*@}"
    fi
  done < "$f"
  : > "$f"
}

CLEANED=0
WAIT_PID=""   # a relay run's relay_wait.py, while it runs
cleanup() {
  local rc=$?
  [ "$CLEANED" -eq 1 ] && return
  CLEANED=1
  trap - INT TERM
  [ -n "$WAIT_PID" ] && kill "$WAIT_PID" 2>/dev/null
  if [ -d "$WORKDIR" ]; then
    stop_all "$WORKDIR"
    if [ -n "$RESULTS" ] && [ -f "$WORKDIR/results.tsv" ]; then
      cp "$WORKDIR/results.tsv" "$RESULTS" || warn "cannot write RESULTS=$RESULTS"
    fi
    if [ "$KEEP" = 1 ]; then
      log "KEEP=1: configs, logs and queues left in $WORKDIR (sink dumps in $DUMP_DIR)"
      [ -s "$WORKDIR/pg-databases" ] && log "KEEP=1: PostgreSQL databases left on ${PG_URL#*@}: $(tr '\n' ' ' < "$WORKDIR/pg-databases")"
    else
      drop_pg_databases "$WORKDIR"
      log "removing $WORKDIR"
      rm -rf "$WORKDIR" ${DUMP_DIR:+"$DUMP_DIR"}
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The relay sinks' dump files: in memory by default, and relay_wait.py frees
# what it has read, so they stay small.
DUMP_DIR=$SINK_DUMP_DIR/smtp-once-compare-sinks.$(basename "$WORKDIR")
if [ -d "$WORKDIR" ]; then
  log "stopping what a previous run left in $WORKDIR"
  stop_all "$WORKDIR"
  drop_pg_databases "$WORKDIR"
  rm -rf "$WORKDIR"
fi
rm -rf "$DUMP_DIR"
mkdir -p "$WORKDIR"
chmod 755 "$WORKDIR"   # Postfix's unprivileged daemons must reach their queue
: > "$WORKDIR/pids"

start_bg() { # name logfile cmd... ; sets BG_PID
  local name=$1 logfile=$2
  shift 2
  setsid "$@" > "$logfile" 2>&1 < /dev/null &
  BG_PID=$!
  echo "$BG_PID $name" >> "$WORKDIR/pids"
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_smtp() { # name port pid-or-empty logfile
  local name=$1 port=$2 pid=$3 logfile=$4 deadline=$((SECONDS + START_TIMEOUT)) banner
  while [ "$SECONDS" -lt "$deadline" ]; do
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      warn "$name exited during start-up; last lines of $logfile:"
      tail -n 20 "$logfile" >&2 || true
      return 1
    fi
    banner=$(timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port && IFS= read -r l <&3 && printf 'QUIT\r\n' >&3 && printf '%s' \"\$l\"" 2>/dev/null || true)
    if [[ $banner == 220* ]]; then
      log "$name answers on 127.0.0.1:$port: ${banner%$'\r'}"
      return 0
    fi
    sleep 0.3
  done
  warn "$name did not answer 220 on 127.0.0.1:$port within ${START_TIMEOUT}s; last lines of $logfile:"
  tail -n 20 "$logfile" >&2 || true
  return 1
}

# ---------------------------------------------------------------------------
# Tools: python3 (JSON, SQLite, the table), the smtp-once binary, Postfix and
# smtp-sink (Debian), Haraka (npm).

APT_UPDATED=0
apt_install() { # packages...
  [ "$NO_INSTALL" = 1 ] && return 1
  if [ "$APT_UPDATED" = 0 ]; then
    log "apt-get update"
    apt-get update -qq >&2 || return 1
    APT_UPDATED=1
  fi
  log "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

if ! command -v python3 >/dev/null 2>&1; then
  apt_install python3 || die "python3 is needed (JSON, SQLite counts, the table) and could not be installed"
fi
python3 -c 'import sqlite3, json, statistics' 2>/dev/null \
  || die "python3 lacks the sqlite3/json/statistics modules"

mkdir -p "$WORKDIR/bin"
if [ -n "${SMTP_ONCE_BIN:-}" ]; then
  [ -x "$SMTP_ONCE_BIN" ] || die "SMTP_ONCE_BIN=$SMTP_ONCE_BIN is not an executable"
  SRC_BIN=$SMTP_ONCE_BIN
else
  command -v cargo >/dev/null 2>&1 || die "cargo not found: install Rust or set SMTP_ONCE_BIN"
  log "cargo build --release (set SMTP_ONCE_BIN to skip)"
  (cd "$REPO_DIR" && cargo build --release --quiet >&2) || die "cargo build --release failed"
  SRC_BIN=$REPO_DIR/target/release/smtp-once
fi
# A private copy: a rebuild during the run must not change the binary.
# `smtp-once bench` runs the smtp-once-bench binary from its own folder, so
# that one comes along (builds before it had the bench inside).
cp "$SRC_BIN" "$WORKDIR/bin/smtp-once"
SRC_BENCH=$(dirname "$SRC_BIN")/smtp-once-bench
[ ! -x "$SRC_BENCH" ] || cp "$SRC_BENCH" "$WORKDIR/bin/smtp-once-bench"
BIN=$WORKDIR/bin/smtp-once
"$BIN" bench --help >/dev/null 2>&1 || die "$SRC_BIN has no 'bench' subcommand, nor an smtp-once-bench beside it"

need_postfix=0
{ has_peer postfix || has_peer postfix-hold || has_peer smtp-sink || has_peer smtp-once-relay || has_peer postfix-relay || has_peer smtp-sink-dump; } && need_postfix=1
if [ "$need_postfix" = 1 ] && { ! command -v postfix >/dev/null 2>&1 || [ ! -x /usr/sbin/smtp-sink ]; }; then
  # "No configuration": the package installs without creating or starting
  # the system's own mail server.
  echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections 2>/dev/null || true
  apt_install postfix || true
fi
if [ "$need_postfix" = 1 ]; then
  if ! command -v postfix >/dev/null 2>&1 || ! getent passwd postfix >/dev/null; then
    has_peer postfix && skip_peer postfix "postfix is not installed"
    has_peer postfix-hold && skip_peer postfix-hold "postfix is not installed"
    has_peer postfix-relay && skip_peer postfix-relay "postfix is not installed"
  fi
  if [ ! -x /usr/sbin/smtp-sink ]; then
    for p in smtp-sink smtp-once-relay postfix-relay smtp-sink-dump; do
      has_peer "$p" && skip_peer "$p" "/usr/sbin/smtp-sink is missing"
    done
  fi
fi

HARAKA_BIN=$HARAKA_DIR/node_modules/Haraka/bin/haraka
if has_peer haraka && [ ! -f "$HARAKA_BIN" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    apt_install nodejs npm || true
  fi
  if ! command -v npm >/dev/null 2>&1; then
    skip_peer haraka "node/npm not available"
  elif [ "$NO_INSTALL" = 1 ]; then
    skip_peer haraka "not installed in $HARAKA_DIR and NO_INSTALL=1"
  else
    log "npm install $HARAKA_VERSION_SPEC into $HARAKA_DIR"
    mkdir -p "$HARAKA_DIR"
    if ! npm install --prefix "$HARAKA_DIR" --no-audit --no-fund --loglevel=error "$HARAKA_VERSION_SPEC" >&2 \
        || [ ! -f "$HARAKA_BIN" ]; then
      skip_peer haraka "npm install $HARAKA_VERSION_SPEC failed"
    fi
  fi
fi

if has_peer smtp-once-pg || has_peer smtp-once-pg2; then
  if ! command -v psql >/dev/null 2>&1; then
    apt_install postgresql-client || true
  fi
  pg_reason=""
  if ! command -v psql >/dev/null 2>&1; then
    pg_reason="psql is not installed (apt-get install postgresql-client)"
  elif ! pg_err=$(pg_psql postgres -c 'SELECT 1' 2>&1 >/dev/null); then
    pg_reason="PostgreSQL does not answer at ${PG_URL#*@} (set PG_URL): $(printf '%s' "$pg_err" | tr '\n' ' ' | cut -c1-200)"
  fi
  if [ -n "$pg_reason" ]; then
    for p in smtp-once-pg smtp-once-pg2; do
      has_peer "$p" && skip_peer "$p" "$pg_reason"
    done
  fi
fi

ACTIVE=$(echo $ACTIVE)   # trim
[ -n "$ACTIVE" ] || die "no peer left to run"

for p in $ACTIVE; do
  port_free "${PORT[$p]}" || die "127.0.0.1:${PORT[$p]} (for $p) is already in use: set BASE_PORT"
  if [ -n "${PORT2[$p]:-}" ]; then
    port_free "${PORT2[$p]}" || die "127.0.0.1:${PORT2[$p]} (for $p's second node) is already in use: set BASE_PORT"
  fi
  if is_relay "$p"; then
    port_free "${RELAY_SINK_PORT[$p]}" || die "127.0.0.1:${RELAY_SINK_PORT[$p]} (for $p's sink) is already in use: set BASE_PORT"
  fi
done

# ---------------------------------------------------------------------------
# Servers

VERSIONS=()
if [ "$SMTP_ONCE_DELIVER" = 1 ]; then so_mode="delivering to its file outbox during the run"; else so_mode="queue only: delivery worker idle during the run"; fi
has_peer smtp-once && VERSIONS+=("smtp-once $("$BIN" --version 2>/dev/null | awk '{print $NF}') ($so_mode)")

# The accept-only smtp-once's config, also the PostgreSQL nodes' (which add
# server.node_id and a [store] section).
write_smtp_once_toml() { # dir hostname port [more [server] lines] [more sections]
  local d=$1 host=$2 port=$3 server_extra=${4:-} sections=${5:-}
  mkdir -p "$d/data" "$d/outbox"
  local relay_extra=""
  if [ "$SMTP_ONCE_DELIVER" != 1 ]; then
    # Queue only, like the peers: the worker claims nothing.
    relay_extra='paused = true'
  fi
  cat > "$d/smtp-once.toml" <<EOF
# Written by benches/compare.sh
[server]
hostname = "$host"
data_dir = "$d/data"
max_connections = 1000
shutdown_grace = "5s"
$server_extra

[[listener]]
addr = "127.0.0.1:$port"
tls = "none"

[[trusted_network]]
cidr = "127.0.0.0/8"
workspace = "bench"

[relay]
mode = "file"
dir = "$d/outbox"
$relay_extra
$sections
EOF
  "$BIN" check-config --config "$d/smtp-once.toml" >&2
}

start_smtp_once() {
  local d=$WORKDIR/smtp-once
  write_smtp_once_toml "$d" smtp-once.bench.test "${PORT[smtp-once]}" || return 1
  start_bg smtp-once "$d/server.log" "$BIN" serve --config "$d/smtp-once.toml"
  wait_smtp smtp-once "${PORT[smtp-once]}" "$BG_PID" "$d/server.log"
}

# smtp-once-pg (one node) and smtp-once-pg2 (two): a fresh database, then
# the nodes one after the other (the first creates the schema), each with
# its own data_dir, outbox, port and node_id.
start_smtp_once_pg() { # peer nodes
  local peer=$1 nodes=$2 db=${PG_DB[$1]} i d port
  echo "$db" >> "$WORKDIR/pg-databases"
  log "creating PostgreSQL database $db on ${PG_URL#*@}"
  pg_psql postgres -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" -c "CREATE DATABASE \"$db\"" >&2 || return 1
  for i in $(seq 1 "$nodes"); do
    d=$WORKDIR/$peer/node-$i
    if [ "$i" = 1 ]; then port=${PORT[$peer]}; else port=${PORT2[$peer]}; fi
    write_smtp_once_toml "$d" "$peer-$i.bench.test" "$port" "node_id = \"$peer-node-$i\"" \
      "$(printf '[store]\nbackend = "postgres"\nurl = "%s"\npool_size = %s' "$PG_URL/$db" "$PG_POOL_SIZE")" || return 1
    start_bg "$peer-node-$i" "$d/server.log" "$BIN" serve --config "$d/smtp-once.toml"
    wait_smtp "$peer node $i" "$port" "$BG_PID" "$d/server.log" || return 1
  done
  local pgv pgset
  pgv=$(pg_psql postgres -c 'SHOW server_version' 2>/dev/null | awk '{print $1}')
  pgset=$(pg_psql postgres -F ' = ' -c "SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit') ORDER BY name" 2>/dev/null | paste -sd, - | sed 's/,/, /g')
  if [ "$nodes" = 1 ]; then
    VERSIONS+=("smtp-once-pg: the same binary, [store] backend = \"postgres\" (PostgreSQL $pgv at ${PG_URL#*@}${pgset:+, $pgset}, pool_size $PG_POOL_SIZE), one node ($so_mode)")
  else
    VERSIONS+=("smtp-once-pg2: $nodes such nodes on one database, the load split between them (each node half the connections and half the messages; msgs/s = all messages / the longer run, p99 = the larger)")
  fi
}

PF=$WORKDIR/postfix
start_postfix() {
  mkdir -p "$PF/etc" "$PF/queue" "$PF/data"
  chown postfix "$PF/data"
  local f
  for f in main.cf master.cf; do
    sed -e "s#@BASE@#$PF#g" -e "s#@PORT@#${PORT[postfix]}#g" -e "s#@HOLD_PORT@#${PORT[postfix-hold]}#g" \
      "$BENCHES_DIR/postfix/$f.in" > "$PF/etc/$f"
  done
  # Postfix logs its own errors to syslog or maillog_file only.
  if ! postfix -c "$PF/etc" check >&2 || ! postfix -c "$PF/etc" start >&2; then
    warn "postfix failed to start; $PF/maillog says:"
    tail -n 20 "$PF/maillog" >&2 2>/dev/null || true
    return 1
  fi
  wait_smtp postfix "${PORT[postfix]}" "" "$PF/maillog" || return 1
  VERSIONS+=("Postfix $(postconf -c "$PF/etc" -h mail_version)")
}

HK=$WORKDIR/haraka
start_haraka() {
  local plugins
  rm -rf "$HK"
  node "$HARAKA_BIN" -i "$HK/instance" >/dev/null || return 1
  cp "$BENCHES_DIR"/haraka/config/* "$HK/instance/config/"
  mkdir -p "$HK/instance/plugins" "$HK/spool"
  cp "$BENCHES_DIR"/haraka/plugins/*.js "$HK/instance/plugins/"
  printf '; Written by benches/compare.sh\n[main]\nlisten=127.0.0.1:%s\nnodes=%s\n' \
    "${PORT[haraka]}" "$HARAKA_NODES" > "$HK/instance/config/smtp.ini"
  printf '; Written by benches/compare.sh\n[main]\ndir=%s\n' "$HK/spool" > "$HK/instance/config/queue_fsync.ini"
  if [ "$HARAKA_NODELAY" != 1 ]; then
    plugins=$(grep -v '^tcp_nodelay$' "$HK/instance/config/plugins")
    printf '%s\n' "$plugins" > "$HK/instance/config/plugins"
  fi
  start_bg haraka "$HK/haraka.log" node "$HARAKA_BIN" -c "$HK/instance"
  wait_smtp haraka "${PORT[haraka]}" "$BG_PID" "$HK/haraka.log" || return 1
  VERSIONS+=("Haraka $(node -p "require('$HARAKA_DIR/node_modules/Haraka/package.json').version") (node $(node --version | tr -d v), nodes=$HARAKA_NODES)")
}

start_sink() {
  # No -c: its counter costs a terminal write per message. -m: connection cap.
  start_bg smtp-sink "$WORKDIR/smtp-sink.log" /usr/sbin/smtp-sink -u nobody -m 1000 "127.0.0.1:${PORT[smtp-sink]}" 1000
  wait_smtp smtp-sink "${PORT[smtp-sink]}" "$BG_PID" "$WORKDIR/smtp-sink.log"
}

# A relay peer's smtp-sink: appends every transaction to a dump file that
# relay_wait.py reads (and frees) to count the messages and their keys.
start_relay_sink() { # peer
  local peer=$1
  mkdir -p "$DUMP_DIR"
  chmod 1777 "$DUMP_DIR"   # the sink writes as nobody
  : > "$WORKDIR/$peer.keys"
  start_bg "$peer-sink" "$WORKDIR/$peer-sink.log" /usr/sbin/smtp-sink -u nobody -m 1000 \
    -D "$DUMP_DIR/$peer.dump" "127.0.0.1:${RELAY_SINK_PORT[$peer]}" 1000
  wait_smtp "$peer's smtp-sink" "${RELAY_SINK_PORT[$peer]}" "$BG_PID" "$WORKDIR/$peer-sink.log"
}

start_smtp_once_relay() {
  local d=$WORKDIR/smtp-once-relay
  mkdir -p "$d/data"
  start_relay_sink smtp-once-relay || return 1
  cat > "$d/smtp-once.toml" <<EOF
# Written by benches/compare.sh
[server]
hostname = "smtp-once-relay.bench.test"
data_dir = "$d/data"
max_connections = 1000
shutdown_grace = "5s"

[[listener]]
addr = "127.0.0.1:${PORT[smtp-once-relay]}"
tls = "none"

[[trusted_network]]
cidr = "127.0.0.0/8"
workspace = "bench"

[relay]
mode = "smarthost"
smarthost = "127.0.0.1:${RELAY_SINK_PORT[smtp-once-relay]}"
tls = "none"
poll_interval = "$RELAY_POLL"
$SMTP_ONCE_RELAY_EXTRA
EOF
  "$BIN" check-config --config "$d/smtp-once.toml" >&2 || return 1
  start_bg smtp-once-relay "$d/server.log" "$BIN" serve --config "$d/smtp-once.toml"
  wait_smtp smtp-once-relay "${PORT[smtp-once-relay]}" "$BG_PID" "$d/server.log" || return 1
  VERSIONS+=("smtp-once-relay: the same binary, smarthost mode to its smtp-sink, poll_interval $RELAY_POLL${SMTP_ONCE_RELAY_EXTRA:+, $(echo $SMTP_ONCE_RELAY_EXTRA)}")
}

# A second private Postfix instance from the same templates: its smtpd port
# only, no defer_transports, relayhost = its sink; every other setting as
# the accept-only instance (Postfix's defaults for the smtp client: the
# connection cache, 20 connections to one destination).
PFR=$WORKDIR/postfix-relay
start_postfix_relay() {
  mkdir -p "$PFR/etc" "$PFR/queue" "$PFR/data"
  chown postfix "$PFR/data"
  start_relay_sink postfix-relay || return 1
  local f
  for f in main.cf master.cf; do
    sed -e "s#@BASE@#$PFR#g" -e "s#@PORT@#${PORT[postfix-relay]}#g" -e "s#@HOLD_PORT@#0#g" \
      "$BENCHES_DIR/postfix/$f.in" > "$PFR/etc/$f"
  done
  postconf -c "$PFR/etc" -X bench_hold_restrictions 2>/dev/null || return 1
  postconf -c "$PFR/etc" -MX "127.0.0.1:0/inet" >&2 || return 1
  postconf -c "$PFR/etc" -e "relayhost = [127.0.0.1]:${RELAY_SINK_PORT[postfix-relay]}" "defer_transports =" \
    "myhostname = postfix-relay.bench.test" >&2 || return 1
  if ! postfix -c "$PFR/etc" check >&2 || ! postfix -c "$PFR/etc" start >&2; then
    warn "postfix-relay failed to start; $PFR/maillog says:"
    tail -n 20 "$PFR/maillog" >&2 2>/dev/null || true
    return 1
  fi
  wait_smtp postfix-relay "${PORT[postfix-relay]}" "" "$PFR/maillog" || return 1
  VERSIONS+=("postfix-relay: Postfix $(postconf -c "$PFR/etc" -h mail_version), relayhost = its smtp-sink, smtp client defaults (connection cache, destination concurrency $(postconf -c "$PFR/etc" -h default_destination_concurrency_limit))")
}

has_peer smtp-once && { start_smtp_once || die "smtp-once did not start (log: $WORKDIR/smtp-once/server.log; KEEP=1 keeps it)"; }
has_peer smtp-once-pg && { start_smtp_once_pg smtp-once-pg 1 || die "smtp-once-pg did not start (log: $WORKDIR/smtp-once-pg/node-1/server.log; KEEP=1 keeps it)"; }
has_peer smtp-once-pg2 && { start_smtp_once_pg smtp-once-pg2 2 || die "smtp-once-pg2 did not start (logs: $WORKDIR/smtp-once-pg2/node-*/server.log; KEEP=1 keeps them)"; }
if has_peer postfix || has_peer postfix-hold; then
  if start_postfix; then
    has_peer postfix-hold && { wait_smtp postfix-hold "${PORT[postfix-hold]}" "" "$PF/maillog" || skip_peer postfix-hold "its smtpd does not answer"; }
  else
    has_peer postfix && skip_peer postfix "did not start"
    has_peer postfix-hold && skip_peer postfix-hold "did not start"
  fi
fi
has_peer haraka && { start_haraka || skip_peer haraka "did not start"; }
has_peer smtp-sink && { start_sink || skip_peer smtp-sink "did not start"; }
# The relay sinks' twin, benchmarked directly; its dump is emptied after every run.
start_sink_dump() {
  mkdir -p "$DUMP_DIR"
  chmod 1777 "$DUMP_DIR"
  start_bg smtp-sink-dump "$WORKDIR/smtp-sink-dump.log" /usr/sbin/smtp-sink -u nobody -m 1000 \
    -D "$DUMP_DIR/smtp-sink-dump.dump" "127.0.0.1:${PORT[smtp-sink-dump]}" 1000
  wait_smtp smtp-sink-dump "${PORT[smtp-sink-dump]}" "$BG_PID" "$WORKDIR/smtp-sink-dump.log"
}
has_peer smtp-sink-dump && { start_sink_dump || skip_peer smtp-sink-dump "did not start"; }
has_peer smtp-once-relay && { start_smtp_once_relay || die "smtp-once-relay did not start (log: $WORKDIR/smtp-once-relay/server.log; KEEP=1 keeps it)"; }
has_peer postfix-relay && { start_postfix_relay || skip_peer postfix-relay "did not start"; }
ACTIVE=$(echo $ACTIVE)
[ -n "$ACTIVE" ] || die "no peer left to run"

# ---------------------------------------------------------------------------
# Stored-message counts, for the acked-versus-stored check.

postfix_queue_files() { # dirs...
  local n=0 d
  for d in "$@"; do
    n=$((n + $(find "$PF/queue/$d" -type f 2>/dev/null | wc -l)))
  done
  echo "$n"
}

# Waits until cleanup and the queue manager are done moving files, so that a
# count sees every message exactly once.
postfix_settle() {
  local deadline=$((SECONDS + QUIET_TIMEOUT)) a b
  a=-1
  while [ "$SECONDS" -lt "$deadline" ]; do
    if [ "$(postfix_queue_files incoming active)" -eq 0 ]; then
      b=$(postfix_queue_files incoming active deferred hold)
      [ "$b" -eq "$a" ] && return 0
      a=$b
    fi
    sleep 0.5
  done
  warn "Postfix queue still moving after ${QUIET_TIMEOUT}s (incoming+active: $(postfix_queue_files incoming active))"
}

stored_count() { # peer -> count, or "-" for peers that store nothing
  case "$1" in
    smtp-once)
      python3 - "$WORKDIR/smtp-once/data/smtp-once.db" <<'EOF'
import sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True, timeout=30)
print(db.execute("SELECT COUNT(*) FROM queue").fetchone()[0])
EOF
      ;;
    # One instance, two smtpd ports: plain messages end up in deferred, the
    # hold port's in hold; after postfix_settle nothing is in between.
    postfix) postfix_settle; postfix_queue_files incoming active deferred ;;
    postfix-hold) postfix_settle; postfix_queue_files hold ;;
    haraka) find "$HK/spool" -maxdepth 1 -type f -name '*.eml' | wc -l ;;
    # Every node's rows: the queue table of the peer's database.
    smtp-once-pg|smtp-once-pg2) pg_psql "${PG_DB[$1]}" -c 'SELECT COUNT(*) FROM queue' ;;
    *) echo - ;;
  esac
}

cpu_busy_jiffies() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8; exit}' /proc/stat; }

# ---------------------------------------------------------------------------
# Runs

RESULTS_TSV=$WORKDIR/results.tsv
# The last five columns are for the relay peers only ("-" otherwise).
printf 'peer\tdurable\tconns\tround\tmessages\tseconds\tmsgs_per_sec\tp50\tp90\tp99\tmax\tacked\tother_replies\terrors\tstored\tcpu_ms_per_msg\te2e_seconds\te2e_msgs_per_sec\tsink\tsink_keys\trelayed\n' > "$RESULTS_TSV"
MISMATCHES=()
FAILED_RUNS=()
declare -A STORED0 ACKED_TOTAL
for p in $ACTIVE; do
  STORED0[$p]=$(stored_count "$p")
  ACKED_TOTAL[$p]=0
done
declare -A RELAYED_TOTAL
for p in $ACTIVE; do RELAYED_TOTAL[$p]=0; done
CLK_TCK=$(getconf CLK_TCK)

# smtp-once-pg2's load: two `smtp-once bench` at once, one per node, each
# with half the connections and half the messages (the first gets the odd
# one), and one report of both on stdout: messages and replies summed,
# seconds the longer run's, msgs/s all messages / that, each latency
# percentile the larger of the two (an upper bound of the combined one).
bench_split() { # peer conns round (-n N | --duration S)
  local peer=$1 c=$2 round=$3 mode=$4 n=$5 err=$WORKDIR/bench-$1.err
  local c1=$(( (c + 1) / 2 )) c2=$(( c / 2 )) n1=$5 n2=$5 pid1 pid2 rc1=0 rc2=0
  if [ "$c2" -lt 1 ]; then
    echo "$peer: $c connection(s) cannot be split between two nodes" >> "$err"
    return 2
  fi
  if [ "$mode" = -n ]; then
    n1=$(( (n + 1) / 2 )) n2=$(( n / 2 ))
    if [ "$n2" -lt 1 ]; then
      echo "$peer: $n message(s) cannot be split between two nodes" >> "$err"
      return 2
    fi
  fi
  "$BIN" bench --server "127.0.0.1:${PORT[$peer]}" -c "$c1" "$mode" "$n1" --size "$SIZE" --json --quiet \
    > "$WORKDIR/$peer.node-1.json" 2>> "$err" &
  pid1=$!
  "$BIN" bench --server "127.0.0.1:${PORT2[$peer]}" -c "$c2" "$mode" "$n2" --size "$SIZE" --json --quiet \
    > "$WORKDIR/$peer.node-2.json" 2>> "$err" &
  pid2=$!
  wait "$pid1" || rc1=$?
  wait "$pid2" || rc2=$?
  if [ "$rc1" -ne 0 ] || [ "$rc2" -ne 0 ]; then
    echo "$peer: bench exit status node 1: $rc1, node 2: $rc2" >> "$err"
    return 1
  fi
  python3 - "$WORKDIR/$peer.node-1.json" "$WORKDIR/$peer.node-2.json" <<'EOF'
import json, sys, time
a, b = (json.load(open(f)) for f in sys.argv[1:3])
msgs = a["messages"] + b["messages"]
secs = max(a["seconds"], b["seconds"])
replies = {}
for r in (a, b):
    for k, v in r.get("replies", {}).items():
        replies[k] = replies.get(k, 0) + v
lat = {k: max(a["latency_ms"][k], b["latency_ms"][k]) for k in ("p50", "p90", "p99", "max")}
sys.stderr.write(
    "[compare %s] smtp-once-pg2 split: node 1 %d msgs in %.3f s (%.0f/s, p99 %.2f ms), "
    "node 2 %d msgs in %.3f s (%.0f/s, p99 %.2f ms)\n"
    % (time.strftime("%H:%M:%S"), a["messages"], a["seconds"], a["msgs_per_sec"], a["latency_ms"]["p99"],
       b["messages"], b["seconds"], b["msgs_per_sec"], b["latency_ms"]["p99"]))
print(json.dumps({
    "messages": msgs, "seconds": secs, "msgs_per_sec": msgs / secs if secs > 0 else 0.0,
    "latency_ms": lat, "replies": replies,
    "errors": a.get("errors", 0) + b.get("errors", 0), "nodes": [a, b],
}))
EOF
}

bench_one() { # peer conns round count
  local peer=$1 c=$2 round=$3 count=$4 before after j0 j1 out rc line acked stored
  local -a load
  if [ -n "$DURATION" ] && [ "$round" != warmup ]; then
    load=(--duration "$DURATION")
  else
    load=(-n "$count")
  fi
  before=$(stored_count "$peer")
  j0=$(cpu_busy_jiffies)
  rc=0
  if [ "$peer" = smtp-once-pg2 ]; then
    out=$(bench_split "$peer" "$c" "$round" "${load[@]}") || rc=$?
  else
    out=$("$BIN" bench --server "127.0.0.1:${PORT[$peer]}" -c "$c" "${load[@]}" --size "$SIZE" --json --quiet \
            2>> "$WORKDIR/bench-$peer.err") || rc=$?
  fi
  j1=$(cpu_busy_jiffies)
  [ "$peer" = smtp-sink-dump ] && : > "$DUMP_DIR/smtp-sink-dump.dump"
  if [ "$rc" -ne 0 ]; then
    warn "$peer c=$c round $round: smtp-once bench failed (exit $rc); last errors:"
    tail -n 5 "$WORKDIR/bench-$peer.err" >&2 || true
    FAILED_RUNS+=("$peer c=$c round $round")
    return 0
  fi
  after=$(stored_count "$peer")
  line=$(python3 - "$peer" "${DURABLE[$peer]}" "$c" "$round" "$before" "$after" "$((j1 - j0))" "$CLK_TCK" "$out" <<'EOF'
import json, sys
peer, durable, conns, rnd, before, after, jiffies, tck, out = sys.argv[1:]
r = json.loads(out)
replies = r.get("replies", {})
acked = int(replies.get("250", 0))
other = ",".join(f"{k}={v}" for k, v in sorted(replies.items()) if k != "250") or "-"
stored = "-" if before == "-" else str(int(after) - int(before))
msgs = max(int(r["messages"]), 1)
cpu_ms = int(jiffies) * 1000.0 / int(tck) / msgs
l = r["latency_ms"]
print("\t".join([peer, durable, conns, rnd, str(r["messages"]), f'{r["seconds"]:.3f}',
                 f'{r["msgs_per_sec"]:.1f}', f'{l["p50"]:.3f}', f'{l["p90"]:.3f}',
                 f'{l["p99"]:.3f}', f'{l["max"]:.3f}', str(acked), other,
                 str(r.get("errors", 0)), stored, f"{cpu_ms:.3f}", "-", "-", "-", "-", "-"]))
EOF
)
  echo "$line" >> "$RESULTS_TSV"
  IFS=$'\t' read -r _ _ _ _ _ _ mps _ _ p99 _ acked other errs stored _ <<< "$line"
  ACKED_TOTAL[$peer]=$(( ${ACKED_TOTAL[$peer]} + acked ))
  log "$(printf '%-12s c=%-3s round %-6s %9s msgs/s  p99 %7s ms  250=%s other=%s errors=%s stored=%s' \
    "$peer" "$c" "$round" "$mps" "$p99" "$acked" "$other" "$errs" "$stored")"
  if [ "$stored" != - ] && [ "$stored" -ne "$acked" ]; then
    warn "!!! MISMATCH: $peer acknowledged $acked messages with 250 but stored $stored (c=$c round $round) !!!"
    MISMATCHES+=("$peer c=$c round $round: 250 x $acked, stored $stored")
  fi
  if [ "$other" != - ] || [ "$errs" != 0 ]; then
    warn "$peer c=$c round $round: replies other than 250: $other, connection errors: $errs (see $WORKDIR/bench-$peer.err)"
  fi
}

# A relay peer: the same load, then wait until its sink has every
# acknowledged message and the peer has recorded each one as relayed.
# relay_wait.py runs alongside the load from its start, so the end-to-end
# time is the bench's start to the moment both were first seen (20 ms polls).
relay_wait() { # peer [extra args...]
  local peer=$1
  shift
  local -a peer_args
  case "$peer" in
    smtp-once-relay) peer_args=(--smtp-once-db "$WORKDIR/smtp-once-relay/data/smtp-once.db") ;;
    postfix-relay) peer_args=(--postfix-queue "$PFR/queue" --postfix-log "$PFR/maillog") ;;
  esac
  # exec: run in the background, $! is python itself (cleanup kills it).
  exec python3 "$BENCHES_DIR/relay_wait.py" --dump "$DUMP_DIR/$peer.dump" --keys "$WORKDIR/$peer.keys" \
    --state "$WORKDIR/$peer.wait-state" "${peer_args[@]}" "$@"
}

bench_relay() { # peer conns round count
  local peer=$1 c=$2 round=$3 count=$4 j0 j1 out rc line wpid t0
  local expect_file=$WORKDIR/$peer.expect wait_out=$WORKDIR/$peer.wait.json
  rm -f "$expect_file" "$wait_out"
  j0=$(cpu_busy_jiffies)
  t0=$EPOCHREALTIME
  relay_wait "$peer" --expect "$count" --expect-file "$expect_file" --timeout "$RELAY_TIMEOUT" > "$wait_out" &
  wpid=$!
  WAIT_PID=$wpid
  rc=0
  out=$("$BIN" bench --server "127.0.0.1:${PORT[$peer]}" -c "$c" -n "$count" --size "$SIZE" --json --quiet \
          2>> "$WORKDIR/bench-$peer.err") || rc=$?
  # What to wait for: every 250 (a refusal is never relayed).
  if [ "$rc" -eq 0 ]; then
    python3 -c 'import json,sys; print(json.loads(sys.argv[1])["replies"].get("250", 0))' "$out" > "$expect_file.tmp"
  else
    echo 0 > "$expect_file.tmp"
  fi
  mv "$expect_file.tmp" "$expect_file"
  wait "$wpid" || true
  WAIT_PID=""
  j1=$(cpu_busy_jiffies)
  if [ "$rc" -eq 0 ] && [ ! -s "$wait_out" ]; then
    warn "$peer c=$c round $round: relay_wait.py died without a result"
    FAILED_RUNS+=("$peer c=$c round $round: relay_wait.py died")
    return 0
  fi
  if [ "$rc" -ne 0 ]; then
    warn "$peer c=$c round $round: smtp-once bench failed (exit $rc); last errors:"
    tail -n 5 "$WORKDIR/bench-$peer.err" >&2 || true
    FAILED_RUNS+=("$peer c=$c round $round")
    return 0
  fi
  line=$(python3 - "$peer" "$c" "$round" "$((j1 - j0))" "$CLK_TCK" "$t0" "$out" "$(cat "$wait_out")" <<'EOF'
import json, sys
peer, conns, rnd, jiffies, tck, t0, out, waited = sys.argv[1:]
r = json.loads(out)
w = json.loads(waited)
replies = r.get("replies", {})
acked = int(replies.get("250", 0))
other = ",".join(f"{k}={v}" for k, v in sorted(replies.items()) if k != "250") or "-"
msgs = max(int(r["messages"]), 1)
cpu_ms = int(jiffies) * 1000.0 / int(tck) / msgs
l = r["latency_ms"]
if w["done"]:
    e2e = w["t_done"] - float(t0)
    e2e_s, e2e_rate = f"{e2e:.3f}", f"{acked / e2e:.1f}"
else:
    e2e_s, e2e_rate = "timeout", "0"
print("\t".join([peer, "yes", conns, rnd, str(r["messages"]), f'{r["seconds"]:.3f}',
                 f'{r["msgs_per_sec"]:.1f}', f'{l["p50"]:.3f}', f'{l["p90"]:.3f}',
                 f'{l["p99"]:.3f}', f'{l["max"]:.3f}', str(acked), other,
                 str(r.get("errors", 0)), str(w["recorded"]), f"{cpu_ms:.3f}",
                 e2e_s, e2e_rate, str(w["sink"]), str(w["sink_keys"]), str(w["recorded"])]))
EOF
)
  echo "$line" >> "$RESULTS_TSV"
  local mps p99 acked other errs e2e_s e2e_rate sink sink_keys relayed
  IFS=$'\t' read -r _ _ _ _ _ _ mps _ _ p99 _ acked other errs _ _ e2e_s e2e_rate sink sink_keys relayed <<< "$line"
  ACKED_TOTAL[$peer]=$(( ${ACKED_TOTAL[$peer]} + acked ))
  RELAYED_TOTAL[$peer]=$(( ${RELAYED_TOTAL[$peer]} + relayed ))
  log "$(printf '%-15s c=%-3s round %-6s accept %9s msgs/s  p99 %7s ms  end to end %9s msgs/s (%s s)  250=%s sink=%s keys=%s relayed=%s' \
    "$peer" "$c" "$round" "$mps" "$p99" "$e2e_rate" "$e2e_s" "$acked" "$sink" "$sink_keys" "$relayed")"
  if [ "$e2e_s" = timeout ]; then
    warn "$peer c=$c round $round: not every message reached the sink and was recorded within ${RELAY_TIMEOUT}s (sink $sink, relayed $relayed of $acked)"
    FAILED_RUNS+=("$peer c=$c round $round: relay timeout (sink $sink, relayed $relayed of $acked)")
  elif [ "$sink" -ne "$acked" ] || [ "$sink_keys" -ne "$acked" ] || [ "$relayed" -ne "$acked" ]; then
    warn "!!! MISMATCH: $peer acknowledged $acked, the sink received $sink ($sink_keys keys), the peer recorded $relayed relayed (c=$c round $round) !!!"
    MISMATCHES+=("$peer c=$c round $round: 250 x $acked, sink $sink (keys $sink_keys), relayed $relayed")
  fi
  if [ "$other" != - ] || [ "$errs" != 0 ]; then
    warn "$peer c=$c round $round: replies other than 250: $other, connection errors: $errs (see $WORKDIR/bench-$peer.err)"
  fi
}

run_one() { # peer conns round count
  if is_relay "$1"; then
    [[ " $RELAY_CONNS " == *" $2 "* ]] || return 0
    bench_relay "$@"
  else
    bench_one "$@"
  fi
}

max_conns=0
for c in $CONNS; do [ "$c" -gt "$max_conns" ] && max_conns=$c; done
if [ "$WARMUP" -gt 0 ]; then
  for p in $ACTIVE; do
    if is_relay "$p"; then bench_relay "$p" "$max_conns" warmup "$WARMUP"; else bench_one "$p" "$max_conns" warmup "$WARMUP"; fi
  done
fi

if [ -n "$DURATION" ]; then load_desc="${DURATION} s per run"; else load_desc="$MESSAGES messages per run"; fi
log "measuring: peers [$ACTIVE], connections [$CONNS], $ROUNDS round(s), $load_desc, $SIZE-byte messages"
T0=$SECONDS
for round in $(seq 1 "$ROUNDS"); do
  for c in $CONNS; do
    for p in $ACTIVE; do
      run_one "$p" "$c" "$round" "$MESSAGES"
    done
  done
done
log "measured in $((SECONDS - T0)) s"

# ---------------------------------------------------------------------------
# Final check over the whole run (warm-ups included), then the table.

VERIFY=()
for p in $ACTIVE; do
  [ "${DURABLE[$p]}" = yes ] || continue
  if is_relay "$p"; then
    # Stragglers included: anything relayed twice shows up here.
    tally=$(relay_wait "$p" --final)
    read -r received distinct dups < <(python3 -c 'import json,sys; t=json.loads(sys.argv[1]); print(t["received"], t["distinct"], t["duplicates"])' "$tally")
    if [ "$received" -eq "${ACKED_TOTAL[$p]}" ] && [ "$distinct" -eq "$received" ] && [ "${RELAYED_TOTAL[$p]}" -eq "$received" ]; then
      verdict=ok
    else
      verdict=MISMATCH
      MISMATCHES+=("$p overall: 250 x ${ACKED_TOTAL[$p]}, sink received $received ($distinct distinct keys), relayed ${RELAYED_TOTAL[$p]}")
    fi
    VERIFY+=("$p: ${ACKED_TOTAL[$p]} acknowledged, ${RELAYED_TOTAL[$p]} recorded relayed, its sink received $received with $distinct distinct idempotency keys ($dups duplicates): $verdict")
    continue
  fi
  total=$(( $(stored_count "$p") - ${STORED0[$p]} ))
  if [ "$total" -eq "${ACKED_TOTAL[$p]}" ]; then
    VERIFY+=("$p: ${ACKED_TOTAL[$p]} acknowledged, $total stored: ok")
  else
    VERIFY+=("$p: ${ACKED_TOTAL[$p]} acknowledged, $total stored: MISMATCH")
    MISMATCHES+=("$p overall: 250 x ${ACKED_TOTAL[$p]}, stored $total")
  fi
done
if has_peer smtp-once; then
  states=$(python3 - "$WORKDIR/smtp-once/data/smtp-once.db" <<'EOF'
import sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True, timeout=30)
rows = db.execute("SELECT state, COUNT(*) FROM queue GROUP BY state ORDER BY 2 DESC").fetchall()
print(", ".join(f"{n} {s}" for s, n in rows))
EOF
)
  VERIFY+=("smtp-once queue by state: $states; $(find "$WORKDIR/smtp-once/outbox" -type f | wc -l) files in its relay outbox (SMTP_ONCE_DELIVER=$SMTP_ONCE_DELIVER)")
fi
for p in smtp-once-pg smtp-once-pg2; do
  has_peer "$p" || continue
  states=$(pg_psql "${PG_DB[$p]}" -F ' ' -c 'SELECT COUNT(*), state FROM queue GROUP BY state ORDER BY 1 DESC' | paste -sd, - | sed 's/,/, /g')
  VERIFY+=("$p queue by state (database ${PG_DB[$p]}): ${states:-empty}; $(find "$WORKDIR/$p" -path '*/outbox/*' -type f | wc -l) files in its nodes' relay outboxes")
done
if has_peer postfix || has_peer postfix-hold; then
  # Postfix's own view of its queue, as a cross-check of the file count.
  pq=$(postqueue -c "$PF/etc" -p 2>/dev/null | tail -n 1 || true)
  [ -n "$pq" ] && VERIFY+=("postqueue -p (postfix + postfix-hold, whole run): ${pq#-- }")
fi

cpu_model=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)
[ -n "$cpu_model" ] || cpu_model=$(uname -m)
MACHINE="$(nproc) CPUs ($cpu_model), $(awk '/^MemTotal/ {printf "%.0f GiB RAM", $2/1048576}' /proc/meminfo), Linux $(uname -r), $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"

export MACHINE MARKDOWN ROUNDS SIZE CONNS RELAY_CONNS
export LOAD_DESC=$load_desc
export VERSIONS_TEXT=$(printf '%s\n' "${VERSIONS[@]}")
export VERIFY_TEXT=$(printf '%s\n' "${VERIFY[@]+"${VERIFY[@]}"}")
export SKIPPED_TEXT=$(printf '%s\n' "${SKIPPED[@]+"${SKIPPED[@]}"}")
export MISMATCH_TEXT=$(printf '%s\n' "${MISMATCHES[@]+"${MISMATCHES[@]}"}")
export FAILED_TEXT=$(printf '%s\n' "${FAILED_RUNS[@]+"${FAILED_RUNS[@]}"}")
if [ "$MARKDOWN" = 1 ]; then
  # The plain table on stderr too, next to the progress lines.
  MARKDOWN=0 python3 "$BENCHES_DIR/compare_report.py" "$RESULTS_TSV" >&2
fi
python3 "$BENCHES_DIR/compare_report.py" "$RESULTS_TSV"

if [ "${#MISMATCHES[@]}" -gt 0 ] || [ "${#FAILED_RUNS[@]}" -gt 0 ]; then
  exit 1
fi
exit 0
}
