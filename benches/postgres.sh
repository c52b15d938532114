#!/usr/bin/env bash
# benches/postgres.sh: smtp-once on its PostgreSQL store, one node and two
# nodes on one database, next to smtp-once on SQLite, Postfix and Haraka
# (issue 11).
#
# compare.sh with the PostgreSQL peers added (they are not in its default
# PEERS, which must run on a machine without PostgreSQL): smtp-once-pg is
# one node on a fresh database, smtp-once-pg2 two nodes on one fresh
# database with the load split between them. PG_URL names the server
# (default postgres://postgres@127.0.0.1:5432; the role needs CREATEDB); if
# it does not answer, both are skipped with a warning. See benches/README.md,
# and `benches/compare.sh --help` for every setting (the environment
# overrides the defaults below).
#
#   benches/postgres.sh              # 3 rounds of 20,000 x 4 KiB messages, 8 and 32 connections
#   benches/postgres.sh --quick      # 1 round of 2,000: a few minutes
#   benches/postgres.sh --markdown   # with the docs-ready table on stdout
set -euo pipefail
export PEERS=${PEERS:-"smtp-once smtp-once-pg smtp-once-pg2 postfix haraka"}
exec "$(dirname "${BASH_SOURCE[0]}")/compare.sh" "$@"
