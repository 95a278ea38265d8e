//! The `fake` transform against a real PostgreSQL 15: realistic, stable values and no raw value
//! left (helpers: tests/it/masking.rs).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::masking::*;
use crate::support::postgres::new_database;

const FAKE_RULES: &str = r#"
tables:
  public.users:
    undeclared: null
    columns:
      id: hash
      email: {fake: email}
      name: {fake: full_name}
      phone: {fake: phone}
      ssn: drop
      token: hash
      bio: {fake: street_address}
"#;

#[tokio::test]
async fn fake_values_are_realistic_stable_and_leave_no_raw_value() {
    let db = new_database().await;
    setup(&db).await;
    let files = Files::new(FAKE_RULES);
    let raw = raw_values(&db).await;
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for dir in [&a, &b] {
        let (code, err) = export_local(
            &db,
            Some(&files),
            "users",
            dir.path().to_str().unwrap(),
            &[],
        );
        assert_eq!(code, 0, "{err}");
        assert!(hits(err.as_bytes(), &raw).is_empty(), "stderr: {err}");
        assert!(scan_dir(dir.path(), &raw) >= 2, "a manifest and a snapshot");
    }
    let (_, mut first) = rows(local(a.path()), "public.users/").await;
    let (_, mut second) = rows(local(b.path()), "public.users/").await;
    for r in [&mut first, &mut second] {
        r.sort_by_key(|u| u["id"].as_i64());
    }
    assert_eq!(first.len() as i64, USERS);
    assert!(first == second, "two runs with one key give the same fakes");
    let mut names = BTreeMap::<String, usize>::new();
    for u in &first {
        let email = u["email"].as_str().unwrap();
        let (local_part, domain) = email.split_once('@').expect("an email");
        assert!(
            !local_part.is_empty() && domain.starts_with("example."),
            "{email}"
        );
        let name = u["name"].as_str().unwrap();
        assert!(
            name.len() <= 40 && name.split(' ').count() == 2,
            "varchar(40): {name}"
        );
        *names.entry(name.to_string()).or_default() += 1;
        let phone = u["phone"].as_str().unwrap();
        assert!(
            phone.starts_with("+1 ") && phone.contains("-555-01"),
            "{phone}"
        );
    }
    assert!(
        names.len() > 100,
        "{} distinct names of {USERS}",
        names.len()
    );
    let bio = first.iter().find_map(|u| u["bio"].as_str()).unwrap();
    assert!(
        bio.split(' ').count() >= 3 && !bio.contains("secretbio"),
        "{bio}"
    );
    let m: Value = serde_json::from_str(
        &std::fs::read_to_string(a.path().join("public.users/manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(m["transform"]["columns"]["email"], "fake:email");
    assert_eq!(m["transform"]["columns"]["bio"], "fake:street_address");
}
