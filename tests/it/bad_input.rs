//! Bad archives: each a clear error naming the problem, never a hang or a partial answer.

use std::sync::Arc;

use larch::archive::format::Format;
use larch::archive::reader::ArchiveReader;
use larch::archive::store::Store;
use larch::archive::store::local::LocalStore;
use larch::archive::store::memory::MemoryStore;

fn manifest_with_snapshot(ext_format: &str, size: usize) -> String {
    format!(
        r#"{{"manifest_version":1,"table":"public.t","epoch":1,"updated_at":"2026-01-01T00:00:00Z","head_position":"0/1",
        "artifacts":[{{"kind":"snapshot","epoch":1,"from_position":null,"to_position":"0/1","created_at":"2026-01-01T00:00:00Z","row_count":1,
        "formats":{{"{ext_format}":{{"uri":"x","size_bytes":{size}}}}}}}]}}"#
    )
}

#[tokio::test]
async fn a_line_over_16_mib_is_refused_with_its_line_number() {
    let store = MemoryStore::new();
    let mut body = String::from("{\"id\":1}\n{\"id\":2,\"x\":\"");
    body.push_str(&"y".repeat(17 << 20));
    body.push_str("\"}\n");
    store.insert_raw("t/epoch=1/snapshot-0_1.jsonl", body.clone());
    store.insert_raw(
        "t/manifest.json",
        manifest_with_snapshot("jsonl", body.len()),
    );
    let reader = ArchiveReader::new(Arc::new(store), "t/", vec![Format::Jsonl]).unwrap();
    let e = reader
        .reconstruct_at(None, &[])
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2") && e.contains("16 MiB"), "{e}");
}

#[tokio::test]
async fn checksums_and_sizes_are_verified() {
    let store = MemoryStore::new();
    store.insert_raw("t/epoch=1/snapshot-0_1.jsonl", "{\"id\":1}\n");
    store.insert_raw("t/manifest.json", manifest_with_snapshot("jsonl", 99));
    let reader = ArchiveReader::new(Arc::new(store.clone()), "t/", vec![Format::Jsonl]).unwrap();
    let e = reader
        .reconstruct_at(None, &[])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("integrity") && e.contains("t/epoch=1/snapshot-0_1.jsonl"),
        "{e}"
    );
    let m = manifest_with_snapshot("jsonl", 9)
        .replace(r#""size_bytes":9"#, r#""size_bytes":9,"sha256":"00""#);
    store.insert_raw("t/manifest.json", m);
    let e = reader
        .reconstruct_at(None, &[])
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("sha256"), "{e}");
}

#[tokio::test]
async fn key_prefixes_escaping_the_root_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path().join("root")).unwrap());
    let e = ArchiveReader::new(store.clone(), "../outside/", vec![Format::Jsonl]).unwrap_err();
    assert!(e.to_string().contains("escapes the store root"), "{e}");
    assert!(store.get("../x").await.is_err());
}

#[tokio::test]
async fn diff_cycles_and_invalid_positions_terminate() {
    let store = MemoryStore::new();
    store.insert_raw("t/epoch=1/snapshot-0_1.jsonl", "{\"id\":1}\n");
    // laredo's follow-mode defect: <nil> positions and a diff whose from == to.
    store.insert_raw(
        "t/epoch=1/diff-0_1-<nil>.jsonl",
        "{\"action\":\"DELETE\",\"key\":\"1\",\"old\":{\"id\":1}}\n",
    );
    store.insert_raw("t/epoch=1/diff-<nil>-<nil>.jsonl", "");
    store.insert_raw(
        "t/manifest.json",
        r#"{"manifest_version":1,"table":"public.t","epoch":1,"updated_at":"2026-01-01T00:00:00Z","head_position":"<nil>",
        "artifacts":[{"kind":"snapshot","epoch":1,"from_position":null,"to_position":"0/1","created_at":"2026-01-01T00:00:00Z","row_count":1,"formats":{"jsonl":{"uri":"x","size_bytes":9}}},
        {"kind":"diff","epoch":1,"from_position":"0/1","to_position":"<nil>","created_at":"2026-01-01T00:00:00Z","change_count":1,"formats":{"jsonl":{"uri":"x","size_bytes":0}}},
        {"kind":"diff","epoch":1,"from_position":"<nil>","to_position":"<nil>","created_at":"2026-01-01T00:00:00Z","formats":{"jsonl":{"uri":"x","size_bytes":0}}}]}"#,
    );
    let reader = ArchiveReader::new(Arc::new(store), "t/", vec![Format::Jsonl]).unwrap();
    let (_, folded) = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        reader.reconstruct_at(None, &[]),
    )
    .await
    .expect("no hang")
    .unwrap();
    assert_eq!(
        folded.position, "0/1",
        "the walk stops before the broken link"
    );
    assert_eq!(folded.rows.len(), 1);
    let (_, report) = larch::archive::verify::verify(&reader).await.unwrap();
    assert!(
        report.problems.iter().any(|p| p.contains("broken link")),
        "{:?}",
        report.problems
    );
}

/// Issue 14 item 4: symbolic links inside a local store that lead outside its root are refused
/// for reads and writes alike (a linked snapshot is not read, a linked prefix directory is not
/// written through); links that stay inside the root work.
#[tokio::test]
async fn symlinks_out_of_a_local_store_are_refused_for_reads_and_writes() {
    use larch::archive::model::Action;
    use larch::archive::writer::{ArchiveWriter, WriterConfig};
    use std::os::unix::fs::symlink;

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(&root).unwrap());
    let config = || {
        let mut c = WriterConfig::new("public.t", "t/");
        c.snapshot_formats = vec![Format::Jsonl];
        c.diff_formats = vec![Format::Jsonl];
        c
    };
    let mut w = ArchiveWriter::open(vec![store.clone()], config())
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(larch::archive::value::Row::parse(r#"{"id":1}"#).unwrap())
        .await
        .unwrap();
    drop(tx);
    w.write_snapshot("0/1", rx).await.unwrap();

    // Read: the snapshot replaced by a link to a file outside the root.
    let snapshot = root.join("t/epoch=1/snapshot-0_1.jsonl");
    std::fs::rename(&snapshot, outside.join("secret.jsonl")).unwrap();
    symlink(outside.join("secret.jsonl"), &snapshot).unwrap();
    let reader = ArchiveReader::new(store.clone(), "t/", vec![Format::Jsonl]).unwrap();
    let e = reader
        .reconstruct_at(None, &[])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("t/epoch=1/snapshot-0_1.jsonl")
            && e.contains("outside the store root through the symbolic link")
            && e.contains("secret.jsonl"),
        "{e}"
    );
    // The listing does not report it as an object either.
    let listed: Vec<String> = store
        .list("t/")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(listed, ["t/manifest.json"]);

    // Write: the epoch directory replaced by a link to a directory outside the root.
    let epoch = root.join("t/epoch=1");
    std::fs::remove_file(&snapshot).unwrap();
    std::fs::remove_dir(&epoch).unwrap();
    symlink(&outside, &epoch).unwrap();
    w.record(
        Action::Insert,
        None,
        Some(larch::archive::value::Row::parse(r#"{"id":2}"#).unwrap()),
    )
    .unwrap();
    let e = w.flush("0/2").await.unwrap_err().to_string();
    assert!(
        e.contains("t/epoch=1/diff-0_1-0_2.jsonl") && e.contains("symbolic link"),
        "{e}"
    );
    let written: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        written,
        [std::ffi::OsString::from("secret.jsonl")],
        "nothing written outside"
    );
    assert_eq!(w.head(), "0/1", "nothing committed");

    // A link that stays inside the root is followed.
    std::fs::remove_file(&epoch).unwrap();
    std::fs::create_dir_all(root.join("elsewhere")).unwrap();
    std::fs::copy(
        outside.join("secret.jsonl"),
        root.join("elsewhere/snapshot-0_1.jsonl"),
    )
    .unwrap();
    symlink(root.join("elsewhere"), &epoch).unwrap();
    let (_, folded) = reader.reconstruct_at(None, &[]).await.unwrap();
    assert_eq!(folded.rows.len(), 1);
}
