# Shared helpers for the swaks scripts. The Rust test `tests/swaks.rs`
# starts a real daemon and runs each script with these variables set:
#   PLAIN     host:port of a plaintext listener (AUTH not allowed in clear)
#   STARTTLS  host:port of a STARTTLS listener
#   IMPLICIT  host:port of an implicit-TLS listener
#   USER/PASS credentials of an account in workspace "acme" (senders *@example.test)
set -euo pipefail
: "${PLAIN:?} ${STARTTLS:?} ${IMPLICIT:?} ${USER:?} ${PASS:?}"

host() { echo "${1%:*}"; }
port() { echo "${1##*:}"; }

# swaks against a listener given as host:port; extra arguments pass through.
# Never fails by itself: the caller checks the transcript.
run_swaks() {
  local addr=$1; shift
  swaks --server "$(host "$addr")" --port "$(port "$addr")" \
        --helo swaks.test --from alice@example.test --to dest@example.net \
        --timeout 30 "$@" 2>&1 || true
}

# expect TRANSCRIPT REGEX DESCRIPTION
expect() {
  if grep -Eq -- "$2" <<<"$1"; then
    echo "ok: $3"
  else
    echo "FAILED: $3 (no match for /$2/)"
    echo "----- transcript -----"; echo "$1"; echo "----------------------"
    exit 1
  fi
}

# The final reply line of the DATA phase (swaks marks server lines with <~ or <-).
final_reply() { grep -E '^ *<[~-]\*? +[0-9]{3}[ -]' <<<"$1" | grep -v ' 221 ' | tail -n 1; }
