#!/usr/bin/env bash
# PIPELINING: swaks sends MAIL/RCPT/DATA in one batch and gets every reply.
. "$(dirname "$0")/lib.sh"
out=$(run_swaks "$STARTTLS" --tls --auth PLAIN --auth-user "$USER" --auth-password "$PASS" \
      --pipeline --to one@example.net,two@example.net)
expect "$out" '<~ +250-PIPELINING' "PIPELINING advertised"
expect "$out" '~> +MAIL FROM:<alice@example.test>' "MAIL sent"
expect "$out" '<~ +250 2\.1\.5 Ok' "recipients accepted"
expect "$out" '<~ +250 2\.0\.0 Ok: queued as' "pipelined message queued"
