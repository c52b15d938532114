#!/usr/bin/env bash
# The whole test suite, on a fresh machine too: installs what the tests need
# (swaks, openssl, promtool and chromium, from Debian's packages;
# playwright-core, from npm; schemathesis, standardwebhooks, dkimpy and
# pynacl, from PyPI), then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

# Installs the Debian package $1 unless its command $2 is there; further
# arguments go to apt-get install.
apt_need() {
  command -v "$2" >/dev/null 2>&1 && return 0
  echo "scripts/test.sh: installing $1" >&2
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${@:3}" "$1" >/dev/null
}

apt_need swaks swaks

# tests/postfix_front.rs runs a private Postfix instance (its own config and
# queue directories, a free port) in front of smtp-once; it fails (does not
# skip) without it. "No configuration": the package sets up no system mail
# service of its own.
if ! command -v /usr/sbin/postfix >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "postfix postfix/main_mailer_type select No configuration" | $sudo debconf-set-selections
  apt_need postfix /usr/sbin/postfix
fi

# tests/http_schemathesis.rs fails (does not skip) without it.
if ! schemathesis --version >/dev/null 2>&1; then
  echo "scripts/test.sh: installing schemathesis" >&2
  pip3 install --quiet schemathesis==4.32.5
  hash -r
fi

# tests/webhooks.rs runs examples/webhook_receiver.py, which verifies
# signatures with the reference implementation; it fails (does not skip)
# without it.
if ! python3 -c 'import standardwebhooks' >/dev/null 2>&1; then
  echo "scripts/test.sh: installing standardwebhooks" >&2
  pip3 install --quiet standardwebhooks==1.1.0
fi

# tests/dkim.rs verifies signatures with dkimpy (tests/dkim_verify.py), an
# independent implementation, which needs PyNaCl for Ed25519; it fails (does
# not skip) without them. It also runs openssl (an RSA-1024 key to refuse).
if ! python3 -c 'import dkim, nacl' >/dev/null 2>&1; then
  echo "scripts/test.sh: installing dkimpy and pynacl" >&2
  pip3 install --quiet dkimpy==1.1.8 pynacl==1.6.2
fi

apt_need openssl openssl

# tests/mx_dns.rs runs a real DNS: Knot (authoritative, signing the test
# zones with DNSSEC; keymgr comes with it) and Unbound (validating). Both
# run as the test's own processes on free loopback ports; the packages'
# own services are not used. It fails (does not skip) without them.
apt_need knot /usr/sbin/knotd
apt_need unbound /usr/sbin/unbound

# tests/console_browser.rs drives Debian's chromium with playwright-core
# (pinned in tests/console/package-lock.json; it downloads no browser of
# its own); it fails (does not skip) without either.
apt_need chromium /usr/bin/chromium
if [ ! -d tests/console/node_modules/playwright-core ]; then
  echo "scripts/test.sh: installing tests/console's node packages" >&2
  # One retry: the registry has failed a first fetch here once.
  npm ci --prefix tests/console --no-audit --no-fund --silent ||
    { sleep 5; npm ci --prefix tests/console --no-audit --no-fund --silent; }
fi

# tests/metrics.rs pipes /metrics into `promtool check metrics`; it fails
# (does not skip) without it. Only promtool is wanted: no recommended
# node exporter. Where systemd runs, the package starts a Prometheus
# server on :9090, a port no test uses (they bind :0).
apt_need prometheus promtool --no-install-recommends

# The PostgreSQL tests (tests/postgres_nodes.rs and the second pass below)
# need the local server: 127.0.0.1:5432, user postgres, trust auth. Without
# it the suite fails here rather than skipping them.
if ! pg_isready -q -h 127.0.0.1 -p 5432 -t 10 ||
  ! psql -h 127.0.0.1 -U postgres -d postgres -Atqc 'SELECT 1' >/dev/null 2>&1; then
  echo "scripts/test.sh: PostgreSQL is not reachable at 127.0.0.1:5432 as user postgres" >&2
  echo "  (the PostgreSQL store tests need it; start it, e.g." >&2
  echo "  'pg_ctlcluster --skip-systemctl-redirect \$(ls /etc/postgresql) main start')" >&2
  exit 1
fi

cargo test --all-targets "$@"

# Second pass: the exactly-once tests (acceptance, kill -9 mid-relay, webhooks)
# again, each daemon on a fresh PostgreSQL database instead of SQLite.
SMTP_ONCE_TEST_STORE=postgres cargo test --no-fail-fast --test idempotency --test relay_crash --test webhooks "$@"
