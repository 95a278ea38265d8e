//! `larch transform suggest` and `preview` against a real PostgreSQL 15, and a masked
//! continuous export's report of the columns its rules do not name (the ArchiveExport's
//! `UnreviewedColumns` condition reads it). Helpers: tests/it/masking.rs.

use std::collections::BTreeSet;

use larch::contract::transform_rules::{ColumnRule, TransformRules};
use serde_json::Value;

use crate::engine_support::{eventually, get, get_json};
use crate::masking::*;
use crate::postgres_continuous::{listening, unsafe_kill};
use crate::support::postgres::{Database, new_database};

/// `digits` with Luhn's check digit appended.
fn luhn_complete(digits: &str) -> String {
    let sum: u32 = digits
        .bytes()
        .rev()
        .enumerate()
        .map(|(i, d)| {
            let d = u32::from(d - b'0');
            if i % 2 == 0 {
                let x = d * 2;
                if x > 9 { x - 9 } else { x }
            } else {
                d
            }
        })
        .sum();
    format!("{digits}{}", (10 - sum % 10) % 10)
}

/// A German IBAN for an 18-digit BBAN, with its mod-97 check digits.
fn iban(bban: &str) -> String {
    let digits = format!("{bban}131400"); // D=13, E=14, then 00
    let rem = digits
        .bytes()
        .fold(0u32, |r, d| (r * 10 + u32::from(d - b'0')) % 97);
    format!("DE{:02}{bban}", 98 - rem)
}

const ROWS: i64 = 50;

/// Ten tables: 18 columns hold personal data (13 say so by name, 5 only by their values) and
/// 43 do not, traps included (`email_verified`, `ip_count`, `name_id`, `card_brand`, a
/// `version` of dotted numbers, an `order_number` of digits and dashes).
const SENSITIVE: [&str; 18] = [
    "customers.email",
    "customers.first_name",
    "customers.last_name",
    "customers.notes",
    "addresses.street",
    "addresses.city",
    "addresses.zip",
    "payments.ref",
    "payments.iban",
    "sessions.ip",
    "sessions.api_token",
    "employees.name",
    "employees.ssn",
    "employees.dob",
    "audit_log.actor",
    "contacts.mobile",
    "contacts.payload",
    "devices.peer",
];

async fn generated_schema(db: &Database) {
    db.client
        .batch_execute(&format!(
            "CREATE TABLE customers (id int8 PRIMARY KEY, email text NOT NULL, first_name text,
                 last_name text, email_verified boolean NOT NULL, created_at timestamptz,
                 notes text, loyalty_points int);
             CREATE TABLE addresses (id int4 PRIMARY KEY, customer_id int8, street text,
                 city text, zip text, country_code char(2), is_default boolean);
             CREATE TABLE payments (id int8 PRIMARY KEY, amount numeric(10,2), currency text,
                 ref text, iban varchar(34), status text, card_brand text);
             CREATE TABLE sessions (id uuid PRIMARY KEY, customer_id int8, ip inet,
                 ip_count int, user_agent text, api_token text, expires_at timestamptz);
             CREATE TABLE employees (id int4 PRIMARY KEY, name text NOT NULL, name_id int,
                 ssn text, dob date, department text, salary_band int);
             CREATE TABLE audit_log (id int8 PRIMARY KEY, actor text, action text,
                 at timestamptz, details jsonb);
             CREATE TABLE contacts (id int4 PRIMARY KEY, mobile text, payload text, label text);
             CREATE TABLE products (id int4 PRIMARY KEY, sku text, title text,
                 price numeric(8,2), stock int, version text);
             CREATE TABLE orders (id int8 PRIMARY KEY, customer_id int8, total numeric(10,2),
                 order_number text, shipped boolean, placed_on date);
             CREATE TABLE devices (id int4 PRIMARY KEY, peer text, device_type text,
                 firmware text);
             INSERT INTO customers SELECT g, 'customer' || g || '@mail.example', 'Ann' || g,
                 'Lee' || g, g % 2 = 0, now(),
                 CASE WHEN g % 5 = 0 THEN 'asked to write to ops' || g || '@corp.example'
                      ELSE 'prefers mornings' END, g * 10
               FROM generate_series(1, {ROWS}) g;
             INSERT INTO addresses SELECT g, g, g || ' Main Street', 'Springfield',
                 lpad((10000 + g)::text, 5, '0'), 'DE', true FROM generate_series(1, {ROWS}) g;
             INSERT INTO sessions SELECT md5('s' || g)::uuid, g, ('10.0.' || g || '.1')::inet,
                 g, 'Mozilla/5.0 (X11; Linux x86_64) Firefox/120.0', md5('tok' || g), now()
               FROM generate_series(1, {ROWS}) g;
             INSERT INTO employees SELECT g, 'Employee ' || g, g, '123-45-' || (1000 + g),
                 date '1980-01-01' + g, 'Sales', g % 5 FROM generate_series(1, {ROWS}) g;
             INSERT INTO audit_log SELECT g, 'admin' || g || '@corp.example', 'login', now(),
                 jsonb_build_object('attempt', g, 'result', 'ok') FROM generate_series(1, {ROWS}) g;
             INSERT INTO contacts SELECT g, '+49 30 ' || (1000000 + g),
                 'eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI' || g || 'In0.c2lnbmF0dXJl' || g, 'home'
               FROM generate_series(1, {ROWS}) g;
             INSERT INTO products SELECT g, 'SKU-' || lpad(g::text, 6, '0'), 'Widget ' || g,
                 g * 1.5, g, '1.' || (g % 9) || '.' || g FROM generate_series(1, {ROWS}) g;
             INSERT INTO orders SELECT g, g, g * 3.25, 'ORD-2024-' || lpad(g::text, 6, '0'),
                 g % 2 = 0, date '2024-01-01' + g FROM generate_series(1, {ROWS}) g;
             INSERT INTO devices SELECT g, '192.168.' || (g % 250) || '.' || g, 'sensor',
                 '2.0.' || g FROM generate_series(1, {ROWS}) g;"
        ))
        .await
        .unwrap();
    for g in 1..=ROWS {
        let card = luhn_complete(&format!("4{:014}", 3_141_592_653_589 + g * 7919));
        let bban = format!("{:018}", 370_400_440_532_013_000_i64 + g);
        db.client
            .execute(
                "INSERT INTO payments VALUES ($1, $1::int8 * 2.5, 'EUR', $2, $3, 'paid', 'visa')",
                &[&g, &format!("paid with {card}"), &iban(&bban)],
            )
            .await
            .unwrap();
    }
}

/// `larch transform ARGS` on `db`: (exit code, stdout, stderr).
fn transform(db: &Database, args: &[std::ffi::OsString]) -> (i32, String, String) {
    let out = larch()
        .arg("transform")
        .args(args)
        .env("LARCH_PG_DSN", &db.dsn)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn suggest(db: &Database, extra: &[&str]) -> (i32, String, String) {
    let args: Vec<std::ffi::OsString> = ["suggest"].iter().chain(extra).map(Into::into).collect();
    transform(db, &args)
}

/// `table.column` of every column the rules mask (anything but keep).
fn flagged(rules: &TransformRules) -> BTreeSet<String> {
    rules
        .tables
        .iter()
        .flat_map(|(t, r)| {
            r.columns
                .iter()
                .filter(|(_, rule)| **rule != ColumnRule::Keep)
                .map(move |(c, _)| format!("{}.{c}", t.trim_start_matches("public.")))
        })
        .collect()
}

#[tokio::test]
async fn suggest_finds_the_sensitive_columns_of_a_generated_schema() {
    let db = new_database().await;
    generated_schema(&db).await;
    let (code, out, err) = suggest(&db, &[]);
    assert_eq!(code, 0, "{err}");
    let rules =
        TransformRules::parse(&out, "suggest's output").unwrap_or_else(|e| panic!("{e}\n{out}"));
    assert_eq!(rules.tables.len(), 10, "{out}");
    let total: usize = rules.tables.values().map(|t| t.columns.len()).sum();
    assert_eq!(total, 61, "every column named: {out}");
    let truth: BTreeSet<String> = SENSITIVE.iter().map(|s| s.to_string()).collect();
    let found = flagged(&rules);
    let tp = found.intersection(&truth).count();
    let fp: Vec<&String> = found.difference(&truth).collect();
    let fn_: Vec<&String> = truth.difference(&found).collect();
    let precision = tp as f64 / found.len().max(1) as f64;
    let recall = tp as f64 / truth.len() as f64;
    println!(
        "transform suggest on 10 tables, 61 columns (18 sensitive, 5 by values only): precision {precision:.3}, recall {recall:.3} ({tp} true, {} false positives {fp:?}, {} missed {fn_:?})",
        fp.len(),
        fn_.len()
    );
    assert_eq!(recall, 1.0, "missed {fn_:?}\n{out}");
    assert!(fp.len() <= 2, "false positives {fp:?}\n{out}");
    // Every suggestion says why, and no sampled value is printed.
    for line in out
        .lines()
        .filter(|l| l.contains(": ") && !l.trim_start().starts_with('#'))
    {
        let masked = !line.contains(": keep") && line.starts_with("      ");
        assert_eq!(masked, line.contains("  # "), "{line}");
    }
    for raw in [
        "customer1@mail.example",
        "123-45-1001",
        "10.0.1.1",
        "Ann1",
        "ops5@corp",
    ] {
        assert!(!out.contains(raw) && !err.contains(raw), "{raw} printed");
    }
    assert!(out.contains("values hold payment card numbers"), "{out}");
    assert!(
        out.contains("values hold IBANs") || out.contains("suggests IBANs"),
        "{out}"
    );

    // The file is the export's: preview compiles it, through the exporter, for every table.
    let files = Files::new(&out);
    for table in rules.tables.keys() {
        let p = preview(&db, &files, table, 2, &["-o", "json"]);
        assert_eq!(p.0, 0, "{table}: {}", p.2);
    }

    // Columns a given file names are kept as it says; the rest is suggested around them.
    let given = Files::new("tables:\n  public.customers:\n    columns: {email: keep, id: hash}\n");
    let (code, out, err) = suggest(
        &db,
        &[
            "--tables",
            "customers,employees",
            "--sample",
            "20",
            "--transform",
            given.rules().to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    let merged = TransformRules::parse(&out, "merged").unwrap();
    assert_eq!(merged.tables.len(), 2, "{out}");
    let customers = &merged.tables["public.customers"];
    assert_eq!(customers.columns["email"], ColumnRule::Keep);
    assert_eq!(customers.columns["id"], ColumnRule::Hash);
    assert!(out.contains("from "), "{out}");
    assert_ne!(customers.columns["first_name"], ColumnRule::Keep, "{out}");
    assert_eq!(
        merged.tables["public.employees"].columns["ssn"],
        ColumnRule::Hash,
        "{out}"
    );
    // Bad input: a clear error, exit 2.
    let (code, _, err) = suggest(&db, &["--tables", "nosuch"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("table public.nosuch does not exist"), "{err}");
}

fn preview(
    db: &Database,
    files: &Files,
    table: &str,
    rows: u32,
    extra: &[&str],
) -> (i32, String, String) {
    let mut args: Vec<std::ffi::OsString> = ["preview", "--table", table, "--rows"]
        .iter()
        .map(Into::into)
        .collect();
    args.push(rows.to_string().into());
    args.extend(["--transform".into(), files.rules().into()]);
    args.extend(["--transform-key-file".into(), files.key().into()]);
    args.extend(extra.iter().map(Into::into));
    transform(db, &args)
}

/// What would change if anything were written: the rows, slots and publications.
async fn fingerprint(db: &Database) -> Vec<String> {
    let mut out = vec![];
    for sql in [
        "SELECT md5(string_agg(u::text, ',' ORDER BY id)) FROM users u",
        "SELECT md5(string_agg(o::text, ',' ORDER BY id)) FROM orders o",
        "SELECT count(*)::text FROM pg_replication_slots WHERE database = current_database()",
        "SELECT count(*)::text FROM pg_publication",
        "SELECT count(*)::text FROM pg_class WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace",
    ] {
        out.push(db.client.query_one(sql, &[]).await.unwrap().get(0));
    }
    out
}

#[tokio::test]
async fn preview_shows_raw_beside_what_the_export_writes_and_changes_nothing() {
    let db = new_database().await;
    setup(&db).await;
    let files = Files::new(RULES);
    let before = fingerprint(&db).await;
    let (code, table, err) = preview(&db, &files, "users", 3, &[]);
    assert_eq!(code, 0, "{err}");
    let (code, json, err2) = preview(&db, &files, "public.users", 3, &["-o", "json"]);
    assert_eq!(code, 0, "{err2}");
    assert_eq!(fingerprint(&db).await, before, "the database is unchanged");
    let raw = raw_values(&db).await;
    assert!(
        hits(format!("{err}{err2}").as_bytes(), &raw).is_empty(),
        "stderr: {err}{err2}"
    );

    let p: Value = serde_json::from_str(&json).unwrap();
    let rows = p["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    for (i, r) in rows.iter().enumerate() {
        let id = 7000000001 + i as i64;
        let (rw, m) = (&r["raw"], &r["masked"]);
        assert_eq!(rw["id"], id, "the first rows by key");
        let email = format!("user{}@acme-corp.com", i + 1);
        assert_eq!(rw["email"], email.as_str());
        assert!(table.contains(&email), "{table}");
        let masked_email = m["email"].as_str().unwrap();
        assert!(
            masked_email != email && masked_email.contains('@'),
            "{masked_email}"
        );
        assert!(table.contains(masked_email), "{table}");
        assert_eq!(m["name"], "REDACTED");
        assert!(
            m.get("ssn").is_none() && rw["ssn"].is_string(),
            "ssn dropped"
        );
        assert!(
            m["phone"].is_null() && rw["phone"].is_string(),
            "undeclared: null"
        );
    }
    assert!(
        table.contains("(dropped)") && table.contains("REDACTED"),
        "{table}"
    );
    assert_eq!(table.matches("\nrow ").count(), 3, "{table}");

    // What the preview shows masked is what a masked export writes, row for row.
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = export_local(
        &db,
        Some(&files),
        "users",
        dir.path().to_str().unwrap(),
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let (_, exported) = rows_of(dir.path()).await;
    for r in rows {
        let m = &r["masked"];
        let row = exported
            .iter()
            .find(|e| e["id"] == m["id"])
            .unwrap_or_else(|| panic!("no exported row with id {}", m["id"]));
        assert_eq!(row, m);
    }
    // Bad input: a table the rules do not name.
    let (code, _, err) = preview(&db, &files, "nosuch", 3, &[]);
    assert_eq!(code, 2, "{err}");
    // A table the catalog says is big is read by TABLESAMPLE, not scanned.
    db.client
        .batch_execute("UPDATE pg_class SET reltuples = 5e7 WHERE oid = 'orders'::regclass")
        .await
        .unwrap();
    let (code, json, err) = preview(&db, &files, "orders", 3, &["-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let p: Value = serde_json::from_str(&json).unwrap();
    let sampling = p["sampling"].as_str().unwrap();
    assert!(
        sampling.contains("rows of TABLESAMPLE SYSTEM ("),
        "{sampling}"
    );
    assert!(p["rows"].as_array().unwrap().len() <= 3);
}

async fn rows_of(dir: &std::path::Path) -> (i64, Vec<Value>) {
    rows(local(dir), "public.users/").await
}

#[tokio::test]
async fn a_continuous_export_reports_the_columns_its_rules_do_not_name() {
    let db = new_database().await;
    setup(&db).await;
    let files = Files::new(RULES);
    let dir = tempfile::tempdir().unwrap();
    let slot = format!("larch_review_{}", db.name);
    let key = "a-dev-seed-key-of-32-bytes-long!";
    let mut child = follow_masked(dir.path(), &files, &slot, key, &db);
    let (addr, _stderr, reader) = listening(&mut child);
    eventually(60, "export readiness", || async move {
        (get(addr, "/health/ready").await.0 == 200).then_some(())
    })
    .await;
    // RULES name every column of users but phone.
    let unreviewed = |s: &Value| -> Vec<String> {
        s["unreviewed_columns"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|c| {
                        format!(
                            "{} {} {}",
                            c["column"].as_str().unwrap(),
                            c["applied"].as_str().unwrap(),
                            c["suggestion"].as_str().unwrap()
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let s = get_json(addr, "/status").await;
    assert_eq!(unreviewed(&s), ["phone null {fake: phone}"], "{s}");
    // The constraint preflight at start (condition `Validated`): the primary key and the NOT
    // NULL columns hold under RULES (an integer hash is a permutation, email is not UNIQUE).
    assert_eq!(s["preflight"]["at_risk"], 0, "{s}");
    assert!(
        s["preflight"]["constraints_checked"].as_u64().unwrap() >= 2,
        "{s}"
    );
    db.client
        .batch_execute(
            "ALTER TABLE users ADD COLUMN contact_email text;
             UPDATE users SET contact_email = 'second' || id || '@acme-corp.com';",
        )
        .await
        .unwrap();
    let body = eventually(60, "the new column reported", || async move {
        let (_, body) = get(addr, "/status").await;
        body.contains("contact_email").then_some(body)
    })
    .await;
    let s: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        unreviewed(&s),
        ["phone null {fake: phone}", "contact_email null hash"],
        "{s}"
    );
    assert!(!body.contains("second7000000001"), "no value on /status");
    // What the operator makes of it (its `UnreviewedColumns` condition's lines).
    let lines = larch::operator::export::observe::parse_unreviewed(&body).unwrap();
    assert!(
        lines.iter().any(|l| l.starts_with("public.users.contact_email (now: null; suggested: hash, its name suggests email addresses")),
        "{lines:?}"
    );
    // A change of the new column after the new epoch's snapshot goes out in a diff.
    eventually(30, "the new epoch", || async move {
        let s = get_json(addr, "/status").await;
        (s["epoch"].as_i64() >= Some(2)).then_some(())
    })
    .await;
    let diffs = get_json(addr, "/status").await["diffs"]
        .as_u64()
        .unwrap_or(0);
    db.client
        .batch_execute(
            "UPDATE users SET contact_email = 'third@acme-corp.com' WHERE id = 7000000010",
        )
        .await
        .unwrap();
    eventually(30, "a diff after the new epoch", || async move {
        let s = get_json(addr, "/status").await;
        (s["diffs"].as_u64() > Some(diffs)).then_some(())
    })
    .await;
    unsafe_kill(child.id(), "TERM");
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let _ = reader.join();
    let (_, after) = rows_of(dir.path()).await;
    assert!(
        after.iter().all(|r| r["contact_email"].is_null()),
        "{:?}",
        after[0]
    );

    // The rules now name both: nothing to review (the operator's condition turns False).
    let covered = Files::new(&RULES.replace(
        "      bio: hash\n",
        "      bio: hash\n      phone: {fake: phone}\n      contact_email: hash\n",
    ));
    let mut child = follow_masked(dir.path(), &covered, &slot, key, &db);
    let (addr, _stderr, reader) = listening(&mut child);
    let body = eventually(
        60,
        "the export streaming under the new rules",
        || async move {
            let (code, body) = get(addr, "/status").await;
            (code == 200 && body.contains("STREAMING")).then_some(body)
        },
    )
    .await;
    assert!(!body.contains("unreviewed_columns"), "{body}");
    assert_eq!(
        larch::operator::export::observe::parse_unreviewed(&body),
        Some(vec![])
    );
    unsafe_kill(child.id(), "TERM");
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let _ = reader.join();
}
