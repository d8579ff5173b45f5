#!/usr/bin/env bash
# A local PostgreSQL for the tests that check Quanta on PostgreSQL (tests/test_db_postgres.py).
# Installs Debian's server if it is missing, starts a cluster, makes a role and a database,
# and prints the SQLAlchemy URL on its last line. Exits non-zero (printing why) where it cannot;
# those tests are then skipped. Used by .ci/run; safe to run again.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
        echo "no PostgreSQL server and no way to install one" >&2
        exit 1
    fi
    timeout 600 apt-get update -qq >&2
    timeout 600 apt-get install -y -qq postgresql >&2
fi
version="$(ls /usr/lib/postgresql | sort -V | tail -n 1)"
if ! pg_lsclusters -h 2>/dev/null | grep -q "^$version main"; then
    pg_createcluster "$version" main >&2
fi
pg_ctlcluster "$version" main start >&2 2>&1 || true  # already running is fine
for _ in $(seq 1 50); do
    su postgres -c "psql -qAt -c 'select 1'" >/dev/null 2>&1 && break
    sleep 0.2
done
su postgres -c "psql -qAt -c \"select 1 from pg_roles where rolname='quanta'\"" | grep -q 1 ||
    su postgres -c "psql -q -c \"create role quanta login password 'quanta' createdb\"" >&2
su postgres -c "psql -qAt -c \"select 1 from pg_database where datname='quanta_test'\"" | grep -q 1 ||
    su postgres -c "createdb -O quanta quanta_test" >&2
echo "postgresql+asyncpg://quanta:quanta@127.0.0.1:5432/quanta_test"
