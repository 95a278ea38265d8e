//! TLS to PostgreSQL against a real PostgreSQL 15 that accepts TCP connections only over TLS
//! (pg_hba `hostssl`, `hostnossl … reject`) with a certificate from a test CA: the one-shot and
//! the continuous export (its replication session included) and the PostgreSQL target work
//! with `sslmode=verify-full`; a wrong CA and `sslmode=disable` fail with errors that say why.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use larch::archive::model::Action;
use larch::archive::store::Store;
use larch::archive::store::local::LocalStore;

use crate::archive_build::TestArchive;
use crate::engine_support::{eventually, start_engine, wait_ready};
use crate::postgres_continuous::{Follow, archive_rows, setup, table_rows};
use crate::support::postgres::{Cluster, Database, start_cluster};

struct TlsCluster {
    cluster: Cluster,
    ca: PathBuf,
    other_ca: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running openssl");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// A CA, a server certificate for localhost / 127.0.0.1 signed by it, and an unrelated CA
/// (`ca.pem`, `server.crt`, `server.key`, `other-ca.pem`).
pub(crate) fn make_certificates(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for ca in ["ca", "other-ca"] {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN=larch test {ca}"),
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
            ],
        );
    }
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            "server.crt",
        ],
    );
}

fn tls_cluster() -> &'static TlsCluster {
    static C: OnceLock<TlsCluster> = OnceLock::new();
    C.get_or_init(|| {
        let cluster = start_cluster("logical");
        let tls = cluster.dir.join("tls");
        make_certificates(&tls);
        // PostgreSQL wants its key private to the user it runs as.
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "chmod 600 '{0}/server.key' && if [ \"$(id -u)\" = 0 ]; then chown -R postgres:postgres '{0}'; fi",
                tls.display()
            ))
            .status()
            .unwrap();
        assert!(status.success());
        std::fs::write(
            cluster.dir.join("data/pg_hba.conf"),
            "local all all trust\n\
             hostssl all all 127.0.0.1/32 trust\n\
             hostssl replication all 127.0.0.1/32 trust\n\
             hostnossl all all 0.0.0.0/0 reject\n\
             hostnossl replication all 0.0.0.0/0 reject\n",
        )
        .unwrap();
        // One statement at a time: ALTER SYSTEM refuses a (multi-statement) transaction.
        let sql = [
            "ALTER SYSTEM SET ssl = on".to_string(),
            format!("ALTER SYSTEM SET ssl_cert_file = '{}/server.crt'", tls.display()),
            format!("ALTER SYSTEM SET ssl_key_file = '{}/server.key'", tls.display()),
            "SELECT pg_reload_conf()".to_string(),
        ];
        let socket = cluster.socket_dsn("postgres");
        std::thread::spawn(move || {
            tokio::runtime::Runtime::new().unwrap().block_on(async {
                let (c, conn) = tokio_postgres::connect(&socket, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(conn);
                for q in &sql {
                    c.batch_execute(q).await.unwrap();
                }
                for _ in 0..50 {
                    let on: String = c.query_one("SHOW ssl", &[]).await.unwrap().get(0);
                    if on == "on" {
                        return;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                panic!("ssl did not turn on");
            })
        })
        .join()
        .unwrap();
        TlsCluster {
            ca: tls.join("ca.pem"),
            other_ca: tls.join("other-ca.pem"),
            cluster,
        }
    })
}

/// A fresh database on the TLS cluster; `dsn` verifies the server fully.
async fn tls_database() -> (Database, &'static TlsCluster) {
    let t = tls_cluster();
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let name = format!(
        "tls{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    );
    let admin = t
        .cluster
        .connect_to(&t.cluster.socket_dsn("postgres"))
        .await;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let client = t.cluster.connect_to(&t.cluster.socket_dsn(&name)).await;
    let dsn = format!(
        "host=localhost port={} user=postgres dbname={name} sslmode=verify-full sslrootcert={}",
        t.cluster.port,
        t.ca.display()
    );
    (Database { name, dsn, client }, t)
}

fn export_once(dsn: &str, dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_larch"))
        .args(["export", "--table", "items", "--store", "local", "--path"])
        .arg(dir)
        .env("LARCH_PG_DSN", dsn)
        .output()
        .unwrap()
}

#[tokio::test]
async fn exports_over_verified_tls_and_refuse_an_unverified_server() {
    let (db, t) = tls_database().await;
    setup(&db).await;

    // One-shot: a consistent snapshot through verified TLS (plain TCP is refused by the server).
    let dir = tempfile::tempdir().unwrap();
    let out = export_once(&db.dsn, dir.path());
    assert!(out.status.success(), "{out:?}");
    assert_eq!(archive_rows(dir.path()).await.2, table_rows(&db).await);

    // The certificate is not from the CA we trust: refused, and the error says so.
    let wrong = db.dsn.replace(
        &t.ca.display().to_string(),
        &t.other_ca.display().to_string(),
    );
    let out = export_once(&wrong, tempfile::tempdir().unwrap().path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("certificate") && err.contains("UnknownIssuer"),
        "{err}"
    );
    // Without TLS the server refuses us (and we say who refused what).
    let plain = format!(
        "host=localhost port={} user=postgres dbname={} sslmode=disable",
        t.cluster.port, db.name
    );
    let out = export_once(&plain, tempfile::tempdir().unwrap().path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("no encryption"), "{err}");

    // Continuous: the replication session is TLS too (pg_stat_ssl of the walsender).
    let dir = tempfile::tempdir().unwrap();
    let slot = format!("larch_tls_{}", db.name);
    let f = Follow::start(&db, dir.path(), &slot, &["--diff-interval", "200ms"]);
    f.ready().await;
    db.client
        .batch_execute(
            "INSERT INTO items VALUES (77, 'over tls', NULL); DELETE FROM items WHERE id = 1;",
        )
        .await
        .unwrap();
    let want = table_rows(&db).await;
    eventually(30, "the change through a TLS replication session", || {
        let want = want.clone();
        let dir = dir.path();
        async move { (archive_rows(dir).await.2 == want).then_some(()) }
    })
    .await;
    let encrypted: i64 = db
        .client
        .query_one(
            "SELECT count(*) FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid) \
             WHERE s.ssl AND r.application_name LIKE 'larch:%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(encrypted, 1, "the walsender serves larch over TLS");
    assert_eq!(f.terminate(), 0);
}

#[tokio::test]
async fn the_postgres_target_writes_over_verified_tls() {
    let (db, _) = tls_database().await;
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("archive");
    let dsn_file = tmp.path().join("dsn");
    std::fs::write(&dsn_file, &db.dsn).unwrap();
    let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(LocalStore::new(&archive).unwrap());
    let mut a = TestArchive::new(store, "public.items/", "public.items")
        .with_columns(crate::archive_build::id_name_columns());
    let rows: Vec<String> = (1..=20)
        .map(|i| format!(r#"{{"id":{i},"name":"n{i}"}}"#))
        .collect();
    a.snapshot("0/100", &crate::archive_build::refs(&rows))
        .await;
    let r21 = r#"{"id":21,"name":"tls"}"#;
    a.diff("0/100", "0/200", &[(Action::Insert, None, Some(r21))])
        .await;
    let engine = start_engine(&format!(
        "sources:\n  seed:\n    type: archive\n    store: {{type: local, path: \"{}\"}}\n    \
         key_prefix: public.items/\ntables:\n  - source: seed\n    schema: public\n    table: items\n    \
         targets:\n      - type: postgres\n        connection_file: \"{}\"\n",
        archive.display(),
        dsn_file.display()
    ))
    .await;
    wait_ready(engine.addr).await;
    let n: i64 = db
        .client
        .query_one("SELECT count(*) FROM public.items", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 21);
    let encrypted: i64 = db
        .client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE s.ssl AND a.datname = current_database() AND a.pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(encrypted >= 1, "the target's connection is TLS");
    engine.stop().await.unwrap();
}
