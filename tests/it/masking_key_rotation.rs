//! A new transform key starts an epoch of new-key hashes only, and engines re-baseline
//! (helpers: tests/it/masking.rs).

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use crate::engine_support::{eventually, get, get_json};
use crate::masking::*;
use crate::postgres_continuous::{listening, unsafe_kill};
use crate::support::postgres::new_database;

/// The hashed values (ids, emails, tokens, bios) of a one-shot masked export of users.
async fn hashed_values(dir: &Path) -> BTreeSet<String> {
    let (_, users) = rows(local(dir), "public.users/").await;
    let mut out = BTreeSet::new();
    for u in &users {
        out.insert(u["id"].to_string());
        for c in ["email", "token"] {
            if let Some(s) = u[c].as_str() {
                out.insert(s.to_string());
            }
        }
    }
    out
}

/// Every object of the epochs from `first` on (`public.users/epoch=N/…`).
fn epoch_objects(dir: &Path, first: i64) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir.join("public.users")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let Some(n) = name
            .strip_prefix("epoch=")
            .and_then(|n| n.parse::<i64>().ok())
        else {
            continue;
        };
        if n >= first {
            for f in std::fs::read_dir(&p).unwrap() {
                let f = f.unwrap().path();
                out.push((f.clone(), std::fs::read(&f).unwrap()));
            }
        }
    }
    out
}

#[tokio::test]
async fn a_key_rotation_starts_an_epoch_of_new_key_hashes_only_and_engines_rebaseline() {
    const KEY_A: &str = "a-dev-seed-key-of-32-bytes-long!"; // the key of Files
    const KEY_B: &str = "the-rotated-key-b-of-32-bytes!!!";
    let db = new_database().await;
    setup(&db).await;
    let files = Files::new(RULES);
    let dir = tempfile::tempdir().unwrap();
    let slot = format!("larch_rotate_{}", db.name);
    let follow = |key: &str| follow_masked(dir.path(), &files, &slot, key, &db);
    let epoch_at_least = |addr: std::net::SocketAddr, n: i64| async move {
        eventually(60, &format!("epoch {n}"), || async move {
            (get_json(addr, "/status").await["epoch"].as_i64() >= Some(n)).then_some(())
        })
        .await
    };

    // Key A: the first epoch, and an engine following it.
    let mut a = follow(KEY_A);
    let (addr, _, reader) = listening(&mut a);
    epoch_at_least(addr, 1).await;
    let engine = crate::engine_support::start_engine(&format!(
        r#"
sources:
  seed:
    type: archive
    store: {{type: local, path: "{}"}}
    key_prefix: public.users/
    follow: true
    poll_interval: 100ms
    require_transformed: true
tables:
  - source: seed
    schema: public
    table: users
    targets:
      - type: memory
"#,
        dir.path().display()
    ))
    .await;
    crate::engine_support::wait_ready(engine.addr).await;
    let rebaselines = |addr: std::net::SocketAddr| async move {
        let (_, m) = get(addr, "/metrics").await;
        crate::engine_support::metric(&m, r#"laredo_source_rebaseline_total{source="seed"}"#)
            .unwrap_or(0.0)
    };
    let before = rebaselines(engine.addr).await;
    unsafe_kill(a.id(), "TERM");
    assert_eq!(a.wait().unwrap().code(), Some(0));
    let _ = reader.join();

    // Key B: a new epoch from a fresh snapshot, and a change after it (a diff of epoch 2).
    let mut b = follow(KEY_B);
    let (addr, _, reader) = listening(&mut b);
    epoch_at_least(addr, 2).await;
    db.client
        .batch_execute("UPDATE users SET email = 'rotated@acme-corp.com' WHERE id = 7000000009;")
        .await
        .unwrap();
    eventually(30, "a diff of the new epoch", || async move {
        (get_json(addr, "/status").await["diffs"]
            .as_u64()
            .unwrap_or(0)
            >= 1)
            .then_some(())
    })
    .await;
    unsafe_kill(b.id(), "TERM");
    assert_eq!(b.wait().unwrap().code(), Some(0));
    let _ = reader.join();

    // What each key makes of the rows: one-shot exports under A and under B.
    let (under_a, under_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (code, err) = export_local(
        &db,
        Some(&files),
        "users",
        under_a.path().to_str().unwrap(),
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let b_files = Files::new(RULES);
    std::fs::write(b_files.key(), KEY_B).unwrap();
    let (code, err) = export_local(
        &db,
        Some(&b_files),
        "users",
        under_b.path().to_str().unwrap(),
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let a_hashes = hashed_values(under_a.path()).await;
    let b_hashes = hashed_values(under_b.path()).await;
    assert!(a_hashes.len() >= 2 * USERS as usize && a_hashes.is_disjoint(&b_hashes));

    // The new epoch holds key-B hashes only: not one key-A hash in any of its objects.
    let objects = epoch_objects(dir.path(), 2);
    assert!(
        objects.len() >= 2,
        "a snapshot and a diff of epoch 2: {objects:?}",
        objects = objects.iter().map(|o| &o.0).collect::<Vec<_>>()
    );
    let b_sample = b_hashes.iter().find(|h| h.contains('@')).unwrap().clone();
    let mut saw_b = false;
    for (path, bytes) in &objects {
        let found: Vec<&str> = a_hashes
            .iter()
            .filter(|h| String::from_utf8_lossy(bytes).contains(h.as_str()))
            .map(String::as_str)
            .take(3)
            .collect();
        assert!(
            found.is_empty(),
            "{} holds key-A hashes {found:?}",
            path.display()
        );
        saw_b |= String::from_utf8_lossy(bytes).contains(&b_sample);
    }
    assert!(
        saw_b
            || objects
                .iter()
                .all(|(p, _)| p.extension().is_some_and(|e| e == "pb"))
    );
    let (epoch, archived) = rows(local(dir.path()), "public.users/").await;
    assert_eq!(epoch, 2);
    let ids = |rows: &[Value]| -> BTreeSet<i64> {
        rows.iter().map(|r| r["id"].as_i64().unwrap()).collect()
    };
    let (_, want) = rows(local(under_b.path()), "public.users/").await;
    assert_eq!(
        ids(&archived),
        ids(&want),
        "the archive's identities are key B's"
    );
    let m: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("public.users/manifest.json")).unwrap(),
    )
    .unwrap();
    let b_id = larch::export::transform::TransformKey::from_bytes(KEY_B.as_bytes(), "b")
        .unwrap()
        .id()
        .to_string();
    assert_eq!(m["transform"]["key_id"], b_id.as_str());

    // The engine re-baselined onto the new epoch: its rows are key B's.
    eventually(60, "the engine's re-baseline", || async {
        (rebaselines(engine.addr).await > before).then_some(())
    })
    .await;
    let served = eventually(30, "the engine serving key B's rows", || async {
        let rows = crate::engine_support::all_rows(engine.addr, "public.users", 1000).await;
        (ids(&rows) == ids(&want)).then_some(rows)
    })
    .await;
    assert_eq!(served.len() as i64, USERS);

    // An archive of hash version 1 (its manifest records no `transform.hash`): the same key
    // permutes integers differently now, so the export starts a new epoch instead of mixing
    // the two versions in one.
    let manifest_path = dir.path().join("public.users/manifest.json");
    let manifest = || -> Value {
        serde_json::from_str(&std::fs::read_to_string(&manifest_path).unwrap()).unwrap()
    };
    let mut m = manifest();
    assert_eq!(
        m["transform"]["hash"],
        larch::export::transform::HASH_ALGORITHM
    );
    m["transform"].as_object_mut().unwrap().remove("hash");
    std::fs::write(&manifest_path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    let mut c = follow(KEY_B);
    let (addr, log, reader) = listening(&mut c);
    epoch_at_least(addr, 3).await;
    unsafe_kill(c.id(), "TERM");
    assert_eq!(c.wait().unwrap().code(), Some(0));
    let _ = reader.join();
    let log = log.lock().unwrap().join("\n");
    assert!(log.contains("the hash algorithm changed"), "{log}");
    assert_eq!(
        manifest()["transform"]["hash"],
        larch::export::transform::HASH_ALGORITHM
    );
}
