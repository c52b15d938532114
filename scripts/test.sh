#!/usr/bin/env bash
# The whole test suite, on a fresh machine too: installs what the tests need
# (swaks, from Debian's packages), then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v swaks >/dev/null 2>&1; then
  echo "scripts/test.sh: installing swaks" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq swaks >/dev/null
fi

cargo test --all-targets "$@"
