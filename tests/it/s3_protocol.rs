//! How `S3Store` handles answers that SeaweedFS never gives (or only with thousands of objects)
//! but AWS does: 409 `ConditionalRequestConflict` (retried), 404 `NoSuchKey` on `If-Match` (a
//! conflict), a 404 `NoSuchBucket` (an error, not an absent object), paginated listings. A tiny HTTP server replays canned
//! responses and records the requests; everything else is tested on the real SeaweedFS.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use larch::archive::ArchiveError;
use larch::archive::store::Store;
use larch::archive::store::s3::{S3Config, S3Store};
use larch::locks::MutexExt;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

#[derive(Clone, Debug)]
struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

struct Canned {
    status: u16,
    body: String,
    etag: Option<&'static str>,
}

fn error(status: u16, code: &str) -> Canned {
    Canned {
        status,
        body: format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>canned {code}</Message><RequestId>r1</RequestId></Error>"
        ),
        etag: None,
    }
}

fn ok(etag: &'static str) -> Canned {
    Canned {
        status: 200,
        body: String::new(),
        etag: Some(etag),
    }
}

fn xml(body: String) -> Canned {
    Canned {
        status: 200,
        body,
        etag: None,
    }
}

fn list_page(keys: &[(&str, u64)], next: Option<&str>) -> Canned {
    let contents: String = keys
        .iter()
        .map(|(k, size)| {
            format!(
                "<Contents><Key>{k}</Key><LastModified>2026-11-29T08:00:00.000Z</LastModified><ETag>&quot;e&quot;</ETag><Size>{size}</Size><StorageClass>STANDARD</StorageClass></Contents>"
            )
        })
        .collect();
    let tail = match next {
        Some(t) => format!(
            "<IsTruncated>true</IsTruncated><NextContinuationToken>{t}</NextContinuationToken>"
        ),
        None => "<IsTruncated>false</IsTruncated>".to_string(),
    };
    xml(format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>bkt</Name><Prefix>pre/t/</Prefix><KeyCount>{}</KeyCount><MaxKeys>1000</MaxKeys>{tail}{contents}</ListBucketResult>",
        keys.len()
    ))
}

/// Serves `responses` in order (then 500s) and records every request.
async fn canned_server(responses: Vec<Canned>) -> (String, Arc<Mutex<Vec<Request>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let queue = Arc::new(Mutex::new(VecDeque::from(responses)));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                return;
            };
            let queue = queue.clone();
            let seen = seen2.clone();
            tokio::spawn(async move {
                let mut conn = BufReader::new(sock);
                loop {
                    let mut line = String::new();
                    if conn.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let mut parts = line.split_whitespace();
                    let method = parts.next().unwrap_or_default().to_string();
                    let path = parts.next().unwrap_or_default().to_string();
                    let mut headers = Vec::new();
                    loop {
                        let mut h = String::new();
                        conn.read_line(&mut h).await.unwrap();
                        let h = h.trim_end();
                        if h.is_empty() {
                            break;
                        }
                        let (k, v) = h.split_once(':').unwrap();
                        headers.push((k.trim().to_string(), v.trim().to_string()));
                    }
                    let req = Request {
                        method,
                        path,
                        headers,
                    };
                    if req.header("expect") == Some("100-continue") {
                        conn.get_mut()
                            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                            .await
                            .unwrap();
                    }
                    let len: usize = req
                        .header("content-length")
                        .map(|v| v.parse().unwrap())
                        .unwrap_or(0);
                    let mut body = vec![0u8; len];
                    conn.read_exact(&mut body).await.unwrap();
                    seen.locked().push(req);
                    let resp = queue
                        .locked()
                        .pop_front()
                        .unwrap_or_else(|| error(500, "InternalError"));
                    let mut head = format!(
                        "HTTP/1.1 {} Canned\r\nContent-Length: {}\r\nContent-Type: application/xml\r\n",
                        resp.status,
                        resp.body.len()
                    );
                    if let Some(etag) = resp.etag {
                        head.push_str(&format!("ETag: {etag}\r\n"));
                    }
                    head.push_str("\r\n");
                    let sock = conn.get_mut();
                    sock.write_all(head.as_bytes()).await.unwrap();
                    sock.write_all(resp.body.as_bytes()).await.unwrap();
                }
            });
        }
    });
    (format!("http://{addr}"), seen)
}

async fn store(endpoint: &str) -> S3Store {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("id"), "AKID").unwrap();
    std::fs::write(dir.path().join("secret"), "SECRET").unwrap();
    let mut cfg = S3Config::new("bkt", "pre/");
    cfg.endpoint = Some(endpoint.to_string());
    cfg.path_style = true;
    cfg.region = Some("us-east-1".into());
    cfg.credentials = larch::archive::store::s3::S3Credentials::Files {
        access_key_id_file: dir.path().join("id"),
        secret_access_key_file: dir.path().join("secret"),
        session_token_file: None,
    };
    S3Store::new(cfg).await.unwrap()
}

#[tokio::test]
async fn conditional_request_conflict_is_retried_then_succeeds() {
    let (ep, seen) = canned_server(vec![
        error(409, "ConditionalRequestConflict"),
        error(409, "ConditionalRequestConflict"),
        ok("\"abc\""),
    ])
    .await;
    let s = store(&ep).await;
    let rev = s
        .put_cas("t/manifest.json", Bytes::from_static(b"{}"), "")
        .await
        .unwrap();
    assert_eq!(rev, "\"abc\"");
    let seen = seen.locked();
    assert_eq!(seen.len(), 3, "{seen:?}");
    for r in seen.iter() {
        assert_eq!(r.method, "PUT");
        assert!(r.path.starts_with("/bkt/pre/t/manifest.json"), "{}", r.path);
        assert_eq!(r.header("if-none-match"), Some("*"));
        assert_eq!(r.header("if-match"), None);
    }
}

#[tokio::test]
async fn persistent_conditional_request_conflict_becomes_a_cas_conflict() {
    let (ep, seen) = canned_server(
        (0..10)
            .map(|_| error(409, "ConditionalRequestConflict"))
            .collect(),
    )
    .await;
    let s = store(&ep).await;
    let r = s
        .put_cas("t/manifest.json", Bytes::from_static(b"{}"), "\"e1\"")
        .await;
    assert!(
        matches!(&r, Err(ArchiveError::CasConflict { key }) if key == "s3://bkt/pre/t/manifest.json"),
        "{r:?}"
    );
    // One try plus a bounded number of retries, not forever.
    let n = seen.locked().len();
    assert!((2..=6).contains(&n), "{n} attempts");
}

#[tokio::test]
async fn if_match_on_a_missing_key_404_is_a_conflict() {
    let (ep, seen) = canned_server(vec![error(404, "NoSuchKey")]).await;
    let s = store(&ep).await;
    let r = s
        .put_cas("t/manifest.json", Bytes::from_static(b"{}"), "\"e1\"")
        .await;
    assert!(matches!(r, Err(ArchiveError::CasConflict { .. })), "{r:?}");
    let seen = seen.locked();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header("if-match"), Some("\"e1\""));
    assert_eq!(seen[0].header("if-none-match"), None);
}

#[tokio::test]
async fn precondition_failed_is_a_conflict_without_retry() {
    let (ep, seen) = canned_server(vec![error(412, "PreconditionFailed")]).await;
    let s = store(&ep).await;
    let r = s
        .put_cas("t/manifest.json", Bytes::from_static(b"{}"), "")
        .await;
    assert!(matches!(r, Err(ArchiveError::CasConflict { .. })), "{r:?}");
    assert_eq!(seen.locked().len(), 1);
}

#[tokio::test]
async fn a_missing_bucket_is_an_error_but_a_missing_key_is_none() {
    let (ep, _) = canned_server(vec![error(404, "NoSuchKey"), error(404, "NoSuchBucket")]).await;
    let s = store(&ep).await;
    assert!(s.get("t/manifest.json").await.unwrap().is_none());
    let err = s.get("t/manifest.json").await.unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("s3://bkt/pre/t/manifest.json"), "{msg}");
    assert!(msg.contains("NoSuchBucket"), "{msg}");
}

#[tokio::test]
async fn put_cas_on_404_without_if_match_is_an_error() {
    // Must-not-exist writes never see NoSuchKey from AWS; a 404 there means something else
    // (a missing bucket) and must not pass for a conflict.
    let (ep, _) = canned_server(vec![error(404, "NoSuchBucket")]).await;
    let s = store(&ep).await;
    let r = s
        .put_cas("t/manifest.json", Bytes::from_static(b"{}"), "")
        .await;
    assert!(matches!(r, Err(ArchiveError::Storage { .. })), "{r:?}");
}

#[tokio::test]
async fn list_follows_continuation_tokens_and_strips_the_prefix() {
    let (ep, seen) = canned_server(vec![
        list_page(&[("pre/t/a", 1), ("pre/t/b", 2)], Some("tok-1")),
        list_page(&[("pre/t/c", 3)], Some("tok-2")),
        list_page(&[("pre/t/d", 4)], None),
    ])
    .await;
    let s = store(&ep).await;
    let listed = s.list("t/").await.unwrap();
    let got: Vec<(&str, u64)> = listed.iter().map(|o| (o.key.as_str(), o.size)).collect();
    assert_eq!(got, vec![("t/a", 1), ("t/b", 2), ("t/c", 3), ("t/d", 4)]);
    assert!(listed.iter().all(|o| o.modified.is_some()));
    let seen = seen.locked();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(
        seen[0].path.contains("prefix=pre%2Ft%2F"),
        "{}",
        seen[0].path
    );
    assert!(
        !seen[0].path.contains("continuation-token"),
        "{}",
        seen[0].path
    );
    assert!(
        seen[1].path.contains("continuation-token=tok-1"),
        "{}",
        seen[1].path
    );
    assert!(
        seen[2].path.contains("continuation-token=tok-2"),
        "{}",
        seen[2].path
    );
}
