//! One conformance suite for every `Store`: in-memory, local filesystem, and S3 on a real
//! SeaweedFS. Each check writes under its own key prefix, so checks do not see each other.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::future::join_all;
use larch::archive::ArchiveError;
use larch::archive::store::local::LocalStore;
use larch::archive::store::memory::MemoryStore;
use larch::archive::store::s3::PART_SIZE;
use larch::archive::store::{Store, sha256_hex};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use crate::support::seaweedfs;

const MIB: usize = 1024 * 1024;

/// What the suite needs to know about the store under test.
struct Ctx {
    name: &'static str,
    /// The local store's root, to look for stray files.
    local_root: Option<PathBuf>,
}

/// Deterministic, incompressible test data (xorshift), different per seed.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn is_conflict(r: &Result<String, ArchiveError>) -> bool {
    matches!(r, Err(ArchiveError::CasConflict { .. }))
}

/// Writes `data` through `create` in chunks of `chunk` bytes.
async fn write_chunked(
    store: &dyn Store,
    key: &str,
    data: &[u8],
    chunk: usize,
) -> larch::archive::store::PutResult {
    let mut w = store.create(key).await.expect("create");
    for c in data.chunks(chunk) {
        w.write(c).await.expect("write");
    }
    w.finish()
        .await
        .unwrap_or_else(|e| panic!("finish {key}: {e}"))
}

async fn keys_under(store: &dyn Store, prefix: &str) -> Vec<String> {
    store
        .list(prefix)
        .await
        .unwrap_or_else(|e| panic!("list {prefix}: {e}"))
        .into_iter()
        .map(|o| o.key)
        .collect()
}

async fn put_returns_uri_size_and_sha256(store: &dyn Store, ctx: &Ctx) {
    let key = "put/table/snapshot-1.jsonl";
    let data = b"{\"id\":1}\n{\"id\":2}\n";
    let r = store.put(key, data).await.expect("put");
    assert_eq!(r.uri, store.uri(key), "{}", ctx.name);
    assert_eq!(r.size, data.len() as u64, "{}", ctx.name);
    assert_eq!(r.sha256, sha256_hex(data), "{}", ctx.name);
    // sha256_hex is the standard digest, not something self-consistent only.
    assert_eq!(
        sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );

    let empty = store.put("put/empty", b"").await.expect("put empty");
    assert_eq!(empty.size, 0, "{}", ctx.name);
    assert_eq!(empty.sha256, sha256_hex(b""), "{}", ctx.name);
    let got = store.get("put/empty").await.unwrap().expect("empty object");
    assert!(got.bytes.is_empty(), "{}", ctx.name);
}

async fn missing_keys_read_as_none(store: &dyn Store, ctx: &Ctx) {
    assert!(
        store.get("missing/nothing").await.unwrap().is_none(),
        "{}",
        ctx.name
    );
    assert!(
        store.open("missing/nothing").await.unwrap().is_none(),
        "{}",
        ctx.name
    );
    assert!(
        keys_under(store, "missing/").await.is_empty(),
        "{}",
        ctx.name
    );
}

/// `head` answers what a listing answers for one key: size and the store's time; `None` for a
/// missing key or a "directory".
async fn head_reports_size_and_store_time(store: &dyn Store, ctx: &Ctx) {
    let before = chrono::Utc::now() - chrono::Duration::seconds(2);
    store.put("head/dir/obj", &pattern(777, 3)).await.unwrap();
    let h = store.head("head/dir/obj").await.unwrap().expect("present");
    assert_eq!(
        (h.key.as_str(), h.size),
        ("head/dir/obj", 777),
        "{}",
        ctx.name
    );
    let listed = store.list("head/dir/obj").await.unwrap();
    assert_eq!(listed, vec![h.clone()], "{}", ctx.name);
    assert!(
        h.modified.is_some_and(|m| m > before),
        "{}: {h:?}",
        ctx.name
    );
    for missing in ["head/dir/none", "head/dir", "head/dir/ob"] {
        assert!(
            store.head(missing).await.unwrap().is_none(),
            "{}: {missing}",
            ctx.name
        );
    }
    assert!(store.head("../escape").await.is_err(), "{}", ctx.name);
}

async fn get_returns_data_and_revision(store: &dyn Store, ctx: &Ctx) {
    let data = pattern(1000, 1);
    store.put("get/obj", &data).await.unwrap();
    let got = store.get("get/obj").await.unwrap().expect("present");
    assert_eq!(&got.bytes[..], &data[..], "{}", ctx.name);
    assert!(!got.revision.is_empty(), "{}: empty revision", ctx.name);
}

async fn put_cas_create_stale_current(store: &dyn Store, ctx: &Ctx) {
    let key = "cas/manifest.json";
    let v1 = Bytes::from_static(b"{\"v\":1}");
    let v2 = Bytes::from_static(b"{\"v\":2,\"more\":true}");
    let v3 = Bytes::from_static(b"{\"v\":3}");

    let rev1 = store.put_cas(key, v1.clone(), "").await.expect("create");
    assert!(!rev1.is_empty(), "{}", ctx.name);
    let got = store.get(key).await.unwrap().unwrap();
    assert_eq!(
        got.revision, rev1,
        "{}: get revision = put_cas revision",
        ctx.name
    );

    // Must-not-exist on an existing key.
    let r = store.put_cas(key, v2.clone(), "").await;
    assert!(is_conflict(&r), "{}: create over existing: {r:?}", ctx.name);

    let rev2 = store.put_cas(key, v2.clone(), &rev1).await.expect("update");
    assert_ne!(rev2, rev1, "{}", ctx.name);

    // Stale and made-up revisions.
    let r = store.put_cas(key, v3.clone(), &rev1).await;
    assert!(is_conflict(&r), "{}: stale revision: {r:?}", ctx.name);
    let r = store.put_cas(key, v3.clone(), "\"not-a-revision\"").await;
    assert!(is_conflict(&r), "{}: made-up revision: {r:?}", ctx.name);

    let got = store.get(key).await.unwrap().unwrap();
    assert_eq!(got.bytes, v2, "{}: a failed CAS must not write", ctx.name);
    assert_eq!(got.revision, rev2, "{}", ctx.name);

    // After a plain overwrite, the old revision is stale.
    store.put(key, &v3).await.unwrap();
    let r = store.put_cas(key, v1.clone(), &rev2).await;
    assert!(
        is_conflict(&r),
        "{}: revision after overwrite: {r:?}",
        ctx.name
    );
    // Delete, then create again.
    store.delete(key).await.unwrap();
    let r = store.put_cas(key, v1.clone(), &rev2).await;
    assert!(
        is_conflict(&r),
        "{}: If-Match on a deleted key: {r:?}",
        ctx.name
    );
    store.put_cas(key, v1.clone(), "").await.expect("re-create");
}

async fn content_is_replaced(store: &dyn Store, ctx: &Ctx) {
    let key = "replace/obj";
    store.put(key, &pattern(5000, 2)).await.unwrap();
    let second = pattern(1234, 3);
    let r = store.put(key, &second).await.unwrap();
    assert_eq!(r.size, 1234, "{}", ctx.name);
    let got = store.get(key).await.unwrap().unwrap();
    assert_eq!(&got.bytes[..], &second[..], "{}", ctx.name);
    let listed = store.list("replace/").await.unwrap();
    assert_eq!(listed.len(), 1, "{}", ctx.name);
    assert_eq!(listed[0].size, 1234, "{}", ctx.name);
}

async fn open_streams_a_large_object(store: &dyn Store, ctx: &Ctx) {
    let key = "stream/big.pb";
    let data = pattern(20 * MIB, 4);
    let put = write_chunked(store, key, &data, MIB).await;
    assert_eq!(put.size, data.len() as u64, "{}", ctx.name);

    let mut reader = store.open(key).await.unwrap().expect("present");
    let mut buf = vec![0u8; 64 * 1024];
    let mut offset = 0usize;
    let mut reads = 0usize;
    let mut hasher = Sha256::new();
    loop {
        let n = reader.read(&mut buf).await.expect("read");
        if n == 0 {
            break;
        }
        assert!(
            offset + n <= data.len(),
            "{}: more bytes than written",
            ctx.name
        );
        assert_eq!(
            &buf[..n],
            &data[offset..offset + n],
            "{}: at offset {offset}",
            ctx.name
        );
        hasher.update(&buf[..n]);
        offset += n;
        reads += 1;
    }
    assert_eq!(offset, data.len(), "{}: short read", ctx.name);
    assert!(reads >= 20 * MIB / buf.len(), "{}: {reads} reads", ctx.name);
    assert_eq!(hex::encode(hasher.finalize()), put.sha256, "{}", ctx.name);
}

async fn abort_leaves_nothing(store: &dyn Store, ctx: &Ctx) {
    // Small (single-request path) and large (multipart path on S3).
    for (key, len) in [
        ("abort/small", 3 * MIB),
        ("abort/large", 2 * PART_SIZE + 17),
    ] {
        let mut w = store.create(key).await.unwrap();
        for c in pattern(len, 5).chunks(MIB) {
            w.write(c).await.unwrap();
        }
        w.abort().await;
        assert!(
            store.get(key).await.unwrap().is_none(),
            "{}: {key}",
            ctx.name
        );
    }
    // Dropping an unfinished writer also leaves nothing under the key.
    {
        let mut w = store.create("abort/dropped").await.unwrap();
        w.write(b"partial").await.unwrap();
    }
    assert!(
        store.get("abort/dropped").await.unwrap().is_none(),
        "{}",
        ctx.name
    );
    // An aborted write does not clobber an existing object either.
    store.put("abort/existing", b"keep me").await.unwrap();
    let mut w = store.create("abort/existing").await.unwrap();
    w.write(&pattern(PART_SIZE + 1, 6)).await.unwrap();
    w.abort().await;
    let got = store.get("abort/existing").await.unwrap().unwrap();
    assert_eq!(&got.bytes[..], b"keep me", "{}", ctx.name);
    assert_eq!(
        keys_under(store, "abort/").await,
        vec!["abort/existing".to_string()],
        "{}",
        ctx.name
    );
}

async fn multipart_round_trip(store: &dyn Store, ctx: &Ctx) {
    // Around the part size (exactly one part, one byte more) and well above it, in odd chunks.
    for (key, len, chunk) in [
        ("multi/exact", PART_SIZE, MIB),
        ("multi/plus-one", PART_SIZE + 1, PART_SIZE + 1),
        ("multi/big", 20 * MIB + 12345, 1_000_003),
    ] {
        let data = pattern(len, len as u64);
        let r = write_chunked(store, key, &data, chunk).await;
        assert_eq!(r.size, len as u64, "{}: {key}", ctx.name);
        assert_eq!(r.sha256, sha256_hex(&data), "{}: {key}", ctx.name);
        assert_eq!(r.uri, store.uri(key), "{}: {key}", ctx.name);
        let got = store.get(key).await.unwrap().expect("present");
        assert_eq!(got.bytes.len(), len, "{}: {key}", ctx.name);
        assert_eq!(sha256_hex(&got.bytes), r.sha256, "{}: {key}", ctx.name);
    }
}

async fn list_by_prefix(store: &dyn Store, ctx: &Ctx) {
    for (k, len) in [
        ("list/a/1", 1),
        ("list/a/2", 22),
        ("list/b/1", 3),
        ("list/ab", 4),
    ] {
        store.put(k, &pattern(len, 7)).await.unwrap();
    }
    let a = store.list("list/a/").await.unwrap();
    let got: Vec<(&str, u64)> = a.iter().map(|o| (o.key.as_str(), o.size)).collect();
    assert_eq!(got, vec![("list/a/1", 1), ("list/a/2", 22)], "{}", ctx.name);
    assert_eq!(
        keys_under(store, "list/a").await,
        vec!["list/a/1", "list/a/2", "list/ab"],
        "{}",
        ctx.name
    );
    assert_eq!(
        keys_under(store, "list/").await,
        vec!["list/a/1", "list/a/2", "list/ab", "list/b/1"],
        "{}",
        ctx.name
    );
    assert!(keys_under(store, "list/c").await.is_empty(), "{}", ctx.name);
    // The empty prefix lists everything, including these.
    let all = keys_under(store, "").await;
    assert!(
        all.contains(&"list/b/1".to_string()),
        "{}: {all:?}",
        ctx.name
    );
}

async fn delete_removes_and_tolerates_missing(store: &dyn Store, ctx: &Ctx) {
    store.put("del/x", b"x").await.unwrap();
    store.put("del/y", b"y").await.unwrap();
    store.delete("del/x").await.expect("delete");
    assert!(store.get("del/x").await.unwrap().is_none(), "{}", ctx.name);
    assert_eq!(
        keys_under(store, "del/").await,
        vec!["del/y"],
        "{}",
        ctx.name
    );
    store.delete("del/x").await.expect("delete again");
    store
        .delete("del/never-existed")
        .await
        .expect("delete missing");
}

async fn escaping_keys_are_refused(store: &dyn Store, ctx: &Ctx) {
    for key in ["../escape", "a/../../escape", "/etc/escape", "a/./b", ""] {
        let escapes = |r: Result<(), ArchiveError>| {
            assert!(
                matches!(r, Err(ArchiveError::KeyEscapesRoot { .. })),
                "{}: {key:?}: {r:?}",
                ctx.name
            )
        };
        escapes(store.put(key, b"x").await.map(drop));
        escapes(store.get(key).await.map(drop));
        escapes(store.open(key).await.map(drop));
        escapes(store.create(key).await.map(drop));
        escapes(
            store
                .put_cas(key, Bytes::from_static(b"x"), "")
                .await
                .map(drop),
        );
        escapes(store.delete(key).await);
    }
    if let Some(root) = &ctx.local_root {
        let parent = root.parent().expect("root has a parent");
        assert!(!parent.join("escape").exists(), "{}", ctx.name);
    }
}

/// `n` writers race `put_cas` on one key, all expecting the same revision: exactly one wins,
/// every other one gets a conflict (not some other error).
async fn cas_race(store: &dyn Store, ctx: &Ctx, n: usize, rounds: usize) {
    for round in 0..rounds {
        let key = format!("race/{round}/manifest.json");
        let mut expected = String::new();
        // Round trip twice: create-if-absent, then update-if-current.
        for phase in 0..2 {
            let attempts = (0..n).map(|i| {
                let body =
                    Bytes::from(format!("{{\"round\":{round},\"phase\":{phase},\"w\":{i}}}"));
                let key = key.clone();
                let expected = expected.clone();
                async move { (i, store.put_cas(&key, body, &expected).await) }
            });
            let results = join_all(attempts).await;
            let winners: Vec<(usize, String)> = results
                .iter()
                .filter_map(|(i, r)| r.as_ref().ok().map(|rev| (*i, rev.clone())))
                .collect();
            assert_eq!(
                winners.len(),
                1,
                "{}: round {round} phase {phase}: {} winners: {results:?}",
                ctx.name,
                winners.len()
            );
            for (i, r) in &results {
                if winners[0].0 != *i {
                    assert!(is_conflict(r), "{}: writer {i}: {r:?}", ctx.name);
                }
            }
            let got = store.get(&key).await.unwrap().unwrap();
            let (w, rev) = &winners[0];
            assert_eq!(&got.revision, rev, "{}", ctx.name);
            assert!(
                std::str::from_utf8(&got.bytes)
                    .unwrap()
                    .contains(&format!("\"w\":{w}}}")),
                "{}: stored body is not the winner's",
                ctx.name
            );
            expected = rev.clone();
        }
    }
}

/// Files under `root` whose names mark them as temporary.
fn temp_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else if e.file_name().to_string_lossy().starts_with(".tmp-") {
                out.push(p);
            }
        }
    }
    out
}

/// The whole suite, in order.
async fn conformance(store: &dyn Store, ctx: &Ctx) {
    put_returns_uri_size_and_sha256(store, ctx).await;
    missing_keys_read_as_none(store, ctx).await;
    get_returns_data_and_revision(store, ctx).await;
    head_reports_size_and_store_time(store, ctx).await;
    put_cas_create_stale_current(store, ctx).await;
    content_is_replaced(store, ctx).await;
    open_streams_a_large_object(store, ctx).await;
    abort_leaves_nothing(store, ctx).await;
    multipart_round_trip(store, ctx).await;
    list_by_prefix(store, ctx).await;
    delete_removes_and_tolerates_missing(store, ctx).await;
    escaping_keys_are_refused(store, ctx).await;
    cas_race(store, ctx, 16, 3).await;
    if let Some(root) = &ctx.local_root {
        assert_eq!(temp_files(root), Vec::<PathBuf>::new(), "{}", ctx.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_conforms() {
    let store = MemoryStore::new();
    conformance(
        &store,
        &Ctx {
            name: "memory",
            local_root: None,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let store = LocalStore::new(&root).unwrap();
    conformance(
        &store,
        &Ctx {
            name: "local",
            local_root: Some(store.root().to_path_buf()),
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_store_conforms_on_seaweedfs() {
    let s3 = seaweedfs();
    let bucket = s3.new_bucket().await;
    let store = s3.s3_store(&bucket, "archives/").await;
    conformance(
        &store,
        &Ctx {
            name: "s3",
            local_root: None,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_store_conforms_without_prefix() {
    let s3 = seaweedfs();
    let bucket = s3.new_bucket().await;
    let store = s3.s3_store(&bucket, "").await;
    let ctx = Ctx {
        name: "s3 (no prefix)",
        local_root: None,
    };
    put_returns_uri_size_and_sha256(&store, &ctx).await;
    put_cas_create_stale_current(&store, &ctx).await;
    list_by_prefix(&store, &ctx).await;
    delete_removes_and_tolerates_missing(&store, &ctx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_if_match_on_a_missing_key_is_a_conflict() {
    let s3 = seaweedfs();
    let bucket = s3.new_bucket().await;
    let store = s3.s3_store(&bucket, "p/").await;
    let r = store
        .put_cas(
            "t/manifest.json",
            Bytes::from_static(b"{}"),
            "\"0123456789abcdef0123456789abcdef\"",
        )
        .await;
    match r {
        Err(ArchiveError::CasConflict { key }) => {
            assert_eq!(key, format!("s3://{bucket}/p/t/manifest.json"))
        }
        other => panic!("expected a CAS conflict, got {other:?}"),
    }
    assert!(store.get("t/manifest.json").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_keys_live_under_the_destination_prefix() {
    let s3 = seaweedfs();
    let bucket = s3.new_bucket().await;
    let inner = s3.s3_store(&bucket, "tenant-a/").await;
    let outer = s3.s3_store(&bucket, "").await;
    assert_eq!(inner.name(), format!("s3://{bucket}/tenant-a/"));
    assert_eq!(
        inner.uri("t/manifest.json"),
        format!("s3://{bucket}/tenant-a/t/manifest.json")
    );

    inner.put("t/manifest.json", b"in").await.unwrap();
    outer.put("t/manifest.json", b"out").await.unwrap();
    outer.put("tenant-b/t/x", b"other").await.unwrap();

    // Stored at prefix + key, listed relative to the prefix.
    let got = outer
        .get("tenant-a/t/manifest.json")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got.bytes[..], b"in");
    assert_eq!(keys_under(&inner, "").await, vec!["t/manifest.json"]);
    assert_eq!(
        keys_under(&outer, "").await,
        vec![
            "t/manifest.json",
            "tenant-a/t/manifest.json",
            "tenant-b/t/x"
        ]
    );
    assert_eq!(
        &inner.get("t/manifest.json").await.unwrap().unwrap().bytes[..],
        b"in"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_large_objects_use_multipart_and_aborts_leave_no_uploads() {
    let s3 = seaweedfs();
    let bucket = s3.new_bucket().await;
    let store = s3.s3_store(&bucket, "x/").await;
    let client = store.client();

    // Below the part size: a single PutObject (plain ETag); above: three parts ("…-3").
    store.put("small", &pattern(PART_SIZE, 8)).await.unwrap();
    write_chunked(&store, "large", &pattern(2 * PART_SIZE + 1, 9), MIB).await;
    let small = store.get("small").await.unwrap().unwrap().revision;
    let large = store.get("large").await.unwrap().unwrap().revision;
    assert!(!small.contains('-'), "single-part ETag {small}");
    assert!(
        large.trim_matches('"').ends_with("-3"),
        "multipart ETag {large}"
    );

    let pending = || async {
        client
            .list_multipart_uploads()
            .bucket(&bucket)
            .send()
            .await
            .unwrap()
            .uploads()
            .iter()
            .map(|u| u.key().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
    };
    assert!(pending().await.is_empty());

    // One byte past a part: the upload is under way (and visible as such) before finish.
    let mut w = store.create("aborted").await.unwrap();
    w.write(&pattern(PART_SIZE + 1, 10)).await.unwrap();
    assert_eq!(pending().await, vec!["x/aborted"]);
    w.abort().await;
    assert!(pending().await.is_empty(), "abort left an upload behind");

    // Dropped without finish: the upload is aborted in the background.
    let mut w = store.create("dropped").await.unwrap();
    w.write(&pattern(PART_SIZE + 1, 11)).await.unwrap();
    assert_eq!(pending().await, vec!["x/dropped"]);
    drop(w);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !pending().await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "a dropped writer left an upload behind"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(store.get("aborted").await.unwrap().is_none());
    assert!(store.get("dropped").await.unwrap().is_none());
}

#[tokio::test]
async fn s3_errors_name_the_bucket_and_key() {
    let s3 = seaweedfs();
    let store = s3.s3_store("larch-no-such-bucket", "p/").await;
    // A missing bucket is an error, not a missing object (an archive must not look empty).
    let err = store.get("t/manifest.json").await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("s3://larch-no-such-bucket/p/t/manifest.json"),
        "{msg}"
    );
    assert!(msg.contains("NoSuchBucket"), "{msg}");
    assert!(err.is_transient(), "{msg}");
    let err = store.list("t/").await.unwrap_err();
    assert!(
        err.to_string().contains("s3://larch-no-such-bucket/p/t/"),
        "{err}"
    );
    // The secret never shows up in an error.
    assert!(!msg.contains("larch-test-secret"), "{msg}");
}
