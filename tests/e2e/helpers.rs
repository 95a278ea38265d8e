//! Helpers the scenarios share: manifests of the custom resources, waits on their status,
//! the engines' rows against PostgreSQL's, the one-shot export several scenarios read, and
//! archive, slot and Event look-ups.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

use super::support::{Env, condition, condition_is, env_with_operator};

/// An ArchiveExport of `table` to bucket `bucket` on the environment's SeaweedFS.
pub fn export_manifest(
    e: &Env,
    ns: &str,
    name: &str,
    table: &str,
    mode: &str,
    bucket: &str,
) -> String {
    format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveExport
metadata: {{name: {name}, namespace: {ns}}}
spec:
  mode: {mode}
  source:
    connectionSecretRef: {{name: pg-source, key: dsn}}
    table: {{schema: public, name: {table}}}
  destination:
    s3:
      bucket: {bucket}
      region: us-east-1
      endpoint: {endpoint}
      pathStyle: true
      credentials:
        secretRef: {{name: s3-credentials}}
"#,
        endpoint = e.s3_endpoint
    )
}

/// An ArchiveSource replaying export `export` into memory, following it.
pub fn source_manifest(ns: &str, name: &str, export: &str) -> String {
    format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveSource
metadata: {{name: {name}, namespace: {ns}}}
spec:
  archive:
    exportRef: {{name: {export}}}
  follow: true
  pollInterval: 2s
  target:
    memory: {{}}
"#
    )
}

pub fn get_cr(e: &Env, kind: &str, ns: &str, name: &str) -> Value {
    e.get(&[kind, name, "-n", ns])
        .unwrap_or_else(|| panic!("{kind} {ns}/{name} not found"))
}

/// Waits until the export's `LastExportSucceeded` is True (and, with `after_run`, for a run other
/// than that one); returns the object.
pub fn wait_export_succeeded(e: &Env, ns: &str, name: &str, after_run: Option<&str>) -> Value {
    e.wait_for(
        ns,
        &format!("ArchiveExport {ns}/{name} LastExportSucceeded=True"),
        300,
        || {
            let o = e.get(&["archiveexport", name, "-n", ns])?;
            if condition_is(&o, "LastExportSucceeded", "False")
                || condition_is(&o, "Stalled", "True")
            {
                panic!(
                    "export {ns}/{name} failed: {}\n{}",
                    serde_json::to_string_pretty(&o["status"]).unwrap(),
                    e.diagnostics(ns)
                );
            }
            let run = o["status"]["run"]["id"].as_str().map(str::to_string);
            (condition_is(&o, "LastExportSucceeded", "True")
                && condition_is(&o, "Ready", "True")
                && (after_run.is_none() || run.as_deref() != after_run))
                .then_some(o)
        },
    )
}

pub fn wait_source_ready(e: &Env, ns: &str, name: &str) -> Value {
    e.wait_for(
        ns,
        &format!("ArchiveSource {ns}/{name} Ready=True"),
        300,
        || {
            let o = e.get(&["archivesource", name, "-n", ns])?;
            condition_is(&o, "Ready", "True").then_some(o)
        },
    )
}

/// The pod IPs of a source's engine pods (`name-0`, …).
/// Waits until `kind` `ns/name` is `Stalled=True` with `reason`; returns the condition's message.
pub fn wait_stalled(e: &Env, kind: &str, ns: &str, name: &str, reason: &str) -> String {
    let o = e.wait_for(
        ns,
        &format!("{kind} {ns}/{name} Stalled with {reason}"),
        240,
        || {
            let o = e.get(&[kind, name, "-n", ns])?;
            let stalled = condition(&o, "Stalled")?;
            (stalled["status"] == "True" && stalled["reason"] == reason).then(|| o.clone())
        },
    );
    assert_eq!(
        condition(&o, "Ready").map(|c| c["status"].clone()),
        Some(Value::from("False")),
        "a stalled {kind} is not ready: {o}"
    );
    condition(&o, "Stalled").unwrap()["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

pub fn engine_ip(e: &Env, ns: &str, name: &str) -> String {
    let pod = get_cr(e, "pod", ns, &format!("{name}-0"));
    pod["status"]["podIP"]
        .as_str()
        .expect("engine pod IP")
        .to_string()
}

/// Every row the engine serves for `table`, following `next` page by page.
pub fn engine_rows(e: &Env, ip: &str, table: &str) -> Option<Vec<Value>> {
    let mut rows = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut url = format!("http://{ip}:8080/tables/{table}/rows?limit=300");
        if let Some(a) = &after {
            url.push_str(&format!("&after={}", urlencode(a)));
        }
        let page = e.http_json(&url)?;
        pages += 1;
        rows.extend(page["rows"].as_array()?.iter().cloned());
        match page["next"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => break,
        }
        assert!(pages < 10_000, "pagination does not end");
    }
    Some(rows)
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The table's rows in PostgreSQL as comparable tuples (id, tenant, kind, amount, flag, ref).
pub fn pg_rows(e: &Env, table: &str) -> Vec<(i64, String, Option<String>, f64, bool, String)> {
    let out = e.sql(&format!(
        "SELECT id, tenant, coalesce(kind, '\\N'), amount, flag, ref FROM public.{table} ORDER BY id"
    ));
    out.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            (
                f[0].parse().unwrap(),
                f[1].to_string(),
                (f[2] != "\\N").then(|| f[2].to_string()),
                f[3].parse().unwrap(),
                f[4] == "t",
                f[5].to_string(),
            )
        })
        .collect()
}

/// The engine's rows through the documented value mapping (docs/postgres-types.md): int8 → JSON
/// integer, numeric → number literal, text → string, boolean → true/false, uuid → string.
pub fn engine_tuples(rows: &[Value]) -> Vec<(i64, String, Option<String>, f64, bool, String)> {
    rows.iter()
        .map(|r| {
            (
                r["id"].as_i64().unwrap_or_else(|| panic!("id of {r}")),
                r["tenant"].as_str().unwrap().to_string(),
                r["kind"].as_str().map(str::to_string),
                r["amount"]
                    .as_f64()
                    .unwrap_or_else(|| panic!("amount of {r}")),
                r["flag"].as_bool().unwrap(),
                r["ref"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Waits until the engine of source `name` serves exactly the rows of `table` in PostgreSQL.
pub fn wait_engine_matches(e: &Env, ns: &str, name: &str, table: &str) {
    let expected = pg_rows(e, table);
    let mut last = String::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    loop {
        let ip = engine_ip(e, ns, name);
        if let Some(rows) = engine_rows(e, &ip, &format!("public.{table}")) {
            let got = engine_tuples(&rows);
            if got == expected {
                return;
            }
            let ids: Vec<i64> = got.iter().map(|t| t.0).collect();
            last = format!(
                "engine has {} rows (first ids {:?}), PostgreSQL {}",
                got.len(),
                &ids[..ids.len().min(5)],
                expected.len()
            );
        }
        if std::time::Instant::now() > deadline {
            panic!(
                "the engine of {ns}/{name} never served the rows of {table}: {last}\n{}",
                e.diagnostics(ns)
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The one-shot export shared by scenarios 3 and 4: namespace `e2e-oneshot`, export `events`
/// of public.events into bucket `oneshot`, succeeded.
pub fn oneshot_exported() -> &'static Value {
    static DONE: OnceLock<Value> = OnceLock::new();
    DONE.get_or_init(|| {
        let e = env_with_operator();
        e.namespace("e2e-oneshot", &[]);
        e.bucket("oneshot");
        e.apply(&export_manifest(
            e,
            "e2e-oneshot",
            "events",
            "events",
            "OneShot",
            "oneshot",
        ));
        wait_export_succeeded(e, "e2e-oneshot", "events", None)
    })
}

/// `larch archive <command>` arguments for an archive in the environment's SeaweedFS.
pub fn archive_args<'a>(
    e: &'a Env,
    command: &[&'a str],
    bucket: &'a str,
    key_prefix: &'a str,
) -> Vec<&'a str> {
    let mut a = vec!["archive"];
    a.extend_from_slice(command);
    a.extend([
        "--store",
        "s3",
        "--bucket",
        bucket,
        "--endpoint",
        &e.s3_endpoint,
        "--region",
        "us-east-1",
        "--path-style",
        "--key-prefix",
        key_prefix,
    ]);
    a
}

/// Table `public.<name>` as a copy of the first `rows` events, and a Continuous ArchiveExport
/// `<name>` of it (diffs every second) into `bucket`, Ready.
pub fn continuous_export_of_copy(e: &Env, ns: &str, name: &str, rows: i64, bucket: &str) {
    e.sql(&format!(
        "DROP TABLE IF EXISTS public.{name}; \
         CREATE TABLE public.{name} AS SELECT * FROM public.events WHERE id <= {rows}; \
         ALTER TABLE public.{name} ADD PRIMARY KEY (id)"
    ));
    e.namespace(ns, &[]);
    e.bucket(bucket);
    let mut m = export_manifest(e, ns, name, name, "Continuous", bucket);
    m.push_str("  continuous: {diffInterval: 1s}\n");
    e.apply(&m);
    e.wait_for(ns, "the continuous export Ready", 300, || {
        let o = e.get(&["archiveexport", name, "-n", ns])?;
        condition_is(&o, "Ready", "True").then_some(())
    });
}

/// The writer pod of a continuous export's Deployment (not a copy made by the test).
pub fn writer_pods(e: &Env, ns: &str, export: &str) -> Vec<Value> {
    e.list(&[
        "pods",
        "-n",
        ns,
        "-l",
        &format!("larch.dev/archive-export={export}"),
    ])
    .into_iter()
    .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
    .collect()
}

/// The verified archive's row count at its head.
pub fn archive_row_count(e: &Env, bucket: &str, key_prefix: &str) -> i64 {
    e.larch(&archive_args(e, &["verify"], bucket, key_prefix));
    let text = e.larch(&archive_args(e, &["reconstruct"], bucket, key_prefix));
    let v: Value = serde_json::from_str(&text).unwrap();
    v["row_count"].as_i64().unwrap()
}

pub fn slot_count(e: &Env, slot: &str) -> i64 {
    e.sql(&format!(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'"
    ))
    .parse()
    .unwrap()
}

pub fn publication_count(e: &Env, name: &str) -> i64 {
    e.sql(&format!(
        "SELECT count(*) FROM pg_publication WHERE pubname = '{name}'"
    ))
    .parse()
    .unwrap()
}

/// The Events of `object` in `ns` with `reason`, oldest first.
pub fn events_of(e: &Env, ns: &str, object: &str, reason: &str) -> Vec<Value> {
    e.list(&["events", "-n", ns])
        .into_iter()
        .filter(|ev| ev["involvedObject"]["name"] == object && ev["reason"] == reason)
        .collect()
}

/// examples/*.yaml adapted to this environment by e2e/examples.sh, for namespace `ns`: a List.
pub fn examples_for(e: &Env, ns: &str) -> String {
    let out = std::process::Command::new("bash")
        .arg(format!("{}/e2e/examples.sh", super::support::REPO))
        .arg(&e.dir)
        .arg(ns)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A TCP proxy to `127.0.0.1:upstream` that passes the server's bytes at `bytes_per_second`
/// each connection (the client's unthrottled); runs until the test process ends. Returns its
/// port.
pub fn throttled_proxy(upstream: u16, bytes_per_second: usize) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || pipe(client, server, None));
            std::thread::spawn(move || pipe(s2, c2, Some(bytes_per_second)));
        }
    });
    port
}

fn pipe(mut from: TcpStream, mut to: TcpStream, rate: Option<usize>) {
    let mut buf = [0u8; 4096];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        if let Some(rate) = rate {
            std::thread::sleep(Duration::from_secs_f64(n as f64 / rate as f64));
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}
