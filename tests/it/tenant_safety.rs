//! Issue 35, findings 5, 9 (engine and export half) and 10: what larch's HTTP answers show and
//! to whom, how long a listener waits for a request, how much of a manifest it reads, and the
//! masking defaults a shared cluster relies on (`undeclared: null`, `requireTransformed` per
//! column and per epoch).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use larch::archive::masking::TransformRecord;
use larch::archive::store::Store;
use larch::archive::store::local::LocalStore;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::archive_build::{TestArchive, id_and_text_columns, refs};
use crate::engine_follow::local_yaml;
use crate::engine_support::{eventually, get, get_json, start_engine, wait_ready};
use crate::masking::{Files, USERS, follow_masked, larch, local, rows, setup};
use crate::postgres_continuous::{listening, unsafe_kill};
use crate::support::postgres::new_database;

/// Sends half a request head on `stream` and waits for the server to close it; how long that
/// took. Panics when it is still open after 30 s (the listeners give a head 10 s).
async fn half_sent_request_is_cut<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    what: &str,
) -> Duration {
    stream
        .write_all(b"GET /status HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut buf)).await;
    assert!(
        read.is_ok(),
        "{what}: a half-sent request was still open after 30 s"
    );
    started.elapsed()
}

async fn slowloris(addr: SocketAddr, what: &str) -> Duration {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    half_sent_request_is_cut(tcp, what).await
}

/// The same over TLS, trusting only `ca`.
async fn slowloris_tls(addr: SocketAddr, ca: &Path) -> Duration {
    let tls = crate::engine_access::tls_connect(addr, ca).await;
    half_sent_request_is_cut(tls, "engine (TLS)").await
}

/// Finding 5: a duplicate key in a baseline showed the key's value and the whole first row on
/// the engine's open `/status`.
#[tokio::test]
async fn a_duplicate_key_in_a_baseline_leaves_no_row_value_in_the_engine_status() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let mut a = TestArchive::new(store, "public.t/", "public.t")
        .with_columns(id_and_text_columns(&["id", "email", "ssn", "tenant"]));
    let rows = [
        r#"{"id":1,"email":"alice@corp.example","ssn":"123-45-6789","tenant":"tenant-zeta"}"#,
        r#"{"id":2,"email":"bob@corp.example","ssn":"987-65-4321","tenant":"tenant-zeta"}"#,
    ];
    a.snapshot("0/1", &rows).await;
    let engine = start_engine(&local_yaml(dir.path(), "key_fields: [tenant]")).await;
    let addr = engine.addr;
    let message = eventually(30, "the error in /status", || async move {
        get_json(addr, "/status").await["sources"]["seed"]["last_error"]["message"]
            .as_str()
            .map(str::to_string)
    })
    .await;
    assert!(
        message.contains("share a value of the key (tenant)"),
        "{message}"
    );
    let (_, status) = get(addr, "/status").await;
    let (_, metrics) = get(addr, "/metrics").await;
    for body in [&message, &status, &metrics] {
        for value in ["alice", "bob@", "123-45-6789", "987-65-4321", "tenant-zeta"] {
            assert!(!body.contains(value), "{value} in {body}");
        }
    }
    engine.stop().await.unwrap();
}

/// Finding 10: the engine's plain and TLS listeners close a connection whose request head is
/// not complete within the header-read timeout (they kept it open indefinitely).
#[tokio::test]
async fn the_engine_listeners_cut_a_half_sent_request() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let mut a = TestArchive::new(store, "public.t/", "public.t");
    a.snapshot("0/1", &refs(&crate::archive_build::rows(1..=1, "s")))
        .await;
    let certs = tempfile::tempdir().unwrap();
    crate::postgres_tls::make_certificates(certs.path());
    let serving = larch::engine::Serving {
        listen: "127.0.0.1:0".into(),
        access: Default::default(),
        tls: Some((
            "127.0.0.1:0".into(),
            larch::engine::tls::TlsFiles {
                cert: certs.path().join("server.crt"),
                key: certs.path().join("server.key"),
            },
        )),
        grpc: None,
    };
    let engine =
        crate::engine_support::start_engine_serving(&local_yaml(dir.path(), ""), &serving).await;
    wait_ready(engine.addr).await;
    let tls = engine.tls_addr.unwrap();
    let ca = certs.path().join("ca.pem");
    let (plain, over_tls) = tokio::join!(slowloris(engine.addr, "engine"), slowloris_tls(tls, &ca));
    for (what, took) in [("plain", plain), ("TLS", over_tls)] {
        assert!(
            took >= Duration::from_secs(8) && took < Duration::from_secs(20),
            "{what}: {took:?}"
        );
    }
    // A complete request is still answered, a head over 16 KiB is not read.
    assert_eq!(get(engine.addr, "/health/live").await.0, 200);
    let mut big = tokio::net::TcpStream::connect(engine.addr).await.unwrap();
    let head = format!(
        "GET /status HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let _ = big.write_all(head.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = big.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "{answer}"
    );
    engine.stop().await.unwrap();
}

/// A free local port (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Findings 10 and 5: the exporter's slot monitor (`larch export slot-status --listen`) showed
/// the database host, port and user on its open `/status`; its listener, and a continuous
/// exporter's, kept a half-sent request open.
#[tokio::test]
async fn exporters_show_no_host_or_user_and_cut_a_half_sent_request() {
    let db = new_database().await;
    setup(&db).await;
    let port = free_port();
    let monitor = Killed(
        larch()
            .args(["export", "slot-status", "--slot", "larch_nothing_here"])
            .args(["--listen", &format!("127.0.0.1:{port}"), "--interval", "1s"])
            .env("LARCH_PG_DSN", &db.dsn)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let body = eventually(30, "slot-status /status", || async move {
        tokio::net::TcpStream::connect(addr).await.ok()?;
        let (code, body) = get(addr, "/status").await;
        (code == 200 && body.contains("observed_at\":\"")).then_some(body)
    })
    .await;
    let pg_port = db
        .dsn
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("port="))
        .unwrap();
    assert!(body.contains("larch_nothing_here"), "{body}");
    for shown in ["as user", "user=", &format!(":{pg_port}"), "127.0.0.1"] {
        assert!(!body.contains(shown), "{shown:?} in {body}");
    }

    let dir = tempfile::tempdir().unwrap();
    let files = Files::new(crate::masking::RULES);
    let slot = format!("larch_tenant_{}", db.name);
    let mut child = follow_masked(
        dir.path(),
        &files,
        &slot,
        "a-dev-seed-key-of-32-bytes-long!",
        &db,
    );
    let (export, _stderr, reader) = listening(&mut child);
    eventually(60, "export readiness", || async move {
        (get(export, "/health/ready").await.0 == 200).then_some(())
    })
    .await;
    let (_, status) = get(export, "/status").await;
    assert!(!status.contains("as user"), "{status}");
    let (monitor_took, export_took) = tokio::join!(
        slowloris(addr, "slot-status"),
        slowloris(export, "continuous export")
    );
    for (what, took) in [("slot-status", monitor_took), ("export", export_took)] {
        assert!(took < Duration::from_secs(20), "{what}: {took:?}");
    }
    unsafe_kill(child.id(), "TERM");
    assert!(child.wait().unwrap().success());
    reader.join().unwrap();
    drop(monitor);
}

/// A child process killed when dropped (a failed assertion included).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Finding 10: a manifest was read whole whatever its size (300 MiB cost 328 MB of RSS). A
/// 300 MiB one is refused before it is read, naming the key and the cap.
#[tokio::test]
async fn an_oversized_manifest_is_refused_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("public.t");
    std::fs::create_dir_all(&prefix).unwrap();
    let manifest = std::fs::File::create(prefix.join("manifest.json")).unwrap();
    manifest.set_len(300 << 20).unwrap(); // sparse: costs no disk
    let config = dir.path().join("engine.yaml");
    std::fs::write(&config, local_yaml(dir.path(), "")).unwrap();
    let mut engine = Command::new(env!("CARGO_BIN_EXE_larch"))
        .args(["engine", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        // Warnings, and the info event with the listener's address.
        .env("LARCH_LOG", "warn,larch_run::engine=info")
        .env("LARCH_LOG_FORMAT", "json")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(engine.stderr.take().unwrap()).lines();
    let addr: SocketAddr = loop {
        let line = lines.next().expect("the engine exited").unwrap();
        if let Some(a) = crate::engine_support::listening_addr(&line) {
            break a;
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    let message = eventually(30, "the manifest's refusal in /status", || async move {
        get_json(addr, "/status").await["sources"]["seed"]["last_error"]["message"]
            .as_str()
            .map(str::to_string)
    })
    .await;
    assert!(
        message.contains("public.t/manifest.json: 314572800 bytes, over the 67108864 bytes")
            && message.contains("LARCH_MAX_MANIFEST_BYTES"),
        "{message}"
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", engine.id())).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(peak_kib < 100 * 1024, "peak RSS {peak_kib} KiB");
    engine.kill().unwrap();
    let _ = engine.wait();
}

/// Finding 9: a masked export's `undeclared` defaulted to `keep`, so a column the rules did not
/// name went out raw. Now it is NULL unless the rules say `keep`.
#[tokio::test]
async fn undeclared_columns_go_out_null_by_default() {
    let db = new_database().await;
    setup(&db).await;
    let files = Files::new(
        "tables:\n  public.users:\n    columns:\n      id: hash\n      email: hash\n      name: keep\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let out = larch()
        .args(["export", "--table", "users", "--store", "local"])
        .arg("--path")
        .arg(dir.path())
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
    let (_, users) = rows(local(dir.path()), "public.users/").await;
    assert_eq!(users.len() as i64, USERS);
    let raw_ssn = db
        .client
        .query_one("SELECT count(*) FROM users WHERE ssn IS NOT NULL", &[])
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert!(raw_ssn > 0, "the fixture has values to mask");
    for u in &users {
        assert_eq!(u["ssn"], Value::Null, "{u}");
        assert_eq!(u["phone"], Value::Null, "{u}");
        assert!(u["name"].is_string() || u["name"].is_null(), "{u}");
    }
    assert!(users.iter().any(|u| u["name"].is_string()), "name: keep");
}

fn record(
    columns: &[(&str, &str)],
    undeclared: &str,
    undeclared_columns: &[&str],
) -> TransformRecord {
    TransformRecord {
        key_id: Some("hmac-sha256:0123456789abcdef".into()),
        hash: Some("larch-hash-2".into()),
        undeclared: undeclared.into(),
        columns: columns
            .iter()
            .map(|(c, t)| (c.to_string(), t.to_string()))
            .collect::<BTreeMap<_, _>>(),
        undeclared_columns: undeclared_columns.iter().map(|c| c.to_string()).collect(),
        leak_check: None,
        permute: None,
    }
}

/// Finding 9: `requireTransformed` was satisfied by one masked column and checked only at
/// start. Every served column must be covered, and a new epoch is held to it again.
#[tokio::test]
async fn require_transformed_refuses_an_uncovered_column_at_start_and_at_a_new_epoch() {
    let yaml = |root: &Path| local_yaml(root, "require_transformed: true");
    let columns = id_and_text_columns(&["id", "v"]);
    let data = crate::archive_build::rows(1..=3, "s");

    // One column masked, one kept because the rules never named it.
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let mut a = TestArchive::new(store, "public.t/", "public.t").with_columns(columns.clone());
    a.manifest.transform = Some(record(&[("id", "hash"), ("v", "keep")], "keep", &["v"]));
    a.snapshot("0/1", &refs(&data)).await;
    let engine = start_engine(&yaml(dir.path())).await;
    let e = tokio::time::timeout(Duration::from_secs(30), engine.failure())
        .await
        .expect("an uncovered column was served");
    let text = format!("{e:#}");
    assert!(
        text.contains("serves columns its transform does not cover: v")
            && text.contains("table public.t"),
        "{text}"
    );
    assert_eq!(
        larch::failure::classify(&e),
        larch::failure::Reason::ArchiveNotTransformed
    );
    assert_eq!(get(engine.addr, "/health/ready").await.0, 503);
    let _ = engine.stop().await;

    // Covered at start (undeclared: null), then an epoch whose rules keep `v` undeclared.
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let mut a = TestArchive::new(store, "public.t/", "public.t").with_columns(columns);
    a.manifest.transform = Some(record(&[("id", "hash"), ("v", "null")], "null", &["v"]));
    a.snapshot("0/1", &refs(&data)).await;
    let engine = start_engine(&yaml(dir.path())).await;
    wait_ready(engine.addr).await;
    a.manifest.transform = Some(record(&[("id", "hash"), ("v", "keep")], "keep", &["v"]));
    a.snapshot("0/9", &refs(&crate::archive_build::rows(1..=3, "raw")))
        .await;
    let e = tokio::time::timeout(Duration::from_secs(30), engine.failure())
        .await
        .expect("the uncovered epoch was served");
    let text = format!("{e:#}");
    assert!(
        text.contains("epoch 2") && text.contains("does not cover: v"),
        "{text}"
    );
    let _ = engine.stop().await;
}
