#!/usr/bin/env bash
# benches/mx.sh: MX mode end to end through a real DNS rig, beside
# smarthost mode on the same build: what the TLS policy work (DNS lookups,
# DANE, MTA-STS) costs a relay whose lookups are cached.
#
# A DNS rig as tests/common/dns_rig.rs builds it: Knot serves the signed
# zone bench.test (ECDSA P-256, NSEC) on loopback, Unbound validates it with
# the zone's DS as its trust anchor. The zone has DOMAINS recipient domains
# d0..d<DOMAINS-1>.bench.test, each `MX 10 mx.bench.test`, `mx.bench.test A
# 127.0.0.2`, and `_<port>._tcp.mx.bench.test TLSA 3 1 1 <SHA-256 of the
# SPKI of certs/dev-cert.pem>`; every TTL and the SOA minimum (negative
# answers) are TTL (3600 s), so after the first message to a domain its
# lookups come from the relay's own cache.
#
# The next hop is a second smtp-once (the sink): `[relay] paused = true`, so
# it only stores (SQLite, fsync before 250, as the relay), STARTTLS with the
# dev certificate on 127.0.0.2:SINK_PORT (the MX host) and 127.0.0.1:
# SINK_PORT (the smarthost: the dev certificate names 127.0.0.1), accepting
# from 127.0.0.0/8 without AUTH. Three kinds of run, interleaved A B C, A B
# C, ... for ROUNDS, each with a fresh relay and a fresh sink (new data
# directories: the relay's DNS and MTA-STS caches start empty, Unbound's
# stays warm):
#   A  smarthost  mode = "smarthost", smarthost = 127.0.0.1:SINK_PORT,
#                 tls = "starttls", ca_file = certs/dev-cert.pem: the baseline
#   B  mx-dane    mode = "mx", mx_port = SINK_PORT, dns_servers = [Unbound],
#                 tls_default = "dane", mta_sts = true (the defaults): MX, A,
#                 AAAA, TLSA and _mta-sts TXT lookups, DANE-EE verification;
#                 every attempt must be recorded auth=dane-ee
#   C  mx-may     the same with tls_default = "may", mta_sts = false:
#                 MX and address lookups, opportunistic unverified STARTTLS
# Every run has the same [relay] workers, max_per_destination, max_backlog
# and poll_interval (and RELAY_EXTRA), and the same load: MESSAGES 4 KiB
# messages with UUID v4 keys, from DOMAINS `smtp-once bench` processes at
# once, one per domain (its one recipient is u<i>@d<i>.bench.test: the bench
# sends one envelope recipient), CONNS_PER_DOMAIN connections each, the
# messages split evenly. A run lasts until the relay has recorded every 250
# as delivered and nothing is pending (benches/mx_wait.py); then the sink's
# queue must hold exactly as many messages, and its `replayed` count shows
# any message relayed twice.
#
# Per run it prints accepted msgs/s while relaying (250s / the time until the
# last bench process ended), end-to-end msgs/s (250s / the time from the
# load's start to the last delivery recorded, as e2e.sh), the worst bench
# process's p99, the SMTP connections the sink admitted (how well the relay
# reuses its sessions: each new one is a TCP connect, EHLO, STARTTLS and a
# TLS handshake), the relay's and the sink's CPU ms per message, the relay's
# in_flow_delay waits, the queries Unbound answered (log-queries: whether
# the relay's lookups were cached), the share of the machine's CPU that went
# to processes outside the run (other users' builds: over 15 % the run is
# flagged), and the attempts by outcome and how they were secured; then
# medians per kind and B/A, C/A (per round, then the median). Figures
# only: no thresholds.
#
# Usage: benches/mx.sh [--quick] [--help]
#   --quick               MESSAGES=2000 ROUNDS=1 WARMUP=200 unless set: under a minute
#                         (the full run: about 2-3 minutes on 2 cores)
# Settings (environment):
#   MESSAGES=20000        messages per run
#   ROUNDS=3              interleaved rounds
#   RUNS="A B C"          which kinds, in this order each round
#   DOMAINS=50            recipient domains = concurrent bench processes
#   CONNS_PER_DOMAIN=1    connections of each bench process (DOMAINS x this in all)
#   SIZE=4096             message size in bytes
#   WARMUP=1000           messages of one unrecorded run of each kind first (0: none)
#   WORKERS=100 MAX_PER_DESTINATION=20 MAX_BACKLOG=20000 RELAY_POLL=100ms
#                         the relay's [relay] workers, max_per_destination,
#                         max_backlog, poll_interval, in every run (the defaults
#                         but poll_interval, which is e2e.sh's)
#   RELAY_EXTRA=          more [relay] lines for every run, e.g. 'pool_size = 100'
#   TTL=3600              the zone's TTLs and SOA minimum
#   BASE_PORT=25350       relay +1, sink +2 (= mx_port), sink metrics +3,
#                         relay metrics +4, Knot +5, Unbound +6
#   RELAY_TIMEOUT=600     seconds a run may take to be delivered
#   SMTP_ONCE_BIN=path    use this binary instead of `cargo build --release`
#                         (smtp-once-bench must be beside it)
#   WORKDIR=/tmp/smtp-once-mx   run folder (removed at exit)
#   KEEP=1                keep WORKDIR (configs, logs, every run's databases)
#   RESULTS=file          also write the per-run results (TSV) there
#
# stdout gets the tables only; progress and warnings go to stderr.
# Exit status: 0 ok; 1 error, a run that timed out, a count that does not
# match (250s, delivered, stored at the sink, replayed), or a B run with an
# attempt not secured by DANE-EE.
set -euo pipefail

# One { ... } block, read in full before it runs: editing this file during a
# run cannot derail that run.
{
BENCHES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(dirname "$BENCHES_DIR")

QUICK=0
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "mx.sh: unknown argument $arg (try --help)" >&2; exit 2 ;;
  esac
done
if [ "$QUICK" = 1 ]; then
  MESSAGES=${MESSAGES:-2000}
  ROUNDS=${ROUNDS:-1}
  WARMUP=${WARMUP:-200}
fi
MESSAGES=${MESSAGES:-20000}
ROUNDS=${ROUNDS:-3}
RUNS=${RUNS:-"A B C"}
DOMAINS=${DOMAINS:-50}
CONNS_PER_DOMAIN=${CONNS_PER_DOMAIN:-1}
SIZE=${SIZE:-4096}
WARMUP=${WARMUP:-1000}
WORKERS=${WORKERS:-100}
MAX_PER_DESTINATION=${MAX_PER_DESTINATION:-20}
MAX_BACKLOG=${MAX_BACKLOG:-20000}
RELAY_POLL=${RELAY_POLL:-100ms}
RELAY_EXTRA=${RELAY_EXTRA:-}
TTL=${TTL:-3600}
BASE_PORT=${BASE_PORT:-25350}
RELAY_TIMEOUT=${RELAY_TIMEOUT:-600}
WORKDIR=${WORKDIR:-/tmp/smtp-once-mx}
KEEP=${KEEP:-0}
RESULTS=${RESULTS:-}
START_TIMEOUT=60
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

log() { printf '[mx %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
warn() { printf '[mx %(%H:%M:%S)T] WARNING: %s\n' -1 "$*" >&2; }
die() { printf '[mx %(%H:%M:%S)T] ERROR: %s\n' -1 "$*" >&2; exit 1; }

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
for v in MESSAGES ROUNDS DOMAINS CONNS_PER_DOMAIN SIZE WARMUP WORKERS MAX_PER_DESTINATION MAX_BACKLOG TTL BASE_PORT RELAY_TIMEOUT; do
  is_uint "${!v}" || die "$v must be a whole number, got '${!v}'"
done
[ "$ROUNDS" -gt 0 ] || die "ROUNDS must be at least 1"
[ "$DOMAINS" -gt 0 ] && [ "$CONNS_PER_DOMAIN" -gt 0 ] || die "DOMAINS and CONNS_PER_DOMAIN must be at least 1"
[ "$MESSAGES" -ge "$DOMAINS" ] || die "MESSAGES ($MESSAGES) must be at least DOMAINS ($DOMAINS): one bench process per domain"
for k in $RUNS; do
  case "$k" in A|B|C) ;; *) die "RUNS: unknown kind '$k' (A, B or C)" ;; esac
done
[ "$(id -u)" -eq 0 ] || die "run as root (apt-get for missing tools; Knot runs as root:root, as in tests/common/dns_rig.rs)"
case "$WORKDIR" in /tmp/?*|/var/tmp/?*) ;; *) die "WORKDIR must be under /tmp or /var/tmp (it is removed at exit), got $WORKDIR" ;; esac

RELAY_PORT=$((BASE_PORT + 1))
SINK_PORT=$((BASE_PORT + 2))
SINK_METRICS=$((BASE_PORT + 3))
RELAY_METRICS=$((BASE_PORT + 4))
KNOT_PORT=$((BASE_PORT + 5))
UNBOUND_PORT=$((BASE_PORT + 6))
MX_IP=127.0.0.2
CERT=$REPO_DIR/certs/dev-cert.pem
KEY=$REPO_DIR/certs/dev-key.pem
declare -A KIND_NAME=([A]=smarthost [B]=mx-dane [C]=mx-may)

# ---------------------------------------------------------------------------
# Cleanup: every process this script starts is the leader of its own
# process group (setsid), recorded in $WORKDIR/pids; all are stopped at
# exit, and at start when a killed run left some behind.

stop_group() { # pgid name
  local pgid=$1 name=$2 cmd
  kill -0 -- "-$pgid" 2>/dev/null || return 0
  # After a crash the id may be someone else's by now: only groups whose
  # leader runs from, or on files in, our WORKDIR are ours.
  cmd=$(tr '\0' ' ' < "/proc/$pgid/cmdline" 2>/dev/null || true)
  if [[ $cmd != *"$WORKDIR"* ]]; then
    warn "process group $pgid ($name) is not one of ours any more (${cmd:-gone}): left alone"
    return 0
  fi
  kill -TERM -- "-$pgid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 -- "-$pgid" 2>/dev/null || return 0
    sleep 0.2
  done
  warn "$name (process group $pgid) ignored SIGTERM for 10 s: SIGKILL"
  kill -KILL -- "-$pgid" 2>/dev/null || true
}

stop_all() { # workdir
  local pgid name
  [ -f "$1/pids" ] || return 0
  # Newest first: the daemons before the DNS rig.
  tac "$1/pids" | while read -r pgid name; do
    [ -n "$pgid" ] && stop_group "$pgid" "$name"
  done
  : > "$1/pids"
}

CLEANED=0
LOAD_PIDS=()
WAIT_PID=""
cleanup() {
  local rc=$?
  [ "$CLEANED" -eq 1 ] && return
  CLEANED=1
  trap - INT TERM
  local p
  # The load and the waiter run under with_times' bash: it and its child.
  for p in "${LOAD_PIDS[@]+"${LOAD_PIDS[@]}"}" $WAIT_PID; do
    kill $(pgrep -P "$p" 2>/dev/null) "$p" 2>/dev/null || true
  done
  if [ -d "$WORKDIR" ]; then
    stop_all "$WORKDIR"
    if [ -n "$RESULTS" ] && [ -f "$WORKDIR/results.tsv" ]; then
      cp "$WORKDIR/results.tsv" "$RESULTS" || warn "cannot write RESULTS=$RESULTS"
    fi
    if [ "$KEEP" = 1 ]; then
      log "KEEP=1: configs, logs and databases left in $WORKDIR"
    else
      log "removing $WORKDIR"
      rm -rf "$WORKDIR"
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ -d "$WORKDIR" ]; then
  log "stopping what a previous run left in $WORKDIR"
  stop_all "$WORKDIR"
  rm -rf "$WORKDIR"
fi
mkdir -p "$WORKDIR/bin" "$WORKDIR/runs"
: > "$WORKDIR/pids"

start_bg() { # name logfile cmd... ; sets BG_PID (the process and its group)
  local name=$1 logfile=$2
  shift 2
  setsid "$@" > "$logfile" 2>&1 < /dev/null &
  BG_PID=$!
  echo "$BG_PID $name" >> "$WORKDIR/pids"
}

# Stops one process group started by start_bg and drops it from the list.
stop_bg() { # pid name
  stop_group "$1" "$2"
  local rest
  rest=$(awk -v p="$1" '$1 != p' "$WORKDIR/pids")
  printf '%s\n' "$rest" | sed '/^$/d' > "$WORKDIR/pids"
}

port_free() { ! (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

wait_tcp() { # name ip port pid logfile
  local name=$1 ip=$2 port=$3 pid=$4 logfile=$5 deadline=$((SECONDS + START_TIMEOUT))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if ! kill -0 "$pid" 2>/dev/null; then
      warn "$name exited during start-up; last lines of $logfile:"
      tail -n 20 "$logfile" >&2 || true
      return 1
    fi
    (exec 3<>"/dev/tcp/$ip/$port") 2>/dev/null && return 0
    sleep 0.1
  done
  warn "$name did not listen on $ip:$port within ${START_TIMEOUT}s; last lines of $logfile:"
  tail -n 20 "$logfile" >&2 || true
  return 1
}

wait_smtp() { # name ip port pid logfile
  local name=$1 ip=$2 port=$3 pid=$4 logfile=$5 deadline=$((SECONDS + START_TIMEOUT)) banner
  while [ "$SECONDS" -lt "$deadline" ]; do
    if ! kill -0 "$pid" 2>/dev/null; then
      warn "$name exited during start-up; last lines of $logfile:"
      tail -n 20 "$logfile" >&2 || true
      return 1
    fi
    banner=$(timeout 5 bash -c "exec 3<>/dev/tcp/$ip/$port && IFS= read -r l <&3 && printf 'QUIT\r\n' >&3 && printf '%s' \"\$l\"" 2>/dev/null || true)
    [[ $banner == 220* ]] && return 0
    sleep 0.1
  done
  warn "$name did not answer 220 on $ip:$port within ${START_TIMEOUT}s; last lines of $logfile:"
  tail -n 20 "$logfile" >&2 || true
  return 1
}

# ---------------------------------------------------------------------------
# Tools

APT_UPDATED=0
need_cmd() { # command package
  command -v "$1" >/dev/null 2>&1 && return 0
  [ -x "/usr/sbin/$1" ] && return 0
  if [ "$APT_UPDATED" = 0 ]; then
    log "apt-get update"
    apt-get update -qq >&2 || die "apt-get update failed (need $2)"
    APT_UPDATED=1
  fi
  log "apt-get install $2"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >&2 || die "cannot install $2 (for $1)"
}
export PATH=$PATH:/usr/sbin:/sbin
need_cmd knotd knot
need_cmd keymgr knot
need_cmd kdig knot-dnsutils
need_cmd unbound unbound
need_cmd openssl openssl
need_cmd python3 python3
need_cmd curl curl
[ -r "$CERT" ] && [ -r "$KEY" ] || die "the dev certificate ($CERT, $KEY) is missing"

if [ -n "${SMTP_ONCE_BIN:-}" ]; then
  [ -x "$SMTP_ONCE_BIN" ] || die "SMTP_ONCE_BIN=$SMTP_ONCE_BIN is not an executable"
  SRC_BIN=$SMTP_ONCE_BIN
else
  command -v cargo >/dev/null 2>&1 || die "cargo not found: install Rust or set SMTP_ONCE_BIN"
  log "cargo build --release (set SMTP_ONCE_BIN to skip)"
  (cd "$REPO_DIR" && cargo build --release --quiet >&2) || die "cargo build --release failed"
  SRC_BIN=$REPO_DIR/target/release/smtp-once
fi
# A private copy, and the bench binary beside it: a rebuild during the run
# must not change what runs (and every kind runs the same build).
cp "$SRC_BIN" "$WORKDIR/bin/smtp-once"
SRC_BENCH=$(dirname "$SRC_BIN")/smtp-once-bench
[ ! -x "$SRC_BENCH" ] || cp "$SRC_BENCH" "$WORKDIR/bin/smtp-once-bench"
BIN=$WORKDIR/bin/smtp-once
"$BIN" bench --help >/dev/null 2>&1 || die "$SRC_BIN has no 'bench' subcommand, nor an smtp-once-bench beside it"

for ipport in "127.0.0.1 $RELAY_PORT" "127.0.0.1 $SINK_PORT" "$MX_IP $SINK_PORT" "127.0.0.1 $SINK_METRICS" \
              "127.0.0.1 $RELAY_METRICS" "127.0.0.1 $KNOT_PORT" "127.0.0.1 $UNBOUND_PORT"; do
  # shellcheck disable=SC2086
  port_free $ipport || die "${ipport/ /:} is already in use: set BASE_PORT"
done

# ---------------------------------------------------------------------------
# The DNS rig: Knot (signing) and Unbound (validating), as tests/common/dns_rig.rs.

DNS=$WORKDIR/dns
mkdir -p "$DNS/kdb"
TLSA_HASH=$(openssl x509 -in "$CERT" -pubkey -noout | openssl pkey -pubin -outform DER | sha256sum | cut -d' ' -f1)
[[ $TLSA_HASH =~ ^[0-9a-f]{64}$ ]] || die "cannot compute the SPKI SHA-256 of $CERT"
{
  printf '$ORIGIN bench.test.\n$TTL %s\n' "$TTL"
  printf '@ SOA ns.bench.test. admin.bench.test. 1 3600 600 86400 %s\n' "$TTL"
  printf '@ NS ns.bench.test.\nns A 127.0.0.1\n'
  printf 'mx A %s\n' "$MX_IP"
  printf '_%s._tcp.mx TLSA 3 1 1 %s\n' "$SINK_PORT" "$TLSA_HASH"
  for i in $(seq 0 $((DOMAINS - 1))); do printf 'd%s MX 10 mx.bench.test.\n' "$i"; done
} > "$DNS/bench.test.zone"
cat > "$DNS/knot.conf" <<EOF
# Written by benches/mx.sh
server:
    listen: 127.0.0.1@$KNOT_PORT
    rundir: $DNS
    user: root:root
database:
    storage: $DNS/kdb
log:
  - target: stderr
    any: info
policy:
  - id: bench
    algorithm: ecdsap256sha256
    single-type-signing: on
template:
  - id: default
    storage: $DNS
    file: "%s.zone"
    zonefile-sync: -1
    journal-content: none
zone:
  - domain: bench.test
    dnssec-signing: on
    dnssec-policy: bench
EOF
start_bg knotd "$DNS/knot.log" knotd -c "$DNS/knot.conf"
KNOT_PID=$BG_PID
wait_tcp knotd 127.0.0.1 "$KNOT_PORT" "$BG_PID" "$DNS/knot.log" || die "knotd did not start"
DS=""
for _ in $(seq 1 200); do
  DS=$(keymgr -c "$DNS/knot.conf" bench.test ds 2>/dev/null | grep ' DS ' | head -n 1 || true)
  [ -n "$DS" ] && break
  sleep 0.1
done
[ -n "$DS" ] || die "Knot made no key for bench.test (log: $DNS/knot.log)"
cat > "$DNS/unbound.conf" <<EOF
# Written by benches/mx.sh
server:
    interface: 127.0.0.1@$UNBOUND_PORT
    port: $UNBOUND_PORT
    do-not-query-localhost: no
    username: ""
    chroot: ""
    directory: "$DNS"
    pidfile: "$DNS/unbound.pid"
    use-syslog: no
    logfile: ""
    verbosity: 1
    do-ip6: no
    module-config: "validator iterator"
    val-log-level: 2
    log-queries: yes
    local-zone: "test." nodefault
    aggressive-nsec: no
    trust-anchor: "$DS"
stub-zone:
    name: "bench.test"
    stub-addr: 127.0.0.1@$KNOT_PORT
EOF
start_bg unbound "$DNS/unbound.log" unbound -d -c "$DNS/unbound.conf"
UNBOUND_PID=$BG_PID
wait_tcp unbound 127.0.0.1 "$UNBOUND_PORT" "$BG_PID" "$DNS/unbound.log" || die "unbound did not start"

# Every answer the relay will ask for, through Unbound: validated (AD) and as
# expected; this also fills Unbound's cache, which stays warm for every run.
dig_ad() { # name type -> prints the answer's records; fails without AD or on an error
  local out
  out=$(kdig @127.0.0.1 -p "$UNBOUND_PORT" +dnssec +timeout=2 +retry=2 "$1" "$2" 2>&1) || return 1
  grep -q '^;; Flags: .* ad' <<< "$out" || { echo "$out" >&2; return 1; }
  grep -q 'status: \(NOERROR\|NXDOMAIN\)' <<< "$out" || { echo "$out" >&2; return 1; }
  awk -v t="$2" '$4 == t {print}' <<< "$out"
}
for _ in $(seq 1 50); do dig_ad d0.bench.test MX > /dev/null 2>&1 && break; sleep 0.2; done
dig_ad d0.bench.test MX | grep -q 'MX.*10 mx\.bench\.test\.' || die "d0.bench.test MX is not validated (see $DNS/unbound.log)"
dig_ad mx.bench.test A | grep -q "$MX_IP" || die "mx.bench.test A is not validated"
dig_ad "_$SINK_PORT._tcp.mx.bench.test" TLSA | grep -qi "3 1 1 $TLSA_HASH" || die "the TLSA record is not validated"
dig_ad mx.bench.test AAAA > /dev/null || die "mx.bench.test AAAA (no data) is not validated"
for i in $(seq 0 $((DOMAINS - 1))); do
  dig_ad "d$i.bench.test" MX > /dev/null || die "d$i.bench.test MX is not validated"
  dig_ad "_mta-sts.d$i.bench.test" TXT > /dev/null || die "_mta-sts.d$i.bench.test TXT (no such name) is not validated"
done
log "DNS rig: Knot on 127.0.0.1:$KNOT_PORT, Unbound on 127.0.0.1:$UNBOUND_PORT, $DOMAINS domains validated (AD), TLSA 3 1 1 ${TLSA_HASH:0:16}..."

# ---------------------------------------------------------------------------
# One run: a fresh sink and a fresh relay, the load, the wait, the counts.

RESULTS_TSV=$WORKDIR/results.tsv
printf 'kind\tround\tmessages\tacked\tother_replies\terrors\taccept_s\taccept_mps\tp99_ms\te2e_s\te2e_mps\trelayed\tsink_rows\tsink_replayed\tsink_conns\trelay_cpu_ms\tsink_cpu_ms\tinflow_wait_s\tdns_queries\tother_cpu_pct\tsecured\n' > "$RESULTS_TSV"
FAILED_RUNS=()
BUSY_RUNS=()
CLK_TCK=$(getconf CLK_TCK)

write_sink_toml() { # dir
  local d=$1
  mkdir -p "$d/data" "$d/outbox"
  cat > "$d/smtp-once.toml" <<EOF
# Written by benches/mx.sh: the next hop, which only stores.
[server]
hostname = "sink.bench.test"
data_dir = "$d/data"
max_connections = 1000
shutdown_grace = "5s"

[[listener]]
addr = "$MX_IP:$SINK_PORT"
tls = "starttls"

[[listener]]
addr = "127.0.0.1:$SINK_PORT"
tls = "starttls"

[tls]
cert = "$CERT"
key = "$KEY"

[[trusted_network]]
cidr = "127.0.0.0/8"
workspace = "sink"

[metrics]
addr = "127.0.0.1:$SINK_METRICS"

[relay]
mode = "file"
dir = "$d/outbox"
paused = true
EOF
}

relay_lines() { # kind
  case "$1" in
    A) printf 'mode = "smarthost"\nsmarthost = "127.0.0.1:%s"\ntls = "starttls"\nca_file = "%s"\n' "$SINK_PORT" "$CERT" ;;
    B) printf 'mode = "mx"\nmx_port = %s\ndns_servers = ["127.0.0.1:%s"]\ntls_default = "dane"\nmta_sts = true\n' "$SINK_PORT" "$UNBOUND_PORT" ;;
    C) printf 'mode = "mx"\nmx_port = %s\ndns_servers = ["127.0.0.1:%s"]\ntls_default = "may"\nmta_sts = false\n' "$SINK_PORT" "$UNBOUND_PORT" ;;
  esac
}

write_relay_toml() { # dir kind
  local d=$1 kind=$2
  mkdir -p "$d/data"
  cat > "$d/smtp-once.toml" <<EOF
# Written by benches/mx.sh: the relay under test, run ${KIND_NAME[$kind]}.
[server]
hostname = "relay.bench.test"
data_dir = "$d/data"
max_connections = 1000
shutdown_grace = "5s"

[[listener]]
addr = "127.0.0.1:$RELAY_PORT"
tls = "none"

[[trusted_network]]
cidr = "127.0.0.0/8"
workspace = "bench"

[metrics]
addr = "127.0.0.1:$RELAY_METRICS"

[relay]
$(relay_lines "$kind")
workers = $WORKERS
max_per_destination = $MAX_PER_DESTINATION
max_backlog = $MAX_BACKLOG
poll_interval = "$RELAY_POLL"
$RELAY_EXTRA
EOF
}

# Queries Unbound has answered so far (log-queries: one line each; the
# relay is its only client during a run).
dns_queries() {
  grep -c ' info: 127\.0\.0\.1 ' "$DNS/unbound.log" 2>/dev/null || true
}

# The machine's busy time (user, nice, system, irq, softirq, steal), in ticks.
machine_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9; exit}' /proc/stat; }

# Runs a command and writes its CPU time (its children's, from `times`: user
# and system) in ticks to FILE; the exit status is the command's.
with_times() { # file cmd...
  local f=$1
  shift
  # `times` in this shell, not in a pipeline's subshell (whose children
  # are none).
  CLK_TCK=$CLK_TCK bash -c '"${@:2}"; rc=$?; times > "$1.raw"; awk -v t="$CLK_TCK" '\''NR == 2 {
      split($1, u, /[ms]/); split($2, s, /[ms]/); print int((u[1] * 60 + u[2] + s[1] * 60 + s[2]) * t + 0.5) }'\'' "$1.raw" > "$1"; exit $rc' _ "$f" "$@"
}

cpu_ticks() { # pid -> utime + stime
  awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0
}

metric() { # port name-with-labels -> value (0 if absent)
  curl -s --max-time 5 "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m {print $2; found=1} END {if (!found) print 0}'
}

run_one() { # kind round count
  local kind=$1 round=$2 count=$3 name=${KIND_NAME[$1]}
  local d=$WORKDIR/runs/$kind-$round sink_pid relay_pid i n rc=0 t0 t_load wait_out line
  local expect_file=$d/expect
  mkdir -p "$d/load"
  write_sink_toml "$d/sink"
  write_relay_toml "$d/relay" "$kind"
  "$BIN" check-config --config "$d/sink/smtp-once.toml" > /dev/null || die "the sink's config is refused ($d/sink/smtp-once.toml)"
  "$BIN" check-config --config "$d/relay/smtp-once.toml" > /dev/null || die "the relay's config is refused ($d/relay/smtp-once.toml)"
  start_bg sink "$d/sink/server.log" "$BIN" serve --config "$d/sink/smtp-once.toml"
  sink_pid=$BG_PID
  wait_smtp sink "$MX_IP" "$SINK_PORT" "$sink_pid" "$d/sink/server.log" || die "the sink did not start"
  wait_smtp sink 127.0.0.1 "$SINK_PORT" "$sink_pid" "$d/sink/server.log" || die "the sink did not start"
  start_bg relay "$d/relay/server.log" "$BIN" serve --config "$d/relay/smtp-once.toml"
  relay_pid=$BG_PID
  wait_smtp relay 127.0.0.1 "$RELAY_PORT" "$relay_pid" "$d/relay/server.log" || die "the relay did not start"
  local sink_cpu0 relay_cpu0 sink_conns0 dns0 rig_cpu0 j0 j1 t1
  dns0=$(dns_queries)
  sink_cpu0=$(cpu_ticks "$sink_pid")
  relay_cpu0=$(cpu_ticks "$relay_pid")
  sink_conns0=$(metric "$SINK_METRICS" smtp_once_smtp_connections_total)

  wait_out=$d/wait.json
  rig_cpu0=$(( $(cpu_ticks "$KNOT_PID") + $(cpu_ticks "$UNBOUND_PID") ))
  j0=$(machine_ticks)
  t0=$EPOCHREALTIME
  with_times "$d/wait.times" python3 "$BENCHES_DIR/mx_wait.py" --relay-db "$d/relay/data/smtp-once.db" --sink-db "$d/sink/data/smtp-once.db" \
    --expect "$count" --expect-file "$expect_file" --timeout "$RELAY_TIMEOUT" > "$wait_out" &
  WAIT_PID=$!
  LOAD_PIDS=()
  for i in $(seq 0 $((DOMAINS - 1))); do
    # count split evenly; the first (count % DOMAINS) processes one more.
    n=$(( count / DOMAINS + (i < count % DOMAINS ? 1 : 0) ))
    [ "$n" -gt 0 ] || continue
    with_times "$d/load/$i.times" "$BIN" bench --server "127.0.0.1:$RELAY_PORT" -c "$CONNS_PER_DOMAIN" -n "$n" --size "$SIZE" \
      --to "u$i@d$i.bench.test" --json --quiet > "$d/load/$i.json" 2> "$d/load/$i.err" &
    LOAD_PIDS+=($!)
  done
  for i in "${LOAD_PIDS[@]}"; do wait "$i" || rc=$?; done
  t_load=$EPOCHREALTIME
  LOAD_PIDS=()
  local load
  load=$(python3 - "$d/load" <<'EOF'
import glob, json, sys
acked = msgs = errors = 0
p99 = 0.0
other = {}
for f in glob.glob(sys.argv[1] + "/*.json"):
    try:
        r = json.load(open(f))
    except ValueError:
        continue
    msgs += int(r["messages"])
    errors += int(r.get("errors", 0))
    p99 = max(p99, float(r["latency_ms"]["p99"]))
    for k, v in r.get("replies", {}).items():
        if k == "250":
            acked += int(v)
        else:
            other[k] = other.get(k, 0) + int(v)
print(msgs, acked, errors, f"{p99:.3f}", ",".join(f"{k}={v}" for k, v in sorted(other.items())) or "-")
EOF
)
  local msgs acked errors p99 other
  read -r msgs acked errors p99 other <<< "$load"
  echo "$acked" > "$expect_file.tmp"
  mv "$expect_file.tmp" "$expect_file"
  wait "$WAIT_PID" || true
  j1=$(machine_ticks)
  t1=$EPOCHREALTIME
  WAIT_PID=""
  [ "$rc" -eq 0 ] || { warn "$name round $round: a bench process failed (exit $rc); see $d/load/*.err"; tail -n 3 "$d"/load/*.err >&2 || true; }

  local sink_cpu relay_cpu sink_conns replayed inflow secured dns
  dns=$(( $(dns_queries) - dns0 ))
  sink_cpu=$(( $(cpu_ticks "$sink_pid") - sink_cpu0 ))
  relay_cpu=$(( $(cpu_ticks "$relay_pid") - relay_cpu0 ))
  sink_conns=$(( $(metric "$SINK_METRICS" smtp_once_smtp_connections_total) - sink_conns0 ))
  replayed=$(metric "$SINK_METRICS" 'smtp_once_submissions_total{channel="smtp",outcome="replayed"}')
  inflow=$(metric "$RELAY_METRICS" smtp_once_inflow_wait_seconds_total)
  # Everything else the machine did meanwhile (other users' builds, say):
  # its busy time minus ours (relay, sink, bench processes, the waiter, the
  # DNS rig), as a share of both cores over the run. A few % is the kernel's
  # own work (writeback, softirqs); much more means the run shared the
  # machine and its figures are not comparable.
  local ours foreign
  ours=$(( sink_cpu + relay_cpu + $(cpu_ticks "$KNOT_PID") + $(cpu_ticks "$UNBOUND_PID") - rig_cpu0 ))
  ours=$(( ours + $(cat "$d"/load/*.times "$d/wait.times" 2>/dev/null | awk '{s += $1} END {print s + 0}') ))
  foreign=$(python3 -c 'import sys; busy, ours, t0, t1, tck, n = map(float, sys.argv[1:]); print(f"{max(busy - ours, 0) * 100 / tck / (t1 - t0) / n:.0f}")' \
    "$((j1 - j0))" "$ours" "$t0" "$t1" "$CLK_TCK" "$(nproc)")
  # Every attempt, by outcome and how its session was secured (next_hop
  # after the address: "TLSv1_3 <cipher> auth=dane-ee", or "plaintext").
  secured=$(python3 - "$d/relay/data/smtp-once.db" <<'EOF'
import collections, sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True, timeout=30)
c = collections.Counter()
for outcome, hop in db.execute("SELECT outcome, COALESCE(next_hop, '') FROM delivery_attempt"):
    how = hop.rsplit("] ", 1)[-1] if "] " in hop else (hop or "-")
    parts = how.split()
    # The version and auth= matter; the cipher suite goes.
    how = " ".join(p for p in parts if not p.startswith("TLS13_") and not p.startswith("TLS_ECDHE"))
    c[f"{outcome} {how}"] += 1
print("; ".join(f"{k}: {v}" for k, v in c.most_common()) or "none")
EOF
)
  stop_bg "$relay_pid" relay
  stop_bg "$sink_pid" sink

  line=$(python3 - "$kind" "$round" "$msgs" "$acked" "$other" "$errors" "$t0" "$t_load" "$p99" "$(cat "$wait_out" 2>/dev/null || echo '{}')" \
      "$replayed" "$sink_conns" "$relay_cpu" "$sink_cpu" "$CLK_TCK" "$inflow" "$dns" "$foreign" "$secured" <<'EOF'
import json, sys
(kind, rnd, msgs, acked, other, errors, t0, t_load, p99, waited, replayed, conns,
 relay_cpu, sink_cpu, tck, inflow, dns, other_cpu, secured) = sys.argv[1:]
w = json.loads(waited) if waited.strip() else {}
acked_n = int(acked)
acc_s = float(t_load) - float(t0)
n = max(acked_n, 1)
if w.get("done"):
    e2e_s = w["t_done"] - float(t0)
    e2e, e2e_mps = f"{e2e_s:.3f}", f"{acked_n / e2e_s:.1f}"
else:
    e2e, e2e_mps = "timeout", "0"
cpu = lambda ticks: f"{int(ticks) * 1000.0 / int(tck) / n:.3f}"
print("\t".join([kind, rnd, msgs, acked, other, errors, f"{acc_s:.3f}", f"{acked_n / acc_s:.1f}", p99,
                 e2e, e2e_mps, str(w.get("relayed", 0)), str(w.get("sink", 0)), str(int(float(replayed))),
                 conns, cpu(relay_cpu), cpu(sink_cpu), f"{float(inflow):.3f}", dns, other_cpu, secured]))
EOF
)
  local accept_mps e2e_s e2e_mps relayed sink_rows sink_replayed relay_ms sink_ms inflow_s
  IFS=$'\t' read -r _ _ _ _ _ _ _ accept_mps _ e2e_s e2e_mps relayed sink_rows sink_replayed _ relay_ms sink_ms inflow_s _ other_cpu _ <<< "$line"
  log "$(printf '%-9s round %-6s accept %8s msgs/s  end to end %8s msgs/s (%s s)  250=%s relayed=%s sink=%s replayed=%s sink-conns=%s dns-queries=%s cpu ms/msg relay %s sink %s, other cpu %s%%' \
    "$name" "$round" "$accept_mps" "$e2e_mps" "$e2e_s" "$acked" "$relayed" "$sink_rows" "$sink_replayed" "$sink_conns" "$dns" "$relay_ms" "$sink_ms" "$other_cpu")"
  log "$(printf '%-9s round %-6s attempts: %s' "$name" "$round" "$secured")"
  [ "$round" = warmup ] || echo "$line" >> "$RESULTS_TSV"
  if [ "$e2e_s" = timeout ]; then
    warn "$name round $round: not delivered within ${RELAY_TIMEOUT}s (relayed $relayed of $acked; see $d, KEEP=1 keeps it)"
    FAILED_RUNS+=("$name round $round: timeout (relayed $relayed of $acked)")
  elif [ "$relayed" -ne "$acked" ] || [ "$sink_rows" -ne "$acked" ] || [ "$sink_replayed" -ne 0 ]; then
    warn "!!! MISMATCH: $name round $round: 250 x $acked, relayed $relayed, the sink stored $sink_rows and replayed $sink_replayed !!!"
    FAILED_RUNS+=("$name round $round: 250 x $acked, relayed $relayed, sink $sink_rows, replayed $sink_replayed")
  fi
  if [ "$acked" -ne "$count" ] || [ "$other" != - ] || [ "$errors" != 0 ]; then
    warn "$name round $round: $acked of $count acknowledged; other replies: $other; connection errors: $errors"
    FAILED_RUNS+=("$name round $round: $acked of $count acknowledged ($other, errors $errors)")
  fi
  if [ "$other_cpu" -gt 15 ] && [ "$round" != warmup ]; then
    warn "$name round $round: the machine spent ${other_cpu}% of its CPU on processes not in this run: its figures are not comparable"
    BUSY_RUNS+=("$name round $round: ${other_cpu}%")
  fi
  if [ "$kind" = B ]; then
    local nondane
    nondane=$(tr ';' '\n' <<< "$secured" | grep -v 'auth=dane-ee' | sed '/^ *$/d' || true)
    if [ -n "$nondane" ]; then
      warn "$name round $round: attempts not secured by DANE-EE: $(echo $nondane)"
      FAILED_RUNS+=("$name round $round: attempts not secured by DANE-EE: $(echo $nondane)")
    fi
  fi
  [ "$KEEP" = 1 ] || rm -rf "$d"
}

VERSIONS=(
  "smtp-once $("$BIN" --version 2>/dev/null | awk '{print $NF}') ($SRC_BIN), relay and sink on SQLite"
  "$(knotd --version 2>&1 | head -n 1), zone bench.test signed ECDSA P-256; $(unbound -V 2>&1 | head -n 1 | sed 's/Version/Unbound/'), validating; TTL $TTL s"
  "relay [relay]: workers = $WORKERS, max_per_destination = $MAX_PER_DESTINATION, max_backlog = $MAX_BACKLOG, poll_interval = $RELAY_POLL${RELAY_EXTRA:+, $(echo $RELAY_EXTRA)} (every kind)"
  "load: $DOMAINS smtp-once bench processes at once, one per domain, $CONNS_PER_DOMAIN connection(s) each, $MESSAGES x $SIZE-byte messages per run in all, UUID v4 keys"
)

if [ "$WARMUP" -gt 0 ]; then
  [ "$WARMUP" -ge "$DOMAINS" ] || WARMUP=$DOMAINS
  log "warm-up: one run of each kind with $WARMUP messages (not recorded)"
  for k in $RUNS; do run_one "$k" warmup "$WARMUP"; done
fi
log "measuring: kinds [$RUNS], $ROUNDS round(s), $MESSAGES messages per run"
T0=$SECONDS
for round in $(seq 1 "$ROUNDS"); do
  for k in $RUNS; do run_one "$k" "$round" "$MESSAGES"; done
done
log "measured in $((SECONDS - T0)) s"

cpu_model=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)
export MACHINE="$(nproc) CPUs (${cpu_model:-$(uname -m)}), $(awk '/^MemTotal/ {printf "%.0f GiB RAM", $2/1048576}' /proc/meminfo), Linux $(uname -r), load average at the start: $LOAD_BEFORE, at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
export VERSIONS_TEXT=$(printf '%s\n' "${VERSIONS[@]}")
export BUSY_TEXT=$(printf '%s\n' "${BUSY_RUNS[@]+"${BUSY_RUNS[@]}"}")
export FAILED_TEXT=$(printf '%s\n' "${FAILED_RUNS[@]+"${FAILED_RUNS[@]}"}")
python3 "$BENCHES_DIR/mx_report.py" "$RESULTS_TSV"

[ "${#FAILED_RUNS[@]}" -eq 0 ] || exit 1
exit 0
}
