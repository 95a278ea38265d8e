//! One throwaway PostgreSQL 15 cluster per test process (scripts/postgres.sh), on a free
//! loopback port, stopped by a watchdog when the test binary exits (even when it is killed).
//! Each test takes its own database with [`new_database`].

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio_postgres::NoTls;

pub struct Cluster {
    pub dir: PathBuf,
    pub port: u16,
}

impl Cluster {
    /// A DSN for `database` as the superuser (trust authentication).
    pub fn dsn(&self, database: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={database}",
            self.port
        )
    }

    /// A DSN over the cluster's Unix socket (open whatever pg_hba.conf says about TCP).
    pub fn socket_dsn(&self, database: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname={database}",
            self.dir.display(),
            self.port
        )
    }

    pub async fn connect(&self, database: &str) -> tokio_postgres::Client {
        self.connect_to(&self.dsn(database)).await
    }

    pub async fn connect_to(&self, dsn: &str) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(dsn, NoTls)
            .await
            .unwrap_or_else(|e| {
                panic!("connecting to the test cluster on port {}: {e}", self.port)
            });
        tokio::spawn(async move {
            let _ = conn.await;
        });
        client
    }

    /// Lets `role` log in only with its password (scram), locally and for replication:
    /// the cluster trusts everyone else.
    pub async fn require_password_for(&self, role: &str) {
        let hba = self.dir.join("data/pg_hba.conf");
        let current = std::fs::read_to_string(&hba).expect("reading pg_hba.conf");
        let line = format!(
            "host all {role} 127.0.0.1/32 scram-sha-256\nhost replication {role} 127.0.0.1/32 scram-sha-256\n"
        );
        if !current.contains(&line) {
            std::fs::write(&hba, format!("{line}{current}")).expect("writing pg_hba.conf");
        }
        let c = self.connect("postgres").await;
        c.execute("SELECT pg_reload_conf()", &[])
            .await
            .expect("reloading the configuration");
        // pg_reload_conf only signals: wait until the new rules are in force.
        for _ in 0..50 {
            let n: i64 = c
                .query_one(
                    "SELECT count(*) FROM pg_hba_file_rules WHERE $1 = ANY(user_name)",
                    &[&role],
                )
                .await
                .unwrap()
                .get(0);
            if n >= 2 {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/postgres.sh")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts a cluster and a watchdog that stops it and removes its directory once this process
/// is gone. Fails (never skips) when PostgreSQL is missing.
pub fn start_cluster(wal_level: &str) -> Cluster {
    let dir = std::env::temp_dir().join(format!(
        "larch-pg-{}-{}-{}",
        std::process::id(),
        wal_level,
        free_port()
    ));
    let mut last_err = String::new();
    for _ in 0..3 {
        let port = free_port();
        let out = Command::new("bash")
            .arg(script())
            .args(["start", dir.to_str().unwrap(), &port.to_string(), wal_level])
            .output()
            .expect("running scripts/postgres.sh (bash)");
        if out.status.success() {
            spawn_watchdog(&dir);
            return Cluster { dir, port };
        }
        last_err = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    panic!(
        "could not start PostgreSQL 15 with scripts/postgres.sh (install postgresql-15, see scripts/setup.sh): {last_err}"
    );
}

fn spawn_watchdog(dir: &Path) {
    let pid = std::process::id();
    let d = dir.to_str().unwrap();
    // SIGQUIT to the postmaster is PostgreSQL's immediate shutdown; the watchdog needs nothing
    // from the repository (which may be gone by then).
    let watchdog = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; \
         pm=$(head -n 1 '{d}/data/postmaster.pid' 2>/dev/null) && kill -QUIT \"$pm\" 2>/dev/null; \
         for i in $(seq 50); do [ -f '{d}/data/postmaster.pid' ] || break; sleep 0.1; done; rm -rf '{d}'"
    );
    Command::new("setsid")
        .args(["-f", "sh", "-c", &watchdog])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("starting the cluster watchdog");
}

/// The process-wide cluster (wal_level = logical).
pub fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| start_cluster("logical"))
}

/// A second cluster with wal_level = replica, for the error test.
pub fn replica_cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| start_cluster("replica"))
}

/// A third cluster whose slots lose their WAL quickly (max_slot_wal_keep_size), for the
/// invalidated-slot test; kept apart so it never invalidates another test's slot.
pub fn lossy_cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| start_cluster("logical"))
}

pub struct Database {
    pub name: String,
    pub dsn: String,
    pub client: tokio_postgres::Client,
}

/// A fresh database on the process-wide cluster.
pub async fn new_database() -> Database {
    new_database_on(cluster()).await
}

/// A fresh database on `c`.
pub async fn new_database_on(c: &Cluster) -> Database {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "t{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    );
    let admin = c.connect("postgres").await;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap_or_else(|e| panic!("creating database {name}: {e}"));
    let client = c.connect(&name).await;
    Database {
        dsn: c.dsn(&name),
        name,
        client,
    }
}
