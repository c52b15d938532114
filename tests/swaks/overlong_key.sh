#!/usr/bin/env bash
# A key longer than 255 characters: 554 5.6.0 E01001.
. "$(dirname "$0")/lib.sh"
key=$(printf 'k%.0s' $(seq 1 256))
out=$(run_swaks "$STARTTLS" --tls --auth PLAIN --auth-user "$USER" --auth-password "$PASS" \
      --header "X-Bird-Idempotency-Key: $key")
expect "$out" '<~\* +554 5\.6\.0 E01001 ValidationError' "over-long key refused with E01001"
