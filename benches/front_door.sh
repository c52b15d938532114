#!/usr/bin/env bash
# benches/front_door.sh: what the front door costs (issue 20). Two builds of
# smtp-once, before and after, run benches/http.sh in turn (interleaved
# rounds, same machine, same settings): SMTP via `smtp-once bench`, then
# HTTP with wrk posting raw 4 KiB messages over 32 keep-alive connections,
# each request under its own Idempotency-Key. Prints each round's msgs/s
# and p99 per build and channel, then the medians and after/before.
#
#   OLD_BIN=/path/to/old/smtp-once NEW_BIN=target/release/smtp-once benches/front_door.sh
#   ROUNDS=3 SECONDS_PER_RUN=15 (defaults); BENCH_BIN: the load generator (default NEW_BIN)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROUNDS=${ROUNDS:-3}
export SECONDS_PER_RUN=${SECONDS_PER_RUN:-15} CONNS=${CONNS:-32} SIZE=${SIZE:-4096} SCRAPE=0
: "${OLD_BIN:?OLD_BIN: the smtp-once binary from before (e.g. a release build of the previous commit)}"
NEW_BIN=${NEW_BIN:-target/release/smtp-once}
[ -x "$NEW_BIN" ] || cargo build --release --quiet
# One load generator for both builds (the new one's: its default key style,
# UUID v4, for both), so only the server differs.
export BENCH_BIN=${BENCH_BIN:-$NEW_BIN}
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for round in $(seq "$ROUNDS"); do
  for build in old new; do
    bin=$OLD_BIN
    [ "$build" = new ] && bin=$NEW_BIN
    # http.sh prints "<round> <smtp|http> <msgs/s> <p99 ms> ..." per channel.
    SMTP_ONCE_BIN=$bin ROUNDS=1 benches/http.sh 2>/dev/null |
      awk -v b="$build" -v r="$round" '$2 == "smtp" || $2 == "http" { print r, b, $2, $3, $4 }' |
      tee -a "$results"
  done
done
python3 - "$results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
def med(build, channel, col):
    return statistics.median(float(r[col]) for r in rows if r[1] == build and r[2] == channel)
for channel in ("smtp", "http"):
    old, new = med("old", channel, 3), med("new", channel, 3)
    print(f"{channel}: before {old:,.0f} msgs/s (p99 {med('old', channel, 4):.1f} ms), "
          f"after {new:,.0f} msgs/s (p99 {med('new', channel, 4):.1f} ms): after/before {new / old:.2f}")
PY
