#!/usr/bin/env bash
# A message over the SIZE limit (the test daemon allows 100000 bytes).
. "$(dirname "$0")/lib.sh"
body=$(mktemp)
trap 'rm -f "$body"' EXIT
for _ in $(seq 1 3000); do echo 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'; done > "$body"
out=$(run_swaks "$STARTTLS" --tls --auth PLAIN --auth-user "$USER" --auth-password "$PASS" \
      --body "@$body" --suppress-data)
expect "$out" '<~ +250-SIZE 100000' "SIZE advertised"
expect "$out" '<~\* +552 5\.3\.4 Message size exceeds' "oversized message refused with 552 5.3.4"
