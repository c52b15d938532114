#!/usr/bin/env bash
# benches/webhooks.sh: the end-to-end relay with and without one webhook
# endpoint (issue 13's targets), in alternating rounds.
#
# Each round runs compare.sh's `smtp-once-relay` peer (smtp-once relaying in
# smarthost mode to its own smtp-sink, 32 connections, MESSAGES messages of
# 4 KiB) once plain and once with a [[webhook]] that receives every event
# (message.accepted and message.delivered: two per message) at
# examples/webhook_sink.rs, a local endpoint (one thread, hyper) that
# answers 204 at once and measures each event's delay from its state change
# (the payload's timestamp) to its arrival. (A Python sink took a third of
# the sender's CPU again on these 2 cores, and so measured itself.) Prints end-to-end msgs/s of both, their ratio,
# and the event delay percentiles.
#
#   benches/webhooks.sh            # 3 rounds x 20,000 messages
#   ROUNDS=1 MESSAGES=5000 benches/webhooks.sh
#   SMTP_ONCE_BIN=target/release/smtp-once benches/webhooks.sh   # no build
set -euo pipefail
BENCHES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(dirname "$BENCHES_DIR")
ROUNDS=${ROUNDS:-3}
export MESSAGES=${MESSAGES:-20000}
WORK=${WORK:-/tmp/smtp-once-webhooks-bench}
rm -rf "$WORK" && mkdir -p "$WORK"

if [ -z "${SMTP_ONCE_BIN:-}" ]; then
  (cd "$REPO_DIR" && cargo build --release --quiet)
  export SMTP_ONCE_BIN=$REPO_DIR/target/release/smtp-once
fi
SINK_BIN=${SINK_BIN:-$REPO_DIR/target/release/examples/webhook_sink}
if [ ! -x "$SINK_BIN" ]; then
  (cd "$REPO_DIR" && cargo build --release --quiet --example webhook_sink)
fi

SINK_PID=
cleanup() { [ -n "$SINK_PID" ] && kill "$SINK_PID" 2>/dev/null || true; }
trap cleanup EXIT

start_sink() { # round
  "$SINK_BIN" --port 0 --stats "$WORK/sink-$1.json" > "$WORK/sink-$1.out" 2>&1 &
  SINK_PID=$!
  for _ in $(seq 100); do
    grep -q "listening on" "$WORK/sink-$1.out" 2>/dev/null && break
    sleep 0.1
  done
  SINK_ADDR=$(sed -n 's/^listening on //p' "$WORK/sink-$1.out")
  [ -n "$SINK_ADDR" ] || { echo "webhook sink did not start" >&2; exit 1; }
}

stop_sink() { # round
  kill -TERM "$SINK_PID"; wait "$SINK_PID" || true; SINK_PID=
}

run_relay() { # label round [extra toml]
  local results=$WORK/$1-$2.tsv
  PEERS=smtp-once-relay CONNS=32 ROUNDS=1 WARMUP=0 RESULTS=$results \
    SMTP_ONCE_RELAY_EXTRA=${3:-} WORKDIR=$WORK/compare-$1-$2 \
    "$BENCHES_DIR/compare.sh" >/dev/null 2>"$WORK/$1-$2.log" || {
      echo "compare.sh failed ($1 round $2); log: $WORK/$1-$2.log" >&2; tail -5 "$WORK/$1-$2.log" >&2; exit 1; }
  # e2e_msgs_per_sec is column 18 of the run's row.
  awk -F'\t' 'NR == 2 { print $18 }' "$results"
}

SECRET="whsec_$(head -c 32 /dev/urandom | base64 -w0)"
declare -a PLAIN HOOKED
for round in $(seq "$ROUNDS"); do
  PLAIN+=("$(run_relay plain "$round")")
  start_sink "$round"
  # After the [relay] lines compare.sh writes: a new table.
  hook=$'\n[[webhook]]\nname = "bench"\nurl = "http://'"$SINK_ADDR"$'/events"\nsecret = "'"$SECRET"$'"\n'
  HOOKED+=("$(run_relay webhook "$round" "$hook")")
  sleep 2 # the last events of the round are on their way
  stop_sink "$round"
  echo "round $round: end to end plain ${PLAIN[-1]} msgs/s, with one webhook endpoint ${HOOKED[-1]} msgs/s; events: $(cat "$WORK/sink-$round.json")" >&2
done

python3 - "$WORK" "$ROUNDS" "$MESSAGES" "${PLAIN[*]}" "${HOOKED[*]}" <<'PY'
import json, statistics, sys
work, rounds, messages = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
plain = [float(x) for x in sys.argv[4].split()]
hooked = [float(x) for x in sys.argv[5].split()]
stats = [json.load(open(f"{work}/sink-{r}.json")) for r in range(1, rounds + 1)]
mp, mh = statistics.median(plain), statistics.median(hooked)
print(f"end to end, {messages} messages x {rounds} round(s), 32 connections, smarthost to smtp-sink")
print(f"  plain               {mp:10.1f} msgs/s  (rounds: {', '.join(f'{x:.0f}' for x in plain)})")
print(f"  one webhook         {mh:10.1f} msgs/s  (rounds: {', '.join(f'{x:.0f}' for x in hooked)})")
print(f"  ratio               {mh / mp:10.2f}  (target >= 0.90)")
for r, s in enumerate(stats, 1):
    l = s["latency_ms"]
    print(f"  round {r} events: {s['events']} received, {s['distinct_ids']} distinct ids, {s['per_type']}; "
          f"state change to arrival p50 {l['p50']} ms, p90 {l['p90']} ms, p99 {l['p99']} ms, max {l['max']} ms (target p99 <= 1000 ms)")
PY
