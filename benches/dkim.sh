#!/usr/bin/env bash
# benches/dkim.sh: what DKIM signing at acceptance costs (issue 14's
# targets). Three accept-only daemons (`[relay] paused = true`, trusted
# network, SQLite), identical but for [[dkim]]: none, one Ed25519 key, one
# RSA-2048 key (both from `smtp-once dkim-keygen`) for example.test, the
# domain of the bench's From: (bench@example.test). Per round, in turn:
# `smtp-once bench -c 32 -n MESSAGES --json --quiet` against each. Prints
# the medians, the signed/unsigned ratios (measured per round, then the
# median: this machine's speed drifts), the machine's raw RSA-2048 signing
# rate (`openssl speed -seconds 3 rsa2048`, one core) and the RSA-signed
# rate as a share of it; checks that every acknowledged message was stored,
# signed by the daemons that sign and by no other.
#
#   benches/dkim.sh                          # 3 rounds x 20,000 messages
#   ROUNDS=1 MESSAGES=2000 benches/dkim.sh   # quick
#   SMTP_ONCE_BIN=target/release/smtp-once benches/dkim.sh   # no build
set -euo pipefail
REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=${ROUNDS:-3}
MESSAGES=${MESSAGES:-20000}
CONNS=${CONNS:-32}
SIZE=${SIZE:-4096}
WORK=${WORK:-/tmp/smtp-once-dkim-bench}
command -v openssl >/dev/null || { echo "openssl is needed (the raw RSA signing rate)" >&2; exit 1; }
if [ -z "${SMTP_ONCE_BIN:-}" ]; then
  (cd "$REPO_DIR" && cargo build --release --quiet)
  SMTP_ONCE_BIN=${CARGO_TARGET_DIR:-$REPO_DIR/target}/release/smtp-once
fi
BIN=$SMTP_ONCE_BIN
rm -rf "$WORK" && mkdir -p "$WORK"
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT

"$BIN" dkim-keygen --domain example.test --selector ed --algorithm ed25519 --out "$WORK/ed.pem" > "$WORK/ed.txt"
"$BIN" dkim-keygen --domain example.test --selector rsa --algorithm rsa --bits 2048 --out "$WORK/rsa.pem" > "$WORK/rsa.txt"

KINDS=(unsigned ed25519 rsa2048)
declare -A PORT=([unsigned]=25311 [ed25519]=25312 [rsa2048]=25313)
declare -A KEY=([unsigned]="" [ed25519]="$WORK/ed.pem" [rsa2048]="$WORK/rsa.pem")
declare -A SELECTOR=([unsigned]="" [ed25519]=ed [rsa2048]=rsa)

for kind in "${KINDS[@]}"; do
  dir=$WORK/$kind
  mkdir -p "$dir"
  cat > "$dir/smtp-once.toml" <<TOML
[server]
hostname = "bench.test"
data_dir = "$dir/data"
max_connections = 1000
[[listener]]
addr = "127.0.0.1:${PORT[$kind]}"
tls = "none"
[[trusted_network]]
cidr = "127.0.0.0/8"
workspace = "bench"
[relay]
mode = "file"
dir = "$dir/outbox"
paused = true
TOML
  if [ -n "${KEY[$kind]}" ]; then
    printf '[[dkim]]\ndomain = "example.test"\nselector = "%s"\nprivate_key = "%s"\n' \
      "${SELECTOR[$kind]}" "${KEY[$kind]}" >> "$dir/smtp-once.toml"
  fi
  "$BIN" serve --config "$dir/smtp-once.toml" > "$dir/stdout" 2> "$dir/server.log" &
  PIDS+=($!)
  for _ in $(seq 100); do grep -q "listening on" "$dir/stdout" 2>/dev/null && break; sleep 0.1; done
  grep -q "listening on" "$dir/stdout" || { echo "$kind daemon did not start:" >&2; tail -5 "$dir/server.log" >&2; exit 1; }
done

declare -A RATES ACKED
for round in $(seq "$ROUNDS"); do
  line="round $round:"
  for kind in "${KINDS[@]}"; do
    out=$("$BIN" bench --server "127.0.0.1:${PORT[$kind]}" -c "$CONNS" -n "$MESSAGES" --size "$SIZE" --json --quiet)
    read -r rate ok < <(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(r["msgs_per_sec"], r["replies"].get("250", 0))' "$out")
    RATES[$kind]="${RATES[$kind]:-} $rate"
    ACKED[$kind]=$(( ${ACKED[$kind]:-0} + ok ))
    line="$line $kind $(printf '%.0f' "$rate")"
  done
  echo "$line msgs/s" >&2
done

# Stored = acknowledged; signed rows: all of them where there is a key.
for kind in "${KINDS[@]}"; do
  read -r stored signed < <(python3 -c '
import sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
print(db.execute("SELECT COUNT(*) FROM queue").fetchone()[0],
      db.execute("SELECT COUNT(*) FROM message_body WHERE trace LIKE ?", ("%DKIM-Signature:%",)).fetchone()[0])
' "$WORK/$kind/data/smtp-once.db")
  want_signed=$stored; [ "$kind" = unsigned ] && want_signed=0
  if [ "$stored" != "${ACKED[$kind]}" ] || [ "$signed" != "$want_signed" ]; then
    echo "MISMATCH $kind: ${ACKED[$kind]} acknowledged, $stored stored, $signed signed" >&2
    exit 1
  fi
done

SPEED=$(openssl speed -seconds 3 rsa2048 2>/dev/null | awk '/^rsa 2048 bits/ { print $6 }')
python3 - "$ROUNDS" "$MESSAGES" "$CONNS" "$SIZE" "$SPEED" "${RATES[unsigned]}" "${RATES[ed25519]}" "${RATES[rsa2048]}" <<'PY'
import statistics, sys
rounds, messages, conns, size, speed = sys.argv[1:6]
unsigned, ed, rsa = ([float(x) for x in a.split()] for a in sys.argv[6:9])
speed = float(speed)
med = statistics.median
def rounds_of(xs):
    return ", ".join(f"{x:.0f}" for x in xs)
ratio = lambda xs: med(x / u for x, u in zip(xs, unsigned))
print(f"DKIM at acceptance, accept-only, {messages} messages x {rounds} round(s), {conns} connections, {size}-byte messages")
print(f"  unsigned      {med(unsigned):8.0f} msgs/s  (rounds: {rounds_of(unsigned)})")
r = ratio(ed)
print(f"  Ed25519       {med(ed):8.0f} msgs/s  (rounds: {rounds_of(ed)})  signed/unsigned {r:.2f} "
      f"(target >= 0.80: {'met' if r >= 0.80 else 'NOT met'})")
print(f"  RSA-2048      {med(rsa):8.0f} msgs/s  (rounds: {rounds_of(rsa)})  signed/unsigned {ratio(rsa):.2f}")
print(f"  openssl speed -seconds 3 rsa2048: {speed:.0f} sign/s (one core)")
print(f"  RSA-signed msgs/s / raw RSA-2048 sign/s: {med(rsa) / speed:.2f}")
PY
