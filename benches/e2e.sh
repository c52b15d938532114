#!/usr/bin/env bash
# benches/e2e.sh: the whole relay, smtp-once against Postfix (issue 10, item 5).
#
# compare.sh with the peers that matter for relaying: smtp-once and Postfix
# accept-only, each of them relaying to its own smtp-sink (smarthost mode;
# relayhost), and that kind of sink driven directly (the ceiling), at 32
# connections, interleaved in the same rounds. See
# benches/README.md, and `benches/compare.sh --help` for every setting (the
# environment overrides the defaults below).
#
#   benches/e2e.sh                 # 3 rounds of 20,000 x 4 KiB messages
#   benches/e2e.sh --quick         # 1 round of 2,000: a few minutes
#   benches/e2e.sh --markdown      # with the docs-ready tables on stdout
set -euo pipefail
export PEERS=${PEERS:-"smtp-once postfix smtp-once-relay postfix-relay smtp-sink-dump"}
export CONNS=${CONNS:-32}
export RELAY_CONNS=${RELAY_CONNS:-$CONNS}
exec "$(dirname "${BASH_SOURCE[0]}")/compare.sh" "$@"
