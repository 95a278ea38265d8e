#!/usr/bin/env bash
# Subset benchmark (printed figures, not a timed test): a generated schema of 12 tables with a
# self-reference (staff → manager), a cycle (store ↔ staff, one side nullable) and ~1M rows,
# exported by `larch export --subset` (1 % of customers, their rentals and payments downward,
# everything they reference upward) beside a plain `larch export` of the same 12 tables at one
# position. Prints each one's wall time and rows, and the subset's closure (rounds, kept rows).
# Usage: scripts/bench-fk-subset.sh [CUSTOMERS]   (default 50000: ~1M rows in all)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
customers=${1:-50000}
work=$(mktemp -d); chmod 755 "$work"
port=${LARCH_BENCH_PG_PORT:-55437}
larch=${LARCH_BIN:-$here/target/release/larch}
[ -x "$larch" ] || { echo "build it first: cargo build --release (or set LARCH_BIN)" >&2; exit 1; }
cleanup() {
  bash "$here/scripts/postgres.sh" stop "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
bash "$here/scripts/postgres.sh" start "$work/pg" "$port" >/dev/null
export PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres PGDATABASE=postgres
psql -q -v ON_ERROR_STOP=1 -v n="$customers" <<'SQL' >/dev/null
CREATE TABLE country (id int PRIMARY KEY, name text);
CREATE TABLE city (id int PRIMARY KEY, country_id int NOT NULL REFERENCES country);
CREATE TABLE address (id int PRIMARY KEY, city_id int NOT NULL REFERENCES city, line text);
CREATE TABLE store (id int PRIMARY KEY, address_id int NOT NULL REFERENCES address, manager_id int);
CREATE TABLE staff (id int PRIMARY KEY, store_id int NOT NULL REFERENCES store,
  manager_id int REFERENCES staff, name text);
ALTER TABLE store ADD FOREIGN KEY (manager_id) REFERENCES staff DEFERRABLE;
CREATE TABLE category (id int PRIMARY KEY, parent_id int REFERENCES category);
CREATE TABLE film (id int PRIMARY KEY, category_id int NOT NULL REFERENCES category, title text);
CREATE TABLE inventory (id int PRIMARY KEY, film_id int NOT NULL REFERENCES film,
  store_id int NOT NULL REFERENCES store);
CREATE TABLE customer (id int PRIMARY KEY, store_id int NOT NULL REFERENCES store,
  address_id int NOT NULL REFERENCES address, email text);
CREATE TABLE rental (id int PRIMARY KEY, customer_id int NOT NULL REFERENCES customer,
  inventory_id int NOT NULL REFERENCES inventory, staff_id int NOT NULL REFERENCES staff);
CREATE INDEX ON rental (customer_id);
CREATE TABLE payment (id int PRIMARY KEY, rental_id int NOT NULL REFERENCES rental,
  amount numeric);
CREATE INDEX ON payment (rental_id);
CREATE TABLE review (id int PRIMARY KEY, customer_id int NOT NULL REFERENCES customer,
  film_id int NOT NULL REFERENCES film, body text);
BEGIN; SET CONSTRAINTS ALL DEFERRED;
INSERT INTO country SELECT i, 'c' || i FROM generate_series(1, 50) i;
INSERT INTO city SELECT i, 1 + i % 50 FROM generate_series(1, 1000) i;
INSERT INTO address SELECT i, 1 + i % 1000, 'line ' || i FROM generate_series(1, :n) i;
INSERT INTO store SELECT i, i, 1 + (i - 1) * 10 FROM generate_series(1, 100) i;
INSERT INTO staff SELECT i, 1 + (i - 1) / 10, CASE WHEN i % 10 = 1 THEN NULLIF(i - 10, -9) ELSE i - (i - 1) % 10 END, 's' || i
  FROM generate_series(1, 1000) i;
INSERT INTO category SELECT i, CASE WHEN i > 10 THEN 1 + i % 10 END FROM generate_series(1, 100) i;
INSERT INTO film SELECT i, 1 + i % 100, 'f' || i FROM generate_series(1, 10000) i;
INSERT INTO inventory SELECT i, 1 + i % 10000, 1 + i % 100 FROM generate_series(1, 50000) i;
INSERT INTO customer SELECT i, 1 + i % 100, 1 + i % :n, 'u' || i || '@example.com' FROM generate_series(1, :n) i;
INSERT INTO rental SELECT i, 1 + (i * 7) % :n, 1 + (i * 13) % 50000, 1 + (i * 3) % 1000
  FROM generate_series(1, :n * 8) i;
INSERT INTO payment SELECT i, 1 + i % (:n * 8), (i % 50) / 10.0 FROM generate_series(1, :n * 8) i;
INSERT INTO review SELECT i, 1 + (i * 11) % :n, 1 + i % 10000, 'r' FROM generate_series(1, :n) i;
COMMIT;
VACUUM ANALYZE;
SQL
total=$(psql -Atc "SELECT sum(n_live_tup) FROM pg_stat_user_tables")
echo "schema: 12 tables, $total rows"
cat > "$work/subset.yaml" <<'YAML'
roots:
  public.customer: {where: "id % 100 = 0"}
downward:
  - {table: public.rental, references: public.customer}
  - {table: public.payment, references: public.rental}
tables: [public.review, public.country]
YAML
dsn="host=127.0.0.1 port=$port user=postgres dbname=postgres"
tables=(country city address store staff category film inventory customer rental payment review)
args=(); for t in "${tables[@]}"; do args+=(--table "$t"); done
"$larch" subset plan --subset "$work/subset.yaml" --connection "$dsn"
time_of() { local s; s=$(date +%s.%N); "$@" >/dev/null 2>"$work/err" || { cat "$work/err" >&2; exit 1; }; echo "$(date +%s.%N) - $s" | bc; }
full=$(time_of "$larch" export --connection "$dsn" "${args[@]}" --store local --path "$work/full" --summary-file "$work/full.json")
sub=$(time_of "$larch" export --connection "$dsn" --subset "$work/subset.yaml" --store local --path "$work/sub" --summary-file "$work/sub.json")
rows() { python3 -c "import json,sys; print(sum(t['row_count'] for t in json.load(open(sys.argv[1]))['tables']))" "$1"; }
echo "plain export of the 12 tables: ${full}s, $(rows "$work/full.json") rows"
echo "subset export (closure + copy): ${sub}s, $(rows "$work/sub.json") rows"
python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['subset']['closure']; print('closure: rounds', c['rounds'], 'kept', c['tables'])" "$work/sub/public.customer/manifest.json"
