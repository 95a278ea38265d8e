#!/usr/bin/env bash
# Throwaway PostgreSQL 15 cluster for tests and local runs.
#   scripts/postgres.sh start DIR PORT [WAL_LEVEL]   initdb (if needed) + start, listening on 127.0.0.1:PORT
#   scripts/postgres.sh stop DIR                      immediate stop
# The cluster trusts local connections (initdb -A trust), uses wal_level=logical unless told
# otherwise, keeps its socket in DIR and never syncs to disk (fsync=off): for tests only.
# LARCH_PG_LISTEN (default 127.0.0.1) is its listen_addresses; LARCH_PG_TRUST_CIDR adds a trusted
# network to pg_hba.conf (e2e/realnode.sh: the pods' network, inside its own network namespace).
# PostgreSQL refuses to run as root, so as root it runs as the `postgres` user via runuser.
set -euo pipefail
BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
cmd=${1:?usage: postgres.sh start|stop DIR [PORT] [WAL_LEVEL]}
dir=${2:?usage: postgres.sh start|stop DIR [PORT] [WAL_LEVEL]}
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
case "$cmd" in
  start)
    port=${3:?usage: postgres.sh start DIR PORT [WAL_LEVEL]}
    wal_level=${4:-logical}
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$dir"
    if [ ! -f "$dir/data/PG_VERSION" ]; then
      as_pg "$BIN/initdb" -D "$dir/data" -A trust -U postgres --no-sync -E UTF8 >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    fi
    if [ -n "${LARCH_PG_TRUST_CIDR:-}" ] && ! grep -q "^host all all ${LARCH_PG_TRUST_CIDR} trust" "$dir/data/pg_hba.conf"; then
      printf 'host all all %s trust\nhost replication all %s trust\n' "$LARCH_PG_TRUST_CIDR" "$LARCH_PG_TRUST_CIDR" \
        | as_pg tee -a "$dir/data/pg_hba.conf" >/dev/null
    fi
    as_pg "$BIN/pg_ctl" -D "$dir/data" -w -t 60 -l "$dir/log" start -o \
      "-c listen_addresses=${LARCH_PG_LISTEN:-127.0.0.1} -p $port -k $dir -c wal_level=$wal_level \
       -c max_replication_slots=32 -c max_wal_senders=32 -c fsync=off \
       -c synchronous_commit=off -c full_page_writes=off -c wal_sender_timeout=30s" >/dev/null \
      || { cat "$dir/log" >&2; exit 1; }
    ;;
  stop)
    if [ -f "$dir/data/postmaster.pid" ]; then
      as_pg "$BIN/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    ;;
  *) echo "usage: postgres.sh start|stop DIR [PORT] [WAL_LEVEL]" >&2; exit 2 ;;
esac
