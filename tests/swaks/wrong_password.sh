#!/usr/bin/env bash
# A wrong password: 535 5.7.8.
. "$(dirname "$0")/lib.sh"
out=$(run_swaks "$STARTTLS" --tls --auth PLAIN --auth-user "$USER" --auth-password "not-the-password")
expect "$out" '<~\* +535 5\.7\.8' "wrong password refused with 535 5.7.8"
