#!/usr/bin/env bash
# Implicit TLS (465 style): TLS from the first byte.
. "$(dirname "$0")/lib.sh"
out=$(run_swaks "$IMPLICIT" --tls-on-connect --auth PLAIN --auth-user "$USER" --auth-password "$PASS")
expect "$out" 'TLS started' "TLS on connect"
expect "$out" '<~ +220 ' "greeting arrived inside TLS"
expect "$out" '<~ +250 2\.0\.0 Ok: queued as' "message queued"
