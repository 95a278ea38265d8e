//! Access control of the engine's HTTP API: control endpoints off unless enabled and then behind
//! the bearer token, reads protectable, probes always open, the TLS listener, and the token
//! never in the logs.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use larch::archive::store::Store;
use larch::archive::store::local::LocalStore;
use larch::engine::Serving;
use larch::engine::access::{ApiAccess, Token};
use larch::engine::tls::TlsFiles;

use crate::archive_build::{TestArchive, refs, rows};
use crate::engine_follow::local_yaml;
use crate::engine_support::{
    eventually, exchange, get, get_json, request, request_with, start_engine, start_engine_serving,
    wait_ready,
};
use crate::postgres_tls::make_certificates;

const TOKEN: &str = "engine-token-7f3a9c2e51d84b06";
const BEARER: &str = "Authorization: Bearer engine-token-7f3a9c2e51d84b06";

fn yaml(root: &Path) -> String {
    local_yaml(root, "")
}

/// A one-row archive under a fresh directory.
async fn archive() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let mut a = TestArchive::new(store, "public.t/", "public.t");
    a.snapshot("0/1", &refs(&rows(1..=1, "s"))).await;
    dir
}

fn serving(control: bool, protect_reads: bool) -> Serving {
    serving_with(control, protect_reads, protect_reads)
}

fn serving_with(control: bool, protect_reads: bool, protect_status: bool) -> Serving {
    Serving {
        listen: "127.0.0.1:0".into(),
        access: ApiAccess {
            control,
            protect_reads,
            protect_status,
            token: Some(Token::new(TOKEN, "test").unwrap()),
        },
        tls: None,
        grpc: None,
    }
}

#[tokio::test]
async fn control_endpoints_are_off_by_default() {
    let dir = archive().await;
    let engine = start_engine(&yaml(dir.path())).await;
    let addr = engine.addr;
    wait_ready(addr).await;
    let (status, body) = request(addr, "POST", "/sources/seed/pause").await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("--allow-control"), "{body}");
    // Refused means not done.
    assert_eq!(
        get_json(addr, "/status").await["sources"]["seed"]["state"],
        "STREAMING",
    );
    assert_eq!(get(addr, "/tables/public.t/row?id=1").await.0, 200);
    engine.stop().await.unwrap();
}

#[tokio::test]
async fn control_needs_the_bearer_token() {
    let dir = archive().await;
    let engine = start_engine_serving(&yaml(dir.path()), &serving(true, false)).await;
    let addr = engine.addr;
    wait_ready(addr).await;
    for headers in [
        &[][..],
        &["Authorization: Bearer engine-token-7f3a9c2e51d84b0"][..],
        &["Authorization: Bearer engine-token-7f3a9c2e51d84b066"][..],
        &["Authorization: Basic ZW5naW5lOnRva2Vu"][..],
        &["Authorization: engine-token-7f3a9c2e51d84b06"][..],
    ] {
        let (status, body) = request_with(addr, "POST", "/sources/seed/pause", headers).await;
        assert_eq!(status, 401, "{headers:?}: {body}");
        assert!(!body.contains(TOKEN), "{body}");
    }
    assert_eq!(
        get_json(addr, "/status").await["sources"]["seed"]["state"],
        "STREAMING",
        "a refused pause changes nothing"
    );
    let (status, body) = request_with(addr, "POST", "/sources/seed/pause", &[BEARER]).await;
    assert_eq!((status, body.as_str()), (200, r#"{"paused":true}"#));
    assert_eq!(
        get_json(addr, "/status").await["sources"]["seed"]["state"],
        "PAUSED"
    );
    assert_eq!(
        request_with(addr, "POST", "/sources/seed/resume", &[BEARER])
            .await
            .0,
        200
    );
    // Reads stay open unless protected.
    assert_eq!(get(addr, "/tables/public.t/row?id=1").await.0, 200);
    engine.stop().await.unwrap();
}

#[tokio::test]
async fn protected_reads_status_and_metrics_need_the_token_and_probes_do_not() {
    let dir = archive().await;
    let engine = start_engine_serving(&yaml(dir.path()), &serving(false, true)).await;
    let addr = engine.addr;
    wait_ready(addr).await;
    for path in [
        "/tables",
        "/tables/public.t",
        "/tables/public.t/rows",
        "/tables/public.t/row?id=1",
    ] {
        let (status, body) = get(addr, path).await;
        assert_eq!(status, 401, "{path}: {body}");
        assert!(!body.contains("s-1"), "{path}: no row data: {body}");
        let (status, body) = request_with(addr, "GET", path, &[BEARER]).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    let (_, row) = request_with(addr, "GET", "/tables/public.t/row?id=1", &[BEARER]).await;
    assert!(row.contains(r#""v":"s-1""#), "{row}");
    // The kubelet's probes need no token.
    for path in ["/health/live", "/health/ready"] {
        assert_eq!(get(addr, path).await.0, 200, "{path}");
    }
    // Status and metrics name tables, positions and errors: behind the token with
    // --protect-status (issue 35).
    for path in ["/status", "/metrics"] {
        let (status, body) = get(addr, path).await;
        assert_eq!(status, 401, "{path}: {body}");
        assert!(!body.contains("public.t"), "{path}: {body}");
        let (status, body) = request_with(addr, "GET", path, &[BEARER]).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert!(
            body.contains("public.t") || body.contains("seed"),
            "{path}: {body}"
        );
    }
    // Control was not enabled: the token does not open it.
    assert_eq!(
        request_with(addr, "POST", "/sources/seed/pause", &[BEARER])
            .await
            .0,
        403
    );
    engine.stop().await.unwrap();
}

/// `--protect-reads` alone (a generated token's engines): rows behind the token, `/status` and
/// `/metrics` open for the operator and Prometheus, without a row value in them.
#[tokio::test]
async fn protected_reads_alone_leave_status_and_metrics_open() {
    let dir = archive().await;
    let engine = start_engine_serving(&yaml(dir.path()), &serving_with(false, true, false)).await;
    let addr = engine.addr;
    wait_ready(addr).await;
    assert_eq!(get(addr, "/tables/public.t/row?id=1").await.0, 401);
    for path in ["/status", "/metrics"] {
        let (status, body) = get(addr, path).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert!(!body.contains("s-1"), "{path}: no row value: {body}");
    }
    engine.stop().await.unwrap();
}

/// A CA (`ca.pem`) and a certificate it signed for localhost / 127.0.0.1 (`server.crt`,
/// `server.key`: what a kubernetes.io/tls Secret holds as `tls.crt`, `tls.key`).
fn certificates(dir: &Path) -> (TlsFiles, std::path::PathBuf) {
    make_certificates(dir);
    let files = TlsFiles {
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
    };
    (files, dir.join("ca.pem"))
}

/// One request over TLS to `addr`, trusting only `ca`.
async fn tls_request(
    addr: std::net::SocketAddr,
    ca: &Path,
    path: &str,
    headers: &[&str],
) -> (u16, String) {
    let mut tls = tls_connect(addr, ca).await;
    exchange(&mut tls, "localhost", "GET", path, headers).await
}

/// A TLS connection to `addr` as `localhost`, trusting only `ca`.
pub(crate) async fn tls_connect(
    addr: std::net::SocketAddr,
    ca: &Path,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    connector.connect(name, tcp).await.unwrap()
}

#[tokio::test]
async fn the_tls_listener_serves_the_api_and_the_plain_one_only_probes() {
    let dir = archive().await;
    let certs = tempfile::tempdir().unwrap();
    let (files, ca) = certificates(certs.path());
    let mut s = serving(false, true);
    s.tls = Some(("127.0.0.1:0".into(), files.clone()));
    let engine = start_engine_serving(&yaml(dir.path()), &s).await;
    let (plain, tls) = (engine.addr, engine.tls_addr.expect("a TLS listener"));
    wait_ready(plain).await;
    let (status, row) = tls_request(tls, &ca, "/tables/public.t/row?id=1", &[BEARER]).await;
    assert_eq!(status, 200, "{row}");
    assert!(row.contains(r#""v":"s-1""#), "{row}");
    assert_eq!(
        tls_request(tls, &ca, "/tables/public.t/row?id=1", &[])
            .await
            .0,
        401
    );
    assert_eq!(tls_request(tls, &ca, "/status", &[]).await.0, 401);
    assert_eq!(tls_request(tls, &ca, "/status", &[BEARER]).await.0, 200);
    // The plain listener has no row data and no control, token or not.
    assert_eq!(
        request_with(plain, "GET", "/tables/public.t/row?id=1", &[BEARER])
            .await
            .0,
        404
    );
    assert_eq!(get(plain, "/health/ready").await.0, 200);
    for path in ["/status", "/metrics"] {
        assert_eq!(get(plain, path).await.0, 401, "{path}");
        assert_eq!(
            request_with(plain, "GET", path, &[BEARER]).await.0,
            200,
            "{path}"
        );
    }
    // A plain-text client on the TLS port gets no HTTP answer.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(tls).await.unwrap();
        tcp.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut answer)).await;
        assert!(
            !answer.starts_with(b"HTTP/"),
            "plain HTTP answered on the TLS port: {}",
            String::from_utf8_lossy(&answer)
        );
    }
    engine.stop().await.unwrap();
}

fn larch_engine(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_larch"))
        .arg("engine")
        .args(args)
        .env_remove("LARCH_ENGINE_TOKEN")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

#[tokio::test]
async fn the_cli_refuses_unusable_access_settings_naming_them() {
    let dir = archive().await;
    let config = dir.path().join("engine.yaml");
    std::fs::write(&config, yaml(dir.path())).unwrap();
    let config = config.to_str().unwrap();
    let short = dir.path().join("short-token");
    std::fs::write(&short, "abc\n").unwrap();
    let missing = dir.path().join("missing.key");
    let certs = tempfile::tempdir().unwrap();
    let (files, _) = certificates(certs.path());
    let cert = files.cert.to_str().unwrap();
    let cases: Vec<(Vec<&str>, String)> = vec![
        (
            vec!["--allow-control"],
            "--allow-control needs an API token: pass --token-file FILE or set LARCH_ENGINE_TOKEN"
                .into(),
        ),
        (
            vec!["--protect-reads"],
            "--protect-reads needs an API token".into(),
        ),
        (
            vec!["--allow-control", "--token-file", short.to_str().unwrap()],
            format!(
                "--token-file {}: the API token must be at least 16 characters (it has 3)",
                short.display()
            ),
        ),
        (
            vec![
                "--tls-listen",
                "127.0.0.1:0",
                "--tls-cert",
                cert,
                "--tls-key",
                missing.to_str().unwrap(),
            ],
            format!("--tls-key {}: ", missing.display()),
        ),
        (
            vec![
                "--tls-listen",
                "127.0.0.1:0",
                "--tls-cert",
                files.key.to_str().unwrap(),
                "--tls-key",
                files.key.to_str().unwrap(),
            ],
            "no CERTIFICATE block in the file".into(),
        ),
    ];
    for (flags, expected) in cases {
        let mut args = vec!["--config", config, "--check"];
        args.extend(&flags);
        let out = larch_engine(&args, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(&expected), "{flags:?}: {stderr}");
    }
    // The same settings with a usable token and certificate pass the check.
    let out = larch_engine(
        &[
            "--config",
            config,
            "--check",
            "--allow-control",
            "--tls-listen",
            "127.0.0.1:0",
            "--tls-cert",
            cert,
            "--tls-key",
            files.key.to_str().unwrap(),
        ],
        &[("LARCH_ENGINE_TOKEN", TOKEN)],
    );
    assert!(out.status.success(), "{out:?}");
}

#[tokio::test]
async fn the_token_never_reaches_the_log() {
    let dir = archive().await;
    let config = dir.path().join("engine.yaml");
    std::fs::write(&config, yaml(dir.path())).unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let log_path = dir.path().join("stderr.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_larch"))
        .args(["engine", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .args(["--allow-control", "--protect-reads", "--token-file"])
        .arg(&token_file)
        .env("LARCH_LOG", "trace")
        .env("LARCH_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let addr: std::net::SocketAddr = eventually(30, "the engine's address", || {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        async move { text.lines().find_map(crate::engine_support::listening_addr) }
    })
    .await;
    wait_ready(addr).await;
    let wrong = format!("Authorization: Bearer {TOKEN}x");
    assert_eq!(
        request_with(addr, "POST", "/sources/seed/pause", &[&wrong])
            .await
            .0,
        401
    );
    assert_eq!(
        request_with(addr, "POST", "/sources/seed/pause", &[BEARER])
            .await
            .0,
        200
    );
    assert_eq!(
        request_with(addr, "GET", "/tables/public.t/rows", &[BEARER])
            .await
            .0,
        200
    );
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    assert!(child.wait().unwrap().success());
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("engine started"), "a trace-level log: {log}");
    assert!(!log.contains(TOKEN), "the token is in the log:\n{log}");
}
