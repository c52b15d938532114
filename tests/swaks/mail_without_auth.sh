#!/usr/bin/env bash
# No AUTH, no trusted network: MAIL is refused, nothing is relayed.
. "$(dirname "$0")/lib.sh"
out=$(run_swaks "$PLAIN")
expect "$out" '<\*\* +530 5\.7\.0 Authentication required' "MAIL without AUTH refused with 530 5.7.0"
