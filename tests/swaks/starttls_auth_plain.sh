#!/usr/bin/env bash
# STARTTLS, then AUTH PLAIN, then a message: 250 queued as <id>.
. "$(dirname "$0")/lib.sh"
out=$(run_swaks "$STARTTLS" --tls --auth PLAIN --auth-user "$USER" --auth-password "$PASS")
expect "$out" '<- +220 2\.0\.0 Ready to start TLS' "STARTTLS accepted"
expect "$out" '<~ +235 2\.7\.0' "AUTH PLAIN succeeded inside TLS"
expect "$out" '<~ +250 2\.0\.0 Ok: queued as [0-9A-Z]+' "message queued"
