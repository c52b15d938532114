#!/usr/bin/env bash
# A retry of the identical message under the same key is replayed: same
# queue id, marked with Idempotency-Replay: true.
. "$(dirname "$0")/lib.sh"
data='From: alice@example.test\nTo: dest@example.net\nSubject: order 1001\nX-Bird-Idempotency-Key: swaks-replay-1\n\nYour order has shipped.\n'
first=$(run_swaks "$STARTTLS" --tls --auth PLAIN --auth-user "$USER" --auth-password "$PASS" --data "$data")
expect "$first" '<~ +250 2\.0\.0 Ok: queued as' "first submission queued"
id=$(grep -Eo 'queued as [0-9A-Z]+' <<<"$first" | tail -n1)
retry=$(run_swaks "$STARTTLS" --tls --auth PLAIN --auth-user "$USER" --auth-password "$PASS" --data "$data")
expect "$retry" '<~ +250-2\.0\.0 Idempotency-Replay: true' "retry carries the replay marker"
expect "$retry" "<~ +250 2\.0\.0 Ok: $id\$" "retry names the original queue id"
