#!/usr/bin/env bash
# AUTH LOGIN over STARTTLS.
. "$(dirname "$0")/lib.sh"
out=$(run_swaks "$STARTTLS" --tls --auth LOGIN --auth-user "$USER" --auth-password "$PASS")
expect "$out" '<~ +334 VXNlcm5hbWU6' "server asked for the user name"
expect "$out" '<~ +235 2\.7\.0' "AUTH LOGIN succeeded"
expect "$out" '<~ +250 2\.0\.0 Ok: queued as' "message queued"
