#!/usr/bin/env bash
# The whole test suite, on a fresh machine too: installs what the tests need
# (swaks, from Debian's packages; schemathesis, from PyPI), then runs every
# test.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v swaks >/dev/null 2>&1; then
  echo "scripts/test.sh: installing swaks" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq swaks >/dev/null
fi

# tests/http_schemathesis.rs fails (does not skip) without it.
if ! schemathesis --version >/dev/null 2>&1; then
  echo "scripts/test.sh: installing schemathesis" >&2
  pip3 install --quiet schemathesis==4.32.5
  hash -r
fi

cargo test --all-targets "$@"
