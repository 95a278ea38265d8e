//! Subsets of masked exports (`where:`, `sample:`) against a real PostgreSQL 15 (helpers:
//! tests/it/masking.rs).

use std::collections::BTreeSet;

use serde_json::Value;

use crate::masking::*;
use crate::support::postgres::new_database;

#[tokio::test]
async fn subsets_export_the_rows_of_the_predicate_and_a_stable_consistent_sample() {
    let db = new_database().await;
    setup(&db).await;
    let predicate = "id % 3 = 0 AND email LIKE 'user%'";
    let want: i64 = db
        .client
        .query_one(
            &format!("SELECT count(*) FROM users WHERE {predicate}"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(want > 0 && want < USERS);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let (code, err) = export_local(&db, None, "users", path, &["--where", predicate]);
    assert_eq!(code, 0, "{err}");
    let (_, filtered) = rows(local(dir.path()), "public.users/").await;
    assert_eq!(filtered.len() as i64, want);
    assert!(filtered.iter().all(|u| u["id"].as_i64().unwrap() % 3 == 0));
    let m: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("public.users/manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(m["subset"]["where"], predicate);
    let out = larch()
        .args(["archive", "inspect", "--table", "users", "--path", path])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("subset:       where {predicate}")),
        "{text}"
    );

    // A masked sample: users by id, orders by user_id, with the rules' `sample:`; the same
    // rows twice, and every order kept belongs to a user kept (hashed alike).
    let rules = RULES.replace(
        "  public.orders:\n",
        "    sample: {percent: 30}\n  public.orders:\n    sample: {percent: 30, by: user_id}\n",
    );
    let files = Files::new(&rules);
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for dir in [&a, &b] {
        for table in ["users", "orders"] {
            let (code, err) =
                export_local(&db, Some(&files), table, dir.path().to_str().unwrap(), &[]);
            assert_eq!(code, 0, "{table}: {err}");
        }
    }
    let (_, users_a) = rows(local(a.path()), "public.users/").await;
    let (_, orders_a) = rows(local(a.path()), "public.orders/").await;
    let (_, users_b) = rows(local(b.path()), "public.users/").await;
    let (_, orders_b) = rows(local(b.path()), "public.orders/").await;
    let ids = |rows: &[Value]| -> BTreeSet<i64> {
        rows.iter().map(|r| r["id"].as_i64().unwrap()).collect()
    };
    assert_eq!(
        ids(&users_a),
        ids(&users_b),
        "the sample is stable across runs"
    );
    assert_eq!(ids(&orders_a), ids(&orders_b));
    let n = users_a.len() as i64;
    assert!(
        (USERS * 15 / 100..=USERS * 45 / 100).contains(&n),
        "{n} of {USERS} at 30 %"
    );
    assert!(!orders_a.is_empty());
    assert_eq!(
        joined(&users_a, &orders_a),
        orders_a.len(),
        "every order's user is in the sample"
    );
    // Each kept user keeps all its orders (3 per user in the fixture).
    assert_eq!(orders_a.len() as i64, n * ORDERS / USERS);
    let m: Value = serde_json::from_str(
        &std::fs::read_to_string(a.path().join("public.orders/manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(m["subset"]["sample_percent"], 30.0);
    assert_eq!(m["subset"]["sample_by"], serde_json::json!(["user_id"]));
}

#[tokio::test]
async fn bad_subsets_are_clear_errors_and_export_nothing() {
    let db = new_database().await;
    setup(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    for (args, want) in [
        (
            vec!["--where", "nosuch > 1"],
            "the row filter of table public.users (where: nosuch > 1): column \"nosuch\" does not exist",
        ),
        (
            vec!["--where", "id > 1; DROP TABLE users"],
            "not valid SQL: syntax error at or near \";\"",
        ),
        (
            vec!["--where", "true) TO PROGRAM 'true' --"],
            "comments (`--`, `/* */`) are not allowed in a row filter",
        ),
        (vec!["--sample", "0"], "percent 0 is not in (0, 100]"),
        (
            vec!["--sample", "10", "--sample-by", "nosuch"],
            "column \"nosuch\" (by) does not exist",
        ),
        (
            vec!["--where", "id > 1", "--follow", "--listen", "127.0.0.1:0"],
            "applies to a one-shot export only",
        ),
    ] {
        let (code, err) = export_local(&db, None, "users", path, &args);
        assert_ne!(code, 0, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "{args:?}: nothing written"
        );
    }
    let users: i64 = db
        .client
        .query_one("SELECT count(*) FROM users", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(users, USERS, "the table is untouched");
}
