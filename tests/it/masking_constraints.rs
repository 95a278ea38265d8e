//! Unique-preserving masking (`permute`) and the constraint preflight (`larch export
//! --check`) against a real PostgreSQL 15: a schema with PRIMARY KEY, UNIQUE, CHECK, FOREIGN
//! KEY and NOT NULL constraints on text, email, uuid, numeric-string and integer keys; its
//! masked export restores into a fresh database with every constraint enabled, and `--check`
//! flags each kind of rule that would break one (helpers: tests/it/masking.rs).

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use crate::masking::{Files, larch, unique_slot};
use crate::support::postgres::{Database, new_database};

const ACCOUNTS: i64 = 500;

const SCHEMA: &str = "
CREATE TABLE accounts (
  id int8 PRIMARY KEY,
  handle text NOT NULL UNIQUE CHECK (handle ~ '^[a-z]+$'),
  email text NOT NULL UNIQUE CHECK (email ~ '^[a-z0-9.]+@[a-z0-9-]+(\\.[a-z0-9-]+)+$'),
  ext_id uuid NOT NULL UNIQUE,
  account_no varchar(12) NOT NULL UNIQUE CHECK (account_no ~ '^[0-9]{12}$'),
  nickname varchar(40) CHECK (nickname ~ '^[a-z]+$'),
  balance int4 NOT NULL CHECK (balance >= 0)
);
CREATE TABLE transfers (
  id int4 PRIMARY KEY,
  account_id int8 NOT NULL REFERENCES accounts (id),
  account_email text REFERENCES accounts (email),
  account_ext uuid NOT NULL REFERENCES accounts (ext_id),
  account_no varchar(12) REFERENCES accounts (account_no),
  memo text NOT NULL,
  UNIQUE (account_id, id)
);";

/// Two-letter handles (676 possible: a `hash` of 500 of them collides), emails of two
/// domains, uuids, 12-digit account numbers.
const DATA: &str = "
INSERT INTO accounts
  SELECT 9000000000 + g, chr(97 + (g / 26) % 26) || chr(97 + g % 26),
         'user.' || g || '@' || CASE WHEN g % 2 = 0 THEN 'acme-corp.com' ELSE 'mail.example.org' END,
         md5('ext' || g)::uuid, lpad((g * 7919)::text, 12, '0'),
         'nick' || chr(97 + g % 26), g * 10
  FROM generate_series(1, 500) g;
INSERT INTO transfers
  SELECT g, a.id, a.email, a.ext_id, a.account_no, 'memo ' || g
  FROM generate_series(1, 1500) g JOIN accounts a ON a.id = 9000000000 + 1 + g % 500;";

const GOOD: &str = "
tables:
  public.accounts:
    undeclared: keep
    columns: {id: permute, handle: permute, email: permute, ext_id: permute,
              account_no: permute, nickname: permute}
  public.transfers:
    undeclared: keep
    columns: {id: hash, account_id: hash, account_email: permute, account_ext: permute,
              account_no: permute, memo: {redact: memo}}
";

async fn schema_with_rows() -> Database {
    let db = new_database().await;
    db.client
        .batch_execute(&format!("{SCHEMA}{DATA}"))
        .await
        .unwrap();
    db
}

fn check(db: &Database, rules: &str) -> (i32, Value, String) {
    let files = Files::new(rules);
    let out = larch()
        .args([
            "export",
            "--check",
            "--table",
            "accounts",
            "--table",
            "transfers",
        ])
        .arg("--transform")
        .arg(files.rules())
        .arg("--transform-key-file")
        .arg(files.key())
        .env("LARCH_PG_DSN", &db.dsn)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (
        out.status.code().unwrap_or(-1),
        report,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn export(db: &Database, rules: &str, dir: &Path) {
    let files = Files::new(rules);
    let out = larch()
        .args(["export", "--table", "accounts", "--table", "transfers"])
        .args(["--slot", &unique_slot("larch_masking_constraints")])
        .args(["--store", "local", "--path"])
        .arg(dir)
        .arg("--transform")
        .arg(files.rules())
        .arg("--transform-key-file")
        .arg(files.key())
        .env("LARCH_PG_DSN", &db.dsn)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh database with the schema and every constraint, and no row.
async fn empty_target() -> Database {
    let target = new_database().await;
    target.client.batch_execute(SCHEMA).await.unwrap();
    target
}

fn restore(target: &Database, dir: &Path) -> std::process::Output {
    larch()
        .args(["restore", "--store", "local", "--path"])
        .arg(dir)
        .args(["--table", "public.accounts,public.transfers"])
        .args(["--if-exists", "replace"])
        .env("LARCH_PG_DSN", &target.dsn)
        .env("LARCH_LOG", "warn")
        .output()
        .unwrap()
}

async fn strings(db: &Database, sql: &str) -> BTreeSet<String> {
    db.client
        .query(sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test]
async fn a_permuted_export_restores_with_every_constraint_and_the_check_passes_it() {
    let db = schema_with_rows().await;
    let (code, report, err) = check(&db, GOOD);
    assert_eq!(code, 0, "{report}\n{err}");
    assert_eq!(report["problems"], serde_json::json!([]), "{err}");
    // 7 + 5 NOT NULL columns, 5 + 5 constraints and indexes... at least one of each kind.
    assert!(
        report["constraints_checked"].as_u64().unwrap() >= 20,
        "{report}"
    );
    assert!(err.contains("the transform breaks none"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    export(&db, GOOD, dir.path());
    let target = empty_target().await;
    let out = restore(&target, dir.path());
    assert!(
        out.status.success(),
        "restore into a database with every constraint: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let count = |sql: &'static str| {
        let (db, target) = (&db, &target);
        async move {
            let a: i64 = db.client.query_one(sql, &[]).await.unwrap().get(0);
            let b: i64 = target.client.query_one(sql, &[]).await.unwrap().get(0);
            (a, b)
        }
    };
    assert_eq!(
        count("SELECT count(*) FROM accounts").await,
        (ACCOUNTS, ACCOUNTS)
    );
    // Every transfer joins its account on each of the four foreign keys, as in the source.
    let joined = "SELECT count(*) FROM transfers t JOIN accounts a ON a.id = t.account_id
                    AND a.email = t.account_email AND a.ext_id = t.account_ext
                    AND a.account_no = t.account_no";
    assert_eq!(count(joined).await, (1500, 1500));
    // Masked: no raw key survives, and the formats hold.
    for column in ["handle", "email", "ext_id::text", "account_no", "id::text"] {
        let sql = format!("SELECT {column} FROM accounts");
        let (raw, masked) = (strings(&db, &sql).await, strings(&target, &sql).await);
        assert_eq!(masked.len() as i64, ACCOUNTS, "{column} stays unique");
        // Two-letter handles: 500 of the 676 there are, raw and masked alike, so they meet.
        if column != "handle" {
            assert!(
                raw.is_disjoint(&masked),
                "{column}: raw values in the restore"
            );
        }
    }
    let domains = strings(&target, "SELECT split_part(email, '@', 2) FROM accounts").await;
    assert_eq!(domains.len(), 2, "one domain stays one domain: {domains:?}");
    let m: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("public.accounts/manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(m["transform"]["permute"], "larch-permute-1");
    assert_eq!(m["transform"]["columns"]["email"], "permute");
    let out = larch()
        .args(["archive", "inspect", "--table", "accounts", "--path"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("permuted columns: larch-permute-1"), "{text}");
}

#[tokio::test]
async fn the_check_flags_each_kind_of_broken_constraint_and_a_hashed_unique_key_fails_restore() {
    let db = schema_with_rows().await;
    let bad = GOOD
        .replace("handle: permute", "handle: hash")
        .replace("email: permute, ext_id", "email: {fake: email}, ext_id")
        .replace(
            "account_no: permute, nickname: permute",
            "account_no: {redact: '000000000000'}, nickname: {fake: first_name}",
        )
        .replace("account_email: permute", "account_email: hash")
        .replace("account_ext: permute", "account_ext: keep")
        .replace("memo: {redact: memo}", "memo: null");
    let (code, report, err) = check(&db, &bad);
    assert_eq!(code, 1, "{report}\n{err}");
    let found: BTreeSet<(String, String, String)> = report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["table"].as_str().unwrap().to_string(),
                p["constraint"].as_str().unwrap().to_string(),
                p["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want = |t: &str, c: &str, k: &str| (format!("public.{t}"), c.to_string(), k.to_string());
    for w in [
        want("accounts", "accounts_handle_key", "UNIQUE"),
        want("accounts", "accounts_email_key", "UNIQUE"),
        want("accounts", "accounts_account_no_key", "UNIQUE"),
        want("accounts", "accounts_nickname_check", "CHECK"),
        want("transfers", "transfers_account_email_fkey", "FOREIGN KEY"),
        want("transfers", "transfers_account_ext_fkey", "FOREIGN KEY"),
        want("transfers", "transfers_account_no_fkey", "FOREIGN KEY"),
        want("transfers", "NOT NULL", "NOT NULL"),
    ] {
        assert!(found.contains(&w), "{w:?} not flagged: {report:#}");
    }
    // Nothing else: the integer keys (hash and permute are one permutation), the uuid, the
    // email CHECK (a fake email is lowercase) and the balance CHECK (kept) are fine.
    assert_eq!(found.len(), 8, "{report:#}");
    for needle in [
        "hash on text is not unique",
        "fake email draws from a fixed list",
        "redact: every value the same constant",
        "sampled rows fail it once transformed",
        "(hash text) and public.accounts.\"email\" (fake:email text)",
        "null on a NOT NULL column",
    ] {
        assert!(err.contains(needle), "{needle:?} not in\n{err}");
    }
    assert!(
        err.contains("accounts_handle_key") && err.contains("handle"),
        "{err}"
    );

    // Bad input: a table the rules do not name, no --transform.
    let (code, _, err) = check(&db, "tables:\n  public.accounts: {undeclared: keep}\n");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no entry for table public.transfers"), "{err}");

    // The check was right: a hashed two-letter UNIQUE handle collides, and the restore into a
    // database with the constraint fails (the unique violation, without its values).
    let hashed = GOOD.replace("handle: permute", "handle: hash");
    let (code, report, err) = check(&db, &hashed);
    assert_eq!(code, 1, "{report}\n{err}");
    let dir = tempfile::tempdir().unwrap();
    export(&db, &hashed, dir.path());
    let out = restore(&empty_target().await, dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("23505"), "{err}");
}

/// `larch export` of accounts (and transfers) with `extra` flags and a summary file: the exit
/// status, the summary (or termination message) and stderr.
fn export_with_summary(
    db: &Database,
    rules: &str,
    dir: &Path,
    tables: &[&str],
    extra: &[&str],
) -> (i32, Value, String) {
    let files = Files::new(rules);
    let summary = dir.join("summary.json");
    let mut cmd = larch();
    cmd.arg("export");
    for t in tables {
        cmd.args(["--table", t]);
    }
    let out = cmd
        .args(["--slot", &unique_slot("larch_validated")])
        .args(["--store", "local", "--path"])
        .arg(dir.join("archive"))
        .arg("--transform")
        .arg(files.rules())
        .arg("--transform-key-file")
        .arg(files.key())
        .arg("--summary-file")
        .arg(&summary)
        .args(extra)
        .env("LARCH_PG_DSN", &db.dsn)
        .output()
        .unwrap();
    let summary = std::fs::read(&summary)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().unwrap_or(-1), summary, stderr)
}

/// Every export with a transform runs the preflight at start: `--require-validated` refuses a
/// rule that breaks a UNIQUE column (exit 2, reason ConstraintsAtRisk, the constraint named,
/// nothing written, no slot left); without it the export goes on and its summary carries the
/// findings (names only), as the operator reads them into condition `Validated`.
#[tokio::test]
async fn require_validated_refuses_a_unique_column_at_risk_and_the_summary_carries_the_findings() {
    let db = schema_with_rows().await;
    let hashed = GOOD.replace("handle: permute", "handle: hash");
    let both = ["accounts", "transfers"];
    let refused = tempfile::tempdir().unwrap();
    let (code, termination, err) = export_with_summary(
        &db,
        &hashed,
        refused.path(),
        &both,
        &["--require-validated"],
    );
    assert_eq!(code, 2, "{termination}\n{err}");
    assert_eq!(termination["reason"], "ConstraintsAtRisk", "{termination}");
    let why = termination["error"].as_str().unwrap();
    for needle in [
        "the transform can break 1 of the",
        "public.accounts.accounts_handle_key (UNIQUE): column \"handle\": hash on text is not unique",
        "nothing was exported",
    ] {
        assert!(why.contains(needle), "{needle:?} not in {why}");
    }
    assert!(err.contains("accounts_handle_key"), "{err}");
    // Names only: no handle, email or account number of a row.
    let raw = strings(&db, "SELECT handle || ' ' || email FROM accounts").await;
    for value in raw
        .iter()
        .flat_map(|r| r.split(' '))
        .filter(|v| v.len() > 2)
    {
        assert!(!why.contains(value), "{value:?} quoted in {why}");
    }
    assert!(
        !refused.path().join("archive").exists(),
        "nothing written: {:?}",
        std::fs::read_dir(refused.path())
            .unwrap()
            .collect::<Vec<_>>()
    );
    let slots: i64 = db
        .client
        .query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'larch_validated%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(slots, 0, "no slot was created");

    // Without it: exported, the findings in the summary (one table's and a set's).
    let single = tempfile::tempdir().unwrap();
    let (code, summary, err) = export_with_summary(&db, &hashed, single.path(), &both[..1], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(summary["row_count"], ACCOUNTS, "{summary}");
    let p = &summary["preflight"];
    assert_eq!(p["at_risk"], 1, "{summary}");
    assert!(
        p["constraints_checked"].as_u64().unwrap() >= 10,
        "{summary}"
    );
    assert_eq!(
        p["problems"][0],
        "public.accounts.accounts_handle_key (UNIQUE): column \"handle\": hash on text is not unique: two values can hash alike (use permute)",
        "{summary}"
    );
    assert!(
        single
            .path()
            .join("archive/public.accounts/manifest.json")
            .exists()
    );

    // The good rules pass a required preflight; a set's summary carries it once.
    let set = tempfile::tempdir().unwrap();
    let (code, summary, err) =
        export_with_summary(&db, GOOD, set.path(), &both, &["--require-validated"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        summary["tables"].as_array().map(Vec::len),
        Some(2),
        "{summary}"
    );
    assert_eq!(summary["preflight"]["at_risk"], 0, "{summary}");
    assert!(summary["preflight"].get("problems").is_none(), "{summary}");
    assert!(
        summary["preflight"]["constraints_checked"]
            .as_u64()
            .unwrap()
            >= 20,
        "{summary}"
    );

    // Without a transform there is nothing to require.
    let out = larch()
        .args(["export", "--table", "accounts", "--require-validated"])
        .args(["--store", "local", "--path"])
        .arg(set.path().join("plain"))
        .env("LARCH_PG_DSN", &db.dsn)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--require-validated needs --transform"),
        "{err}"
    );
}
