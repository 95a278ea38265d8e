use super::*;
use larch_archive::fixtures::{art, manifest};
use larch_archive::manifest::{ArtifactKind, now_utc};

#[test]
fn behind_counts_the_undelivered_diffs_and_their_bytes() {
    let mut older = art(ArtifactKind::Diff, 1, Some("0/10"), "0/20");
    older.created_at = now_utc() - chrono::Duration::seconds(30);
    let mut newer = art(ArtifactKind::Diff, 1, Some("0/20"), "0/30");
    for (d, size) in [(&mut older, 700), (&mut newer, 300)] {
        for format in ["jsonl", "protobuf"] {
            d.formats.insert(
                format.into(),
                larch_archive::manifest::FormatRef {
                    uri: String::new(),
                    size_bytes: size,
                    sha256: None,
                },
            );
        }
    }
    let b = Behind::of(&[older, newer]);
    // One format's size per diff, the oldest diff's age.
    assert_eq!((b.diffs, b.bytes), (2, 1000));
    assert!((29.0..60.0).contains(&b.seconds()), "{}", b.seconds());
    let caught_up = Behind::of(&[]);
    assert_eq!(
        (caught_up.diffs, caught_up.bytes, caught_up.seconds()),
        (0, 0, 0.0)
    );
}

#[test]
fn steps_detect_replacement_whatever_the_order() {
    let m = manifest(
        vec![
            art(ArtifactKind::Snapshot, 1, None, "0/10"),
            art(ArtifactKind::Diff, 1, Some("0/10"), "0/20"),
        ],
        "0/20",
    );
    assert!(matches!(next_step(&m, "0/10", Some(1)), Step::Diffs(d) if d.len() == 1));
    assert!(matches!(next_step(&m, "0/20", Some(1)), Step::UpToDate));
    // Head lower than ours.
    assert!(matches!(next_step(&m, "0/30", Some(1)), Step::Replaced(_)));
    // A new epoch at a higher position that does not continue us.
    let m2 = manifest(
        vec![
            art(ArtifactKind::Snapshot, 1, None, "0/10"),
            art(ArtifactKind::Diff, 1, Some("0/10"), "0/20"),
            art(ArtifactKind::Snapshot, 2, None, "0/15"),
            art(ArtifactKind::Diff, 2, Some("0/15"), "0/40"),
        ],
        "0/40",
    );
    assert!(matches!(next_step(&m2, "0/20", Some(1)), Step::Replaced(_)));
    // A new epoch at exactly our position but another lineage.
    let m3 = manifest(vec![art(ArtifactKind::Snapshot, 2, None, "0/020")], "0/20");
    assert!(matches!(next_step(&m3, "0/20", Some(2)), Step::UpToDate));
    assert!(matches!(
        next_step(&m3, "0/20", Some(1)),
        Step::UpToDate // the new snapshot sits on our position: same lineage
    ));
    let m4 = manifest(
        vec![
            art(ArtifactKind::Snapshot, 2, None, "0/5"),
            art(ArtifactKind::Diff, 2, Some("0/5"), "0/18"),
        ],
        "0/20",
    );
    assert!(matches!(next_step(&m4, "0/20", Some(1)), Step::Replaced(_)));
    // Nothing yet.
    assert!(matches!(
        next_step(&manifest(vec![], ""), "", None),
        Step::UpToDate
    ));
    assert!(matches!(next_step(&m, "", None), Step::Replaced(_)));
}

#[test]
fn a_short_chain_is_followed_to_its_end_and_then_reported_not_rebaselined() {
    let m = manifest(
        vec![
            art(ArtifactKind::Snapshot, 1, None, "0/10"),
            art(ArtifactKind::Diff, 1, Some("0/10"), "0/20"),
            art(ArtifactKind::Diff, 1, Some("0/30"), "0/40"),
        ],
        "0/40",
    );
    assert!(matches!(next_step(&m, "0/10", Some(1)), Step::Diffs(d) if d.len() == 1));
    match next_step(&m, "0/20", Some(1)) {
        Step::Short(s) => assert_eq!((s.reached.as_str(), s.head.as_str()), ("0/20", "0/40")),
        other => panic!("{other:?}"),
    }
    // A new epoch that reaches its head replaces the short one.
    let mut m2 = m.clone();
    m2.artifacts
        .push(art(ArtifactKind::Snapshot, 2, None, "0/40"));
    m2.epoch = 2;
    assert!(matches!(next_step(&m2, "0/20", Some(1)), Step::Replaced(_)));
}

#[test]
fn inferred_columns_mark_only_explicit_keys() {
    let row = Row::parse(r#"{"b":1,"a":2,"id":3}"#).unwrap();
    let cols = infer_columns(&row, &[]);
    assert_eq!(
        cols.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        ["a", "b", "id"]
    );
    assert!(cols.iter().all(|c| !c.primary_key && c.nullable));
    assert_eq!(cols[2].ordinal_position, 3);
    let cols = infer_columns(&row, &["b".into(), "a".into()]);
    assert!(cols[1].primary_key && cols[1].primary_key_ordinal == 1);
    assert!(cols[0].primary_key && cols[0].primary_key_ordinal == 2);
    assert!(!cols[2].primary_key);
}

#[test]
fn state_file_is_written_atomically_into_a_new_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a/b/seed.pos");
    write_state_file(&path, "0/16B3748").unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "0/16B3748");
    write_state_file(&path, "0/2").unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "0/2");
    let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "{leftovers:?}");
}
