//! Subsets that follow foreign keys (`larch export --subset`, docs/subsetting.md) against a
//! real PostgreSQL 15: each schema's subset is exported, restored with `larch restore` into a
//! fresh database holding the same schema with every constraint enabled, checked for 0
//! foreign key violations, and compared with a reference closure the test computes in SQL by
//! its own (naive, whole-table) fixpoint over the relationships it declares.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

use crate::support::postgres::{Database, new_database};

/// One relationship as the test knows it: `child(columns) → parent(columns)`; `child_expr`
/// replaces the child's columns for a key inside a JSON column; `constraint`: declared in
/// the schema (a virtual one is not); `down`: the spec follows it downward too.
struct Edge {
    child: &'static str,
    child_columns: &'static [&'static str],
    child_expr: Option<&'static str>,
    parent: &'static str,
    parent_columns: &'static [&'static str],
    constraint: bool,
    down: bool,
}

const fn fk(
    child: &'static str,
    child_columns: &'static [&'static str],
    parent: &'static str,
    parent_columns: &'static [&'static str],
) -> Edge {
    Edge {
        child,
        child_columns,
        child_expr: None,
        parent,
        parent_columns,
        constraint: true,
        down: false,
    }
}

struct Scenario {
    schema: &'static str,
    data: &'static str,
    spec: &'static str,
    /// Table → its key columns.
    tables: &'static [(&'static str, &'static [&'static str])],
    /// The roots as the reference takes them: table, predicate.
    roots: &'static [(&'static str, &'static str)],
    /// The relationships the closure follows (set-null ones left out).
    edges: Vec<Edge>,
}

fn key_text(alias: &str, columns: &[&str]) -> String {
    let cols: Vec<String> = columns.iter().map(|c| format!("{alias}.{c}")).collect();
    format!("row({})::text", cols.join(", "))
}

fn join_on(e: &Edge) -> String {
    let child: Vec<String> = match e.child_expr {
        Some(x) => vec![x.replace("{c}", "c")],
        None => e.child_columns.iter().map(|c| format!("c.{c}")).collect(),
    };
    child
        .iter()
        .zip(e.parent_columns)
        .map(|(c, p)| format!("{c} = p.{p}"))
        .collect::<Vec<_>>()
        .join(" AND ")
}

impl Scenario {
    fn key_of(&self, table: &str) -> &'static [&'static str] {
        self.tables.iter().find(|(t, _)| *t == table).unwrap().1
    }

    /// The reference closure: table → keys (`row(…)::text`), by re-running every
    /// relationship over whole tables until nothing is added.
    async fn reference(&self, db: &Database) -> BTreeMap<String, BTreeSet<String>> {
        let c = &db.client;
        c.batch_execute("CREATE TEMPORARY TABLE ref (tbl text, k text, PRIMARY KEY (tbl, k))")
            .await
            .unwrap();
        for (t, predicate) in self.roots {
            c.execute(
                &format!(
                    "INSERT INTO ref SELECT '{t}', {} FROM {t} r WHERE {predicate} ON CONFLICT DO NOTHING",
                    key_text("r", self.key_of(t))
                ),
                &[],
            )
            .await
            .unwrap();
        }
        loop {
            let mut added = 0;
            for e in &self.edges {
                let (ck, pk) = (
                    key_text("c", self.key_of(e.child)),
                    key_text("p", self.key_of(e.parent)),
                );
                let mut steps = vec![(e.parent, pk.clone(), e.child, ck.clone())];
                if e.down {
                    steps.push((e.child, ck.clone(), e.parent, pk.clone()));
                }
                for (to, to_key, from, from_key) in steps {
                    added += c
                        .execute(
                            &format!(
                                "INSERT INTO ref SELECT '{to}', {to_key} FROM {} c JOIN {} p ON {} \
                                 WHERE EXISTS (SELECT 1 FROM ref r WHERE r.tbl = '{from}' AND r.k = {from_key}) \
                                 ON CONFLICT DO NOTHING",
                                e.child,
                                e.parent,
                                join_on(e)
                            ),
                            &[],
                        )
                        .await
                        .unwrap();
                }
            }
            if added == 0 {
                break;
            }
        }
        let mut out: BTreeMap<String, BTreeSet<String>> = self
            .tables
            .iter()
            .map(|(t, _)| (t.to_string(), BTreeSet::new()))
            .collect();
        for row in c.query("SELECT tbl, k FROM ref", &[]).await.unwrap() {
            out.get_mut(&row.get::<_, String>(0))
                .unwrap()
                .insert(row.get(1));
        }
        c.batch_execute("DROP TABLE ref").await.unwrap();
        out
    }

    /// Each table's keys in `db`.
    async fn keys(&self, db: &Database) -> BTreeMap<String, BTreeSet<String>> {
        let mut out = BTreeMap::new();
        for (t, key) in self.tables {
            let rows = db
                .client
                .query(&format!("SELECT {} FROM {t} r", key_text("r", key)), &[])
                .await
                .unwrap();
            out.insert(t.to_string(), rows.iter().map(|r| r.get(0)).collect());
        }
        out
    }

    /// Rows of `db` whose declared foreign key has no parent.
    async fn violations(&self, db: &Database) -> i64 {
        let mut n = 0;
        for e in self.edges.iter().filter(|e| e.constraint) {
            let not_null: Vec<String> = e
                .child_columns
                .iter()
                .map(|c| format!("c.{c} IS NOT NULL"))
                .collect();
            let sql = format!(
                "SELECT count(*) FROM {} c WHERE {} AND NOT EXISTS (SELECT 1 FROM {} p WHERE {})",
                e.child,
                not_null.join(" AND "),
                e.parent,
                join_on(e)
            );
            n += db
                .client
                .query_one(&sql, &[])
                .await
                .unwrap()
                .get::<_, i64>(0);
        }
        n
    }

    /// Exports the subset, restores it into a fresh database with the schema, and checks it
    /// against the reference. Returns the source, the restored database and the archive dir.
    async fn run(&self) -> (Database, Database, tempfile::TempDir) {
        self.checked(true).await
    }

    /// [`Scenario::run`] where the roots may keep no row (random data).
    async fn run_allowing_empty(&self) {
        self.checked(false).await;
    }

    async fn checked(&self, rows_kept: bool) -> (Database, Database, tempfile::TempDir) {
        self.checked_with(rows_kept, &[], false).await
    }

    /// With `masked`, the keys are transformed: the restored tables hold as many rows as the
    /// reference, and their foreign keys still join.
    async fn checked_with(
        &self,
        rows_kept: bool,
        extra: &[std::ffi::OsString],
        masked: bool,
    ) -> (Database, Database, tempfile::TempDir) {
        let src = new_database().await;
        src.client.batch_execute(self.schema).await.unwrap();
        src.client.batch_execute(self.data).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (code, err) = export_with(&src, self.spec, dir.path(), extra);
        assert_eq!(code, 0, "export: {err}");
        let dst = new_database().await;
        dst.client.batch_execute(self.schema).await.unwrap();
        // Children first: the restore orders them by the destination's foreign keys.
        let out = restore(&dst, dir.path(), self.tables.iter().rev().map(|t| t.0));
        assert!(
            out.status.success(),
            "restore: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(self.violations(&dst).await, 0, "no foreign key violation");
        let reference = self.reference(&src).await;
        assert!(
            !rows_kept || reference.values().map(BTreeSet::len).sum::<usize>() > 0,
            "the reference keeps rows"
        );
        let restored = self.keys(&dst).await;
        if masked {
            let counts = |m: &BTreeMap<String, BTreeSet<String>>| -> Vec<usize> {
                m.values().map(BTreeSet::len).collect()
            };
            assert_eq!(
                counts(&restored),
                counts(&reference),
                "as many rows as the reference"
            );
            assert_ne!(restored, reference, "the keys are masked");
        } else {
            assert_eq!(restored, reference, "the closure is the reference's");
        }
        // Each manifest records the closure and its position.
        for (t, _) in self.tables {
            let m = manifest(dir.path(), t);
            let closure = &m["subset"]["closure"];
            assert_eq!(
                closure["tables"][t].as_u64(),
                Some(reference[*t].len() as u64),
                "{t}: {closure}"
            );
            assert_eq!(
                closure["position"], m["head_position"],
                "{t}: the snapshot's position"
            );
            assert_eq!(
                closure["spec"]["roots"].as_object().map(|r| r.len()),
                Some(self.roots.len())
            );
        }
        (src, dst, dir)
    }
}

fn manifest(dir: &std::path::Path, table: &str) -> Value {
    let text = std::fs::read_to_string(dir.join(format!("{table}/manifest.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn larch() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_larch"));
    c.env_remove("LARCH_PG_DSN")
        .env_remove("LARCH_TRANSFORM_KEY")
        .env("LARCH_LOG", "warn");
    c
}

fn export(db: &Database, spec: &str, dir: &std::path::Path) -> (i32, String) {
    export_with(db, spec, dir, &[])
}

fn export_with(
    db: &Database,
    spec: &str,
    dir: &std::path::Path,
    extra: &[std::ffi::OsString],
) -> (i32, String) {
    let file = dir.join("subset.yaml");
    std::fs::write(&file, spec).unwrap();
    let out = larch()
        .args(["export", "--store", "local", "--path"])
        .arg(dir)
        .arg("--subset")
        .arg(&file)
        .args(extra)
        .args(["--slot", &crate::masking::unique_slot("larch_fk_subset")])
        .env("LARCH_PG_DSN", &db.dsn)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn restore<'a>(
    db: &Database,
    dir: &std::path::Path,
    tables: impl Iterator<Item = &'a str>,
) -> std::process::Output {
    let mut c = larch();
    c.args([
        "restore",
        "--store",
        "local",
        "--if-exists",
        "replace",
        "--path",
    ])
    .arg(dir)
    .env("LARCH_PG_DSN", &db.dsn);
    for t in tables {
        c.args(["--table", t]);
    }
    c.output().unwrap()
}

fn chain() -> Scenario {
    Scenario {
        schema: "CREATE TABLE a (id int PRIMARY KEY, name text);
                 CREATE TABLE b (id int PRIMARY KEY, a_id int NOT NULL REFERENCES a);
                 CREATE TABLE c (id int PRIMARY KEY, b_id int REFERENCES b);",
        data: "INSERT INTO a SELECT i, 'a' || i FROM generate_series(1, 50) i;
               INSERT INTO b SELECT i, 1 + i % 50 FROM generate_series(1, 200) i;
               INSERT INTO c SELECT i, CASE WHEN i % 13 = 0 THEN NULL ELSE 1 + i % 200 END
                 FROM generate_series(1, 1000) i;",
        spec: "roots:\n  public.c: {where: \"id % 10 = 0\"}\n",
        tables: &[
            ("public.a", &["id"]),
            ("public.b", &["id"]),
            ("public.c", &["id"]),
        ],
        roots: &[("public.c", "id % 10 = 0")],
        edges: vec![
            fk("public.c", &["b_id"], "public.b", &["id"]),
            fk("public.b", &["a_id"], "public.a", &["id"]),
        ],
    }
}

#[tokio::test]
async fn a_chain_keeps_every_ancestor_of_the_roots() {
    let (_, _, dir) = chain().run().await;
    let out = larch()
        .args(["archive", "inspect", "--table", "public.c", "--path"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("subset:       foreign key closure of 3 tables at ")
            && text.contains("rounds, 100 rows kept here)"),
        "{text}"
    );
}

#[tokio::test]
async fn a_diamond_with_a_downward_rule_keeps_both_paths_and_the_children() {
    let mut down = fk(
        "public.orders",
        &["customer_id"],
        "public.customer",
        &["id"],
    );
    down.down = true;
    Scenario {
        schema: "CREATE TABLE region (id int PRIMARY KEY);
                 CREATE TABLE customer (id int PRIMARY KEY, region_id int NOT NULL REFERENCES region);
                 CREATE TABLE product (id int PRIMARY KEY, region_id int NOT NULL REFERENCES region);
                 CREATE TABLE orders (id int PRIMARY KEY,
                   customer_id int NOT NULL REFERENCES customer,
                   product_id int NOT NULL REFERENCES product);",
        data: "INSERT INTO region SELECT generate_series(1, 10);
               INSERT INTO customer SELECT i, 1 + i % 10 FROM generate_series(1, 300) i;
               INSERT INTO product SELECT i, 1 + (i * 7) % 10 FROM generate_series(1, 100) i;
               INSERT INTO orders SELECT i, 1 + (i * 31) % 300, 1 + (i * 17) % 100
                 FROM generate_series(1, 3000) i;",
        spec: "roots:\n  public.customer: {where: \"id <= 6\"}\n\
               downward:\n  - {table: public.orders, references: public.customer}\n",
        tables: &[
            ("public.region", &["id"]),
            ("public.customer", &["id"]),
            ("public.product", &["id"]),
            ("public.orders", &["id"]),
        ],
        roots: &[("public.customer", "id <= 6")],
        edges: vec![
            down,
            fk("public.orders", &["product_id"], "public.product", &["id"]),
            fk("public.customer", &["region_id"], "public.region", &["id"]),
            fk("public.product", &["region_id"], "public.region", &["id"]),
        ],
    }
    .run()
    .await;
}

#[tokio::test]
async fn a_self_reference_keeps_every_manager_up_the_chain() {
    Scenario {
        schema: "CREATE TABLE employee (id int PRIMARY KEY,
                   manager_id int REFERENCES employee, name text);",
        // A deep chain (1 ← 2 ← … ← 300) beside a tree: the chain takes 300 rounds.
        data: "INSERT INTO employee VALUES (1, NULL, 'boss');
               INSERT INTO employee SELECT i, i - 1, 'chain' FROM generate_series(2, 300) i;
               INSERT INTO employee SELECT i, i / 2 + 1000, 'tree' FROM generate_series(1001, 2000) i
                 WHERE i / 2 + 1000 >= 1001 OR i = 1001;",
        spec: "roots:\n  public.employee: {where: \"id IN (300, 1999, 1500)\"}\n",
        tables: &[("public.employee", &["id"])],
        roots: &[("public.employee", "id IN (300, 1999, 1500)")],
        edges: vec![fk("public.employee", &["manager_id"], "public.employee", &["id"])],
    }
    .run()
    .await;
}

const STORE_STAFF: &str = "CREATE TABLE store (id int PRIMARY KEY, manager_id int);
    CREATE TABLE staff (id int PRIMARY KEY, store_id int NOT NULL REFERENCES store);
    ALTER TABLE store ADD FOREIGN KEY (manager_id) REFERENCES staff DEFERRABLE;";
const STORE_STAFF_DATA: &str = "BEGIN; SET CONSTRAINTS ALL DEFERRED;
    INSERT INTO store SELECT i, i * 10 FROM generate_series(1, 20) i;
    INSERT INTO staff SELECT i, 1 + i % 20 FROM generate_series(1, 400) i;
    UPDATE store SET manager_id = NULL WHERE id % 4 = 0;
    COMMIT;";

#[tokio::test]
async fn a_cycle_through_a_nullable_foreign_key_closes() {
    Scenario {
        schema: STORE_STAFF,
        data: STORE_STAFF_DATA,
        spec: "roots:\n  public.staff: {where: \"id % 37 = 0\"}\n",
        tables: &[("public.store", &["id"]), ("public.staff", &["id"])],
        roots: &[("public.staff", "id % 37 = 0")],
        edges: vec![
            fk("public.staff", &["store_id"], "public.store", &["id"]),
            fk("public.store", &["manager_id"], "public.staff", &["id"]),
        ],
    }
    .run()
    .await;
}

#[tokio::test]
async fn set_null_exports_a_nullable_key_without_its_parent_as_null() {
    let scenario = Scenario {
        schema: STORE_STAFF,
        data: STORE_STAFF_DATA,
        spec: "roots:\n  public.staff: {where: \"id % 37 = 0\"}\nnullableForeignKeys: set-null\n",
        tables: &[("public.store", &["id"]), ("public.staff", &["id"])],
        roots: &[("public.staff", "id % 37 = 0")],
        // store.manager_id is not followed.
        edges: vec![fk("public.staff", &["store_id"], "public.store", &["id"])],
    };
    let (src, dst, _dir) = scenario.run().await;
    let restored = dst
        .client
        .query("SELECT id, manager_id FROM store ORDER BY id", &[])
        .await
        .unwrap();
    let kept_staff = scenario.keys(&dst).await["public.staff"].clone();
    let mut nulled = 0;
    for row in restored {
        let (id, manager): (i32, Option<i32>) = (row.get(0), row.get(1));
        let original: Option<i32> = src
            .client
            .query_one("SELECT manager_id FROM store WHERE id = $1", &[&id])
            .await
            .unwrap()
            .get(0);
        let kept = original.is_some_and(|m| kept_staff.contains(&format!("({m})")));
        assert_eq!(manager, if kept { original } else { None }, "store {id}");
        nulled += usize::from(original.is_some() && !kept);
    }
    assert!(nulled > 0, "some manager was not kept and went out NULL");
}

const TRIANGLE: &str = "CREATE TABLE x (id int PRIMARY KEY, y_id int NOT NULL);
    CREATE TABLE y (id int PRIMARY KEY, z_id int NOT NULL);
    CREATE TABLE z (id int PRIMARY KEY, x_id int NOT NULL);
    ALTER TABLE x ADD FOREIGN KEY (y_id) REFERENCES y DEFERRABLE INITIALLY DEFERRED;
    ALTER TABLE y ADD FOREIGN KEY (z_id) REFERENCES z DEFERRABLE INITIALLY DEFERRED;
    ALTER TABLE z ADD FOREIGN KEY (x_id) REFERENCES x DEFERRABLE INITIALLY DEFERRED;";
/// Two rings: x1 → y1 → z1 → x2 → … → z60 → x1 (180 rows, one cycle), and x101.. in
/// 3-row cycles of their own.
const TRIANGLE_DATA: &str = "BEGIN;
    INSERT INTO x SELECT i, i FROM generate_series(1, 60) i;
    INSERT INTO y SELECT i, i FROM generate_series(1, 60) i;
    INSERT INTO z SELECT i, 1 + i % 60 FROM generate_series(1, 60) i;
    INSERT INTO x SELECT i, i FROM generate_series(101, 200) i;
    INSERT INTO y SELECT i, i FROM generate_series(101, 200) i;
    INSERT INTO z SELECT i, i FROM generate_series(101, 200) i;
    COMMIT;";

fn triangle(spec: &'static str) -> Scenario {
    Scenario {
        schema: TRIANGLE,
        data: TRIANGLE_DATA,
        spec,
        tables: &[
            ("public.x", &["id"]),
            ("public.y", &["id"]),
            ("public.z", &["id"]),
        ],
        roots: &[("public.x", "id IN (7, 150)")],
        edges: vec![
            fk("public.x", &["y_id"], "public.y", &["id"]),
            fk("public.y", &["z_id"], "public.z", &["id"]),
            fk("public.z", &["x_id"], "public.x", &["id"]),
        ],
    }
}

#[tokio::test]
async fn a_cycle_of_three_not_null_foreign_keys_closes_and_restores_deferred() {
    let (_, dst, _) = triangle("roots:\n  public.x: {where: \"id IN (7, 150)\"}\n")
        .run()
        .await;
    let n: i64 = dst
        .client
        .query_one("SELECT count(*) FROM x", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 61, "the whole ring of 60 and the triangle of 150");
}

#[tokio::test]
async fn a_cycle_that_does_not_close_within_max_rounds_is_an_error_naming_it() {
    let scenario = triangle("roots:\n  public.x: {where: \"id = 7\"}\nmaxRounds: 20\n");
    let src = new_database().await;
    src.client.batch_execute(scenario.schema).await.unwrap();
    src.client.batch_execute(scenario.data).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = export(&src, scenario.spec, dir.path());
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("did not close within 20 rounds (maxRounds)")
            && err.contains("through the cycle public."),
        "{err}"
    );
    for t in ["public.x", "public.y", "public.z"] {
        assert!(!dir.path().join(t).exists(), "{t}: nothing written");
    }
}

#[tokio::test]
async fn a_virtual_foreign_key_inside_a_json_column_is_followed() {
    let mut virtual_key = fk("public.event", &[], "public.customer", &["id"]);
    virtual_key.child_expr = Some("({c}.payload->>'customer_id')::int");
    virtual_key.constraint = false;
    Scenario {
        schema: "CREATE TABLE country (code text PRIMARY KEY);
                 CREATE TABLE customer (id int PRIMARY KEY, country text NOT NULL REFERENCES country);
                 CREATE TABLE event (id int PRIMARY KEY, payload jsonb NOT NULL);",
        data: "INSERT INTO country VALUES ('fr'), ('de'), ('it');
               INSERT INTO customer SELECT i, (ARRAY['fr','de','it'])[1 + i % 3] FROM generate_series(1, 100) i;
               INSERT INTO event SELECT i, jsonb_build_object('customer_id', 1 + (i * 7) % 100, 'kind', 'x')
                 FROM generate_series(1, 500) i;",
        spec: "roots:\n  public.event: {where: \"id % 50 = 0\"}\n\
               virtualForeignKeys:\n  - {table: public.event, expression: \"(payload->>'customer_id')::int\", \
               references: public.customer, referencedColumns: [id]}\n",
        tables: &[
            ("public.country", &["code"]),
            ("public.customer", &["id"]),
            ("public.event", &["id"]),
        ],
        roots: &[("public.event", "id % 50 = 0")],
        edges: vec![
            virtual_key,
            fk("public.customer", &["country"], "public.country", &["code"]),
        ],
    }
    .run()
    .await;
}

#[tokio::test]
async fn composite_keys_are_followed_upward_and_downward() {
    let mut line = fk(
        "public.line",
        &["order_no", "shop"],
        "public.head",
        &["order_no", "shop"],
    );
    line.down = true;
    Scenario {
        schema: "CREATE TABLE shop (code text PRIMARY KEY);
                 CREATE TABLE head (order_no int, shop text REFERENCES shop, PRIMARY KEY (order_no, shop));
                 CREATE TABLE line (order_no int, shop text, n int,
                   PRIMARY KEY (order_no, shop, n),
                   FOREIGN KEY (order_no, shop) REFERENCES head (order_no, shop));",
        data: "INSERT INTO shop VALUES ('a'), ('b'), ('c');
               INSERT INTO head SELECT o, s FROM generate_series(1, 100) o, unnest(ARRAY['a','b','c']) s;
               INSERT INTO line SELECT o, s, n FROM generate_series(1, 100) o,
                 unnest(ARRAY['a','b','c']) s, generate_series(1, 1 + o % 4) n;",
        spec: "roots:\n  public.head: {where: \"order_no % 10 = 3 AND shop <> 'c'\"}\n\
               downward:\n  - {table: public.line, references: public.head, columns: [order_no, shop]}\n",
        tables: &[
            ("public.shop", &["code"]),
            ("public.head", &["order_no", "shop"]),
            ("public.line", &["order_no", "shop", "n"]),
        ],
        roots: &[("public.head", "order_no % 10 = 3 AND shop <> 'c'")],
        edges: vec![line, fk("public.head", &["shop"], "public.shop", &["code"])],
    }
    .run()
    .await;
}

#[tokio::test]
async fn subset_plan_prints_the_closure_and_bad_specs_name_the_field() {
    let src = new_database().await;
    src.client.batch_execute(STORE_STAFF).await.unwrap();
    src.client.batch_execute(STORE_STAFF_DATA).await.unwrap();
    src.client.batch_execute("ANALYZE").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.yaml");
    std::fs::write(&file, "roots:\n  public.staff: {where: \"id < 40\"}\n").unwrap();
    let out = larch()
        .args(["subset", "plan", "--subset"])
        .arg(&file)
        .env("LARCH_PG_DSN", &src.dsn)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("public.staff (root): ~39 of ~400 rows"),
        "{text}"
    );
    assert!(
        text.contains(
            "public.store(manager_id) → public.staff(id) [constraint store_manager_id_fkey]: upward"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "public.staff(store_id) → public.store(id) [constraint staff_store_id_fkey]: upward"
        ),
        "{text}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "nothing exported"
    );
    for (spec, want) in [
        (
            "roots:\n  public.nosuch: {}\n",
            "roots.public.nosuch: table public.nosuch does not exist",
        ),
        (
            "roots:\n  public.staff: {}\ndownward:\n  - {table: public.store, references: public.staff, columns: [id]}\n",
            "downward[0].columns: 1 foreign key(s) of public.store reference public.staff",
        ),
        (
            "roots:\n  public.staff: {}\nvirtualForeignKeys:\n  - {table: public.staff, columns: [nope], references: public.store, referencedColumns: [id]}\n",
            "virtualForeignKeys[0].columns: column \"nope\" of table public.staff does not exist",
        ),
        (
            "roots:\n  public.staff: {where: \"pg_sleep(1) IS NULL\"}\n",
            "roots.public.staff.where",
        ),
    ] {
        std::fs::write(&file, spec).unwrap();
        let out = larch()
            .args(["subset", "plan", "--subset"])
            .arg(&file)
            .env("LARCH_PG_DSN", &src.dsn)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{spec}: {err}");
        assert!(err.contains(want), "{spec}: {err}");
        let (code, err) = export(&src, spec, dir.path());
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(want), "{spec}: {err}");
        assert!(
            !dir.path().join("public.staff").exists(),
            "nothing exported"
        );
    }
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// A random schema (2 to 5 tables, each with up to 2 foreign keys to any table, itself
/// included, nullable or not, deferrable so any cycle holds data), random rows, random roots
/// and downward rules.
fn random_scenario(seed: u64) -> Scenario {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n = rng.random_range(2..=5usize);
    let rows = rng.random_range(20..=60i32);
    let names: Vec<&'static str> = (0..n).map(|i| leak(format!("public.t{i}"))).collect();
    let (mut schema, mut constraints, mut data) =
        (String::new(), String::new(), String::from("BEGIN;\n"));
    let (mut edges, mut downward) = (Vec::new(), String::new());
    for table in &names {
        let mut columns = vec!["id int PRIMARY KEY".to_string()];
        let mut values = vec!["i".to_string()];
        for j in 0..rng.random_range(0..=2) {
            let column: &'static str = leak(format!("f{j}"));
            let parent = names[rng.random_range(0..n)];
            let nullable = rng.random_bool(0.5);
            columns.push(format!(
                "{column} int{}",
                if nullable { "" } else { " NOT NULL" }
            ));
            constraints.push_str(&format!(
                "ALTER TABLE {table} ADD FOREIGN KEY ({column}) REFERENCES {parent} DEFERRABLE INITIALLY DEFERRED;\n"
            ));
            let salt = rng.random_range(1..1000);
            values.push(if nullable {
                format!(
                    "CASE WHEN (i * {salt}) % 5 = 0 THEN NULL ELSE 1 + (i * {salt}) % {rows} END"
                )
            } else {
                format!("1 + (i * {salt} + {j}) % {rows}")
            });
            let mut e = fk(table, Box::leak(Box::new([column])), parent, &["id"]);
            if rng.random_bool(0.3) {
                e.down = true;
                downward.push_str(&format!(
                    "  - {{table: {table}, references: {parent}, columns: [{column}]}}\n"
                ));
            }
            edges.push(e);
        }
        schema.push_str(&format!("CREATE TABLE {table} ({});\n", columns.join(", ")));
        data.push_str(&format!(
            "INSERT INTO {table} SELECT {} FROM generate_series(1, {rows}) i;\n",
            values.join(", ")
        ));
    }
    schema.push_str(&constraints);
    data.push_str("COMMIT;");
    let root = names[rng.random_range(0..n)];
    let predicate = leak(format!("id % 9 = {}", rng.random_range(0..9)));
    let mut spec = format!(
        "roots:\n  {root}: {{where: \"{predicate}\"}}\ntables: [{}]\n",
        names.join(", ")
    );
    if !downward.is_empty() {
        spec.push_str(&format!("downward:\n{downward}"));
    }
    let tables: Vec<(&'static str, &'static [&'static str])> =
        names.iter().map(|t| (*t, &["id"][..])).collect();
    Scenario {
        schema: leak(schema),
        data: leak(data),
        spec: leak(spec),
        tables: Box::leak(tables.into_boxed_slice()),
        roots: Box::leak(Box::new([(root, predicate)])),
        edges,
    }
}

#[tokio::test]
async fn random_foreign_key_graphs_restore_cleanly_with_the_reference_closure() {
    for seed in 1..=8u64 {
        let scenario = random_scenario(seed);
        eprintln!("seed {seed}: {}\n{}", scenario.schema, scenario.spec);
        scenario.run_allowing_empty().await;
    }
}

#[tokio::test]
async fn a_masked_subset_joins_like_the_raw_one() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    let key = dir.path().join("key");
    std::fs::write(
        &rules,
        "tables:\n  public.a: {undeclared: keep, columns: {id: hash, name: {fake: full_name}}}\n  \
         public.b: {undeclared: keep, columns: {id: hash, a_id: hash}}\n  \
         public.c: {undeclared: keep, columns: {b_id: hash}}\n",
    )
    .unwrap();
    std::fs::write(&key, "a key of at least sixteen bytes").unwrap();
    let args: Vec<std::ffi::OsString> = vec![
        "--transform".into(),
        rules.into(),
        "--transform-key-file".into(),
        key.into(),
    ];
    chain().checked_with(true, &args, true).await;
}

#[tokio::test]
async fn a_sampled_root_is_deterministic_and_its_closure_restores() {
    let scenario = chain();
    let spec = "roots:\n  public.c: {sample: {percent: 30}}\n";
    let src = new_database().await;
    src.client.batch_execute(scenario.schema).await.unwrap();
    src.client.batch_execute(scenario.data).await.unwrap();
    let mut kept = Vec::new();
    for _ in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        let (code, err) = export(&src, spec, dir.path());
        assert_eq!(code, 0, "{err}");
        let dst = new_database().await;
        dst.client.batch_execute(scenario.schema).await.unwrap();
        let out = restore(
            &dst,
            dir.path(),
            ["public.c", "public.b", "public.a"].into_iter(),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(scenario.violations(&dst).await, 0);
        kept.push(scenario.keys(&dst).await);
    }
    assert_eq!(kept[0], kept[1], "the same rows twice");
    let roots = kept[0]["public.c"].len();
    assert!((150..=450).contains(&roots), "{roots} of 1000 at 30 %");
    assert!(!kept[0]["public.a"].is_empty() && !kept[0]["public.b"].is_empty());
}

/// A partitioned fact table between a plain parent and a plain child: row identities repeat
/// across partitions (each partition numbers its own pages), and the closure keeps exactly the
/// referenced rows of each partition.
#[tokio::test]
async fn a_partitioned_table_is_followed_through_its_partitions() {
    Scenario {
        schema: "CREATE TABLE customer (id int PRIMARY KEY, name text);
                 CREATE TABLE events (id int, at date, customer_id int NOT NULL REFERENCES customer,
                                      PRIMARY KEY (id, at)) PARTITION BY RANGE (at);
                 CREATE TABLE events_h1 PARTITION OF events FOR VALUES FROM ('2025-01-01') TO ('2025-07-01');
                 CREATE TABLE events_h2 PARTITION OF events FOR VALUES FROM ('2025-07-01') TO ('2026-01-01');
                 CREATE TABLE notes (id int PRIMARY KEY, event_id int NOT NULL, event_at date NOT NULL,
                                     FOREIGN KEY (event_id, event_at) REFERENCES events);",
        data: "INSERT INTO customer SELECT i, 'c' || i FROM generate_series(1, 100) i;
               INSERT INTO events SELECT i, date '2025-01-01' + (i % 360), 1 + (i * 7) % 100
                 FROM generate_series(1, 2000) i;
               INSERT INTO notes SELECT i, e.id, e.at FROM generate_series(1, 500) i
                 JOIN events e ON e.id = 1 + (i * 13) % 2000;",
        spec: "roots:\n  public.notes: {where: \"id % 10 = 0\"}\n",
        tables: &[
            ("public.customer", &["id"]),
            ("public.events", &["id", "at"]),
            ("public.notes", &["id"]),
        ],
        roots: &[("public.notes", "id % 10 = 0")],
        edges: vec![
            fk(
                "public.notes",
                &["event_id", "event_at"],
                "public.events",
                &["id", "at"],
            ),
            fk("public.events", &["customer_id"], "public.customer", &["id"]),
        ],
    }
    .run()
    .await;
}
