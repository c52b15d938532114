#!/usr/bin/env bash
# The same key with a different message: 550 5.6.0 E01005.
. "$(dirname "$0")/lib.sh"
first=$(run_swaks "$STARTTLS" --tls --auth PLAIN --auth-user "$USER" --auth-password "$PASS" \
        --data 'From: alice@example.test\nX-Bird-Idempotency-Key: swaks-conflict-1\n\nversion one\n')
expect "$first" '<~ +250 2\.0\.0 Ok: queued as' "first message queued"
second=$(run_swaks "$STARTTLS" --tls --auth PLAIN --auth-user "$USER" --auth-password "$PASS" \
        --data 'From: alice@example.test\nX-Bird-Idempotency-Key: swaks-conflict-1\n\nversion two\n')
expect "$second" '<~\* +550 5\.6\.0 E01005 IdempotencyKeyReuse' "different message under a used key refused"
