use super::*;

async fn store(prefix: &str) -> S3Store {
    let mut cfg = S3Config::new("bucket", prefix);
    cfg.endpoint = Some("http://127.0.0.1:9".into());
    cfg.path_style = true;
    S3Store::new(cfg).await.expect("builds without network")
}

#[tokio::test]
async fn names_and_uris_concatenate_the_prefix_verbatim() {
    let s = store("arch/").await;
    assert_eq!(s.name(), "s3://bucket/arch/");
    assert_eq!(s.uri("t/manifest.json"), "s3://bucket/arch/t/manifest.json");
    let s = store("").await;
    assert_eq!(s.uri("a"), "s3://bucket/a");
    let s = store("p-").await;
    assert_eq!(s.uri("a"), "s3://bucket/p-a");
}

#[tokio::test]
async fn bad_configs_are_refused_naming_the_problem() {
    let err = S3Store::new(S3Config::new("", "")).await.unwrap_err();
    assert!(err.to_string().contains("bucket is required"), "{err}");
    let err = S3Store::new(S3Config::new("b", "../x/")).await.unwrap_err();
    assert!(err.to_string().contains("s3://b"), "{err}");
    let mut cfg = S3Config::new("b", "");
    cfg.credentials = S3Credentials::Files {
        access_key_id_file: "/nonexistent/larch/id".into(),
        secret_access_key_file: "/nonexistent/larch/secret".into(),
        session_token_file: None,
    };
    let err = S3Store::new(cfg).await.unwrap_err();
    assert!(err.to_string().contains("/nonexistent/larch/id"), "{err}");
}

/// A credential with a control character inside is refused by where it came from, never
/// shown (the SDK would panic signing with it).
#[test]
fn credentials_with_control_characters_are_refused_unshown() {
    let dir = tempfile::tempdir().unwrap();
    let id = dir.path().join("id");
    std::fs::write(&id, "AKID\r\nSECRETPART\n").unwrap();
    let e = read_secret_file("access key id", &id)
        .unwrap_err()
        .to_string();
    assert!(e.contains("holds a line break") && e.contains("/id"), "{e}");
    assert!(!e.contains("AKID") && !e.contains("SECRETPART"), "{e}");
    std::fs::write(&id, "AKIDLARCH\n").unwrap();
    assert_eq!(read_secret_file("access key id", &id).unwrap(), "AKIDLARCH");
    let e = refuse_control_characters("AWS_SECRET_ACCESS_KEY", "abc\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("AWS_SECRET_ACCESS_KEY holds a line break"),
        "{e}"
    );
}

#[tokio::test]
async fn debug_output_hides_the_client() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("id"), "AKIDLARCHTEST\n").unwrap();
    std::fs::write(dir.path().join("secret"), "s3cr3t-value-never-printed\n").unwrap();
    let mut cfg = S3Config::new("b", "p/");
    cfg.credentials = S3Credentials::Files {
        access_key_id_file: dir.path().join("id"),
        secret_access_key_file: dir.path().join("secret"),
        session_token_file: None,
    };
    let s = S3Store::new(cfg).await.unwrap();
    let dbg = format!("{s:?}");
    assert!(!dbg.contains("s3cr3t"), "{dbg}");
    assert!(dbg.contains("bucket"), "{dbg}");
}

#[tokio::test]
async fn keys_escaping_the_prefix_are_refused_before_any_request() {
    let s = store("arch/").await;
    for k in ["../other/x", "/abs", "a/./b"] {
        let err = s.get(k).await.unwrap_err();
        assert!(
            matches!(err, ArchiveError::KeyEscapesRoot { .. }),
            "{k}: {err}"
        );
    }
}
