#!/usr/bin/env bash
# benches/http.sh: HTTP submissions against SMTP submissions on the same
# daemon, interleaved (issue 12's targets). One smtp-once with [http] and a
# paused relay (it only queues); per round: `smtp-once bench` over SMTP,
# then wrk posting raw 4 KiB messages, each with its own Idempotency-Key,
# over keep-alive connections; during the HTTP run /metrics is scraped and
# timed. Prints msgs/s, p99 and the HTTP/SMTP ratio per round, then the
# latency a plain keep-alive client sees (benches/http_latency.py), and
# checks that the queue holds exactly what was acknowledged.
#
#   benches/http.sh            # 3 rounds of 15 s at 32 connections
#   ROUNDS=1 SECONDS_PER_RUN=5 benches/http.sh   # quick
set -euo pipefail
ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-15}
CONNS=${CONNS:-32}
SIZE=${SIZE:-4096}
SCRAPE=${SCRAPE:-1}   # 0: no /metrics scrapes during the HTTP runs
WORKDIR=${WORKDIR:-/tmp/smtp-once-http-bench}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v wrk >/dev/null || { apt-get install -y wrk >/dev/null || { echo "wrk is needed (apt-get install wrk)" >&2; exit 1; }; }
BIN=${SMTP_ONCE_BIN:-target/release/smtp-once}
# The load generator: the server's own by default; front_door.sh drives two
# builds with one bench, so both get the same keys.
BENCH_BIN=${BENCH_BIN:-$BIN}
[ -n "${SMTP_ONCE_BIN:-}" ] || cargo build --release --quiet
rm -rf "$WORKDIR" && mkdir -p "$WORKDIR"
trap 'kill $PID 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORKDIR"' EXIT
read -r TOKEN HASH < <("$BIN" new-api-key | awk '/^  so_/{t=$1} /api_key_hash/{gsub(/"/,"",$3); h=$3} END{print t, h}')
PASSWORD_HASH=$(echo -n bench-password | "$BIN" hash-password)
cat > "$WORKDIR/smtp-once.toml" <<TOML
[server]
hostname = "bench.test"
data_dir = "$WORKDIR/data"
max_connections = 1000
[[listener]]
addr = "127.0.0.1:25301"
tls = "none"
[[trusted_network]]
cidr = "127.0.0.0/8"
workspace = "bench"
[[user]]
name = "bench"
password_hash = "$PASSWORD_HASH"
workspace = "bench"
api_key_hash = "$HASH"
[http]
addr = "127.0.0.1:25302"
[metrics]
addr = "127.0.0.1:25303"
[relay]
mode = "file"
dir = "$WORKDIR/outbox"
paused = true
TOML
"$BIN" serve --config "$WORKDIR/smtp-once.toml" > "$WORKDIR/stdout" 2> "$WORKDIR/server.log" &
PID=$!
for _ in $(seq 100); do grep -q "http on" "$WORKDIR/stdout" 2>/dev/null && break; sleep 0.1; done
queued() { python3 -c 'import sqlite3,sys; print(sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True).execute("SELECT COUNT(*) FROM queue").fetchone()[0])' "$WORKDIR/data/smtp-once.db"; }
acked=0
printf '%-6s %-5s %10s %9s %14s\n' round what msgs/s "p99 ms" "/metrics ms"
for round in $(seq "$ROUNDS"); do
  smtp=$("$BENCH_BIN" bench --server 127.0.0.1:25301 -c "$CONNS" --duration "$SECONDS_PER_RUN" --size "$SIZE" --json --quiet)
  read -r s_rate s_p99 s_ok < <(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(round(r["msgs_per_sec"]), r["latency_ms"]["p99"], r["replies"].get("250",0))' "$smtp")
  acked=$((acked + s_ok))
  # Scrape /metrics every 0.5 s while wrk runs.
  ( [ "$SCRAPE" = 1 ] || { echo 0; exit 0; }; for _ in $(seq $((SECONDS_PER_RUN * 2))); do curl -s -o /dev/null -w '%{time_total}\n' http://127.0.0.1:25303/metrics; sleep 0.5; done ) > "$WORKDIR/scrapes" &
  SCRAPER=$!
  out=$(TOKEN=$TOKEN PREFIX="r$round" SIZE=$SIZE wrk -t2 -c"$CONNS" -d"${SECONDS_PER_RUN}s" -s benches/http_submit.lua http://127.0.0.1:25302 | grep '^JSON ' | cut -c6-)
  echo "round $round wrk: $out" >&2
  wait $SCRAPER || true
  read -r h_rate h_p99 h_ok h_err < <(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(round(r["requests"]/r["seconds"]), r["p99_ms"], r["requests"], r["errors"])' "$out")
  acked=$((acked + h_ok - h_err))
  scrape=$(sort -n "$WORKDIR/scrapes" | awk '{a[NR]=$1} END{printf "%.2f (max %.2f)", a[int(NR/2)+1]*1000, a[NR]*1000}')
  printf '%-6s %-5s %10s %9s %14s\n' "$round" smtp "$s_rate" "$s_p99" -
  printf '%-6s %-5s %10s %9s %14s   http/smtp %.2fx, non-2xx %s\n' "$round" http "$h_rate" "$h_p99" "$scrape" "$(python3 -c "print($h_rate/$s_rate)")" "$h_err"
done
# The same endpoint through a plain keep-alive client, for its latency.
python3 benches/http_latency.py http://127.0.0.1:25302 "$TOKEN" 8 400
acked=$((acked + 8 * 400))
stored=$(queued)
# wrk stops at its deadline with up to one request per connection sent but
# not yet answered: the server may have queued those.
slack=$((CONNS * ROUNDS))
if [ "$stored" -ge "$acked" ] && [ "$((stored - acked))" -le "$slack" ]; then verdict=ok; else verdict=MISMATCH; fi
echo "acknowledged $acked (SMTP 250 + HTTP 2xx), queued $stored (at most $slack more: in flight when wrk stopped): $verdict"
