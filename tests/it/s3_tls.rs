//! S3 over HTTPS with a private CA: the real SeaweedFS behind a TLS front (a certificate for
//! 127.0.0.1 signed by a test CA). The store trusts the CA bundle it is given (`ca_file`, or
//! `AWS_CA_BUNDLE` as the operator's pods set it) and nothing else; a bad bundle is refused
//! before any request, naming the file.

use std::path::Path;
use std::sync::Arc;

use larch::archive::store::Store;
use larch::archive::store::s3::{S3Config, S3Credentials, S3Store};

use crate::cli_archive::larch;
use crate::fixtures::cases;
use crate::postgres_tls::make_certificates;
use crate::support::seaweedfs::seaweedfs;

/// A TLS front on a loopback port forwarding plaintext to the SeaweedFS S3 gateway, on a
/// thread of its own (the CLI test is synchronous). Returns the `https://` endpoint.
fn tls_front(certs: &Path) -> String {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(certs.join("server.crt"))
            .unwrap()
            .map(Result::unwrap)
            .collect();
    let key = PrivateKeyDer::from_pem_file(certs.join("server.key")).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let upstream = seaweedfs()
        .endpoint()
        .trim_start_matches("http://")
        .to_string();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, upstream) = (acceptor.clone(), upstream.clone());
                tokio::spawn(async move {
                    // A client that does not trust the certificate aborts the handshake.
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut plain = tokio::net::TcpStream::connect(&upstream).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
    });
    format!("https://127.0.0.1:{port}")
}

fn config_via(endpoint: &str, bucket: &str, ca_file: Option<&Path>) -> S3Config {
    S3Config {
        endpoint: Some(endpoint.to_string()),
        ca_file: ca_file.map(Path::to_path_buf),
        ..seaweedfs().config(bucket, "")
    }
}

#[tokio::test]
async fn s3_over_https_trusts_exactly_the_given_ca_bundle() {
    let certs = tempfile::tempdir().unwrap();
    make_certificates(certs.path());
    let endpoint = tls_front(certs.path());
    let bucket = seaweedfs().new_bucket().await;

    // Trusting the CA that signed the front's certificate: objects round-trip over HTTPS.
    let ca = certs.path().join("ca.pem");
    let store = S3Store::new(config_via(&endpoint, &bucket, Some(&ca)))
        .await
        .unwrap();
    store.put("tls/hello.txt", b"over https").await.unwrap();
    let got = store.get("tls/hello.txt").await.unwrap().unwrap();
    assert_eq!(&got.bytes[..], b"over https");
    // The same object through the plain gateway: it really is the SeaweedFS behind the front.
    let plain = seaweedfs().s3_store(&bucket, "").await;
    assert_eq!(
        &plain.get("tls/hello.txt").await.unwrap().unwrap().bytes[..],
        b"over https"
    );

    // Another CA, or the system roots: the handshake fails, nothing is read.
    for ca in [Some(certs.path().join("other-ca.pem")), None] {
        let store = S3Store::new(config_via(&endpoint, &bucket, ca.as_deref()))
            .await
            .unwrap();
        let err = store.get("tls/hello.txt").await.unwrap_err().to_string();
        assert!(
            err.to_lowercase().contains("certificate")
                || err.contains("UnknownIssuer")
                || err.contains("dispatch"),
            "{ca:?}: {err}"
        );
    }
}

#[tokio::test]
async fn a_bad_ca_bundle_is_refused_before_any_request_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let broken = dir.path().join("broken.pem");
    std::fs::write(
        &broken,
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    for (file, words) in [
        (&missing, "cannot read it"),
        (&garbage, "0 usable CA certificate(s)"),
        (&broken, "unusable"),
    ] {
        let cfg = S3Config {
            endpoint: Some("https://127.0.0.1:9".into()),
            ca_file: Some(file.clone()),
            credentials: S3Credentials::Ambient,
            ..S3Config::new("b", "")
        };
        let Err(err) = S3Store::new(cfg).await else {
            panic!("{file:?}: accepted");
        };
        let err = err.to_string();
        assert!(err.contains(&file.display().to_string()), "{err}");
        assert!(err.contains(words), "{file:?}: {err}");
    }
}

/// The operator's export and engine pods get `AWS_CA_BUNDLE` pointing at the mounted
/// `caBundle`: the binary honours it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_reads_an_https_store_with_aws_ca_bundle() {
    let certs = tempfile::tempdir().unwrap();
    make_certificates(certs.path());
    let endpoint = tls_front(certs.path());
    let bucket = seaweedfs().new_bucket().await;
    let (_, dir, case) = cases().into_iter().find(|c| c.0 == "writer-jsonl").unwrap();
    let plain = seaweedfs().s3_store(&bucket, "").await;
    let root = dir.join("archive");
    for entry in walk(&root) {
        let key = entry
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .to_string();
        plain
            .put(&key, &std::fs::read(&entry).unwrap())
            .await
            .unwrap();
    }
    let S3Credentials::Files {
        access_key_id_file,
        secret_access_key_file,
        ..
    } = seaweedfs().config(&bucket, "").credentials
    else {
        unreachable!("the test server has static keys")
    };
    let key_prefix = case["key_prefix"].as_str().unwrap().to_string();
    let inspect = |ca: &Path| {
        let mut cmd = larch();
        cmd.args(["archive", "inspect", "--json", "--store", "s3"])
            .args([
                "--bucket",
                &bucket,
                "--endpoint",
                &endpoint,
                "--region",
                "us-east-1",
            ])
            .args(["--key-prefix", &key_prefix, "--format", "jsonl"])
            .env("AWS_CA_BUNDLE", ca)
            .env(
                "AWS_ACCESS_KEY_ID",
                std::fs::read_to_string(&access_key_id_file).unwrap().trim(),
            )
            .env(
                "AWS_SECRET_ACCESS_KEY",
                std::fs::read_to_string(&secret_access_key_file)
                    .unwrap()
                    .trim(),
            );
        let out = tokio::task::block_in_place(|| cmd.output().unwrap());
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, stdout, stderr) = inspect(&certs.path().join("ca.pem"));
    assert!(ok, "{stderr}");
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(doc["head_position"], case["head"], "{stdout}");
    let (ok, _, stderr) = inspect(&certs.path().join("other-ca.pem"));
    assert!(!ok, "an untrusted certificate must fail the command");
    assert!(!stderr.is_empty());
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
