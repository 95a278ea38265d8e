use super::*;

fn spill(dir: &Path, memory: u64) -> Arc<Spill> {
    Spill::open(
        SpillConfig {
            dir: dir.to_path_buf(),
            memory_limit: memory,
            disk_limit: 0,
        },
        "t",
    )
}

fn upsert(id: i64, v: &str) -> Entry {
    Entry {
        action: Action::Update,
        old: None,
        new: Some(Row::parse(&format!(r#"{{"id":{id},"v":"{v}"}}"#)).unwrap()),
    }
}

fn collect(b: &ChangeBuffer) -> Vec<(String, Entry)> {
    b.merged()
        .unwrap()
        .map(|r| r.map(|(id, e)| (id.to_string(), e)))
        .collect::<Result<_>>()
        .unwrap()
}

#[test]
fn sizes_parse_like_kubernetes_quantities() {
    assert_eq!(parse_size("64Mi").unwrap(), 64 << 20);
    assert_eq!(parse_size("1.5Gi").unwrap(), 3 << 29);
    assert_eq!(parse_size("500M").unwrap(), 500_000_000);
    assert_eq!(parse_size("4096").unwrap(), 4096);
    assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
    // the SI spellings people write (64MB was refused while 64M passed)
    assert_eq!(parse_size("64MB").unwrap(), 64_000_000);
    assert_eq!(parse_size("1.5 GB").unwrap(), 1_500_000_000);
    assert_eq!(parse_size("512kB").unwrap(), 512_000);
    assert_eq!(parse_size("100B").unwrap(), 100);
    assert!(
        parse_size("12 parsecs")
            .unwrap_err()
            .contains("unknown size unit")
    );
    assert!(parse_size("Mi").is_err());
}

/// The merge of spilled runs equals collapsing everything in memory, whatever the budget.
#[test]
fn spilled_runs_merge_to_the_newest_entry_per_identity() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7);
    let mut expected: BTreeMap<String, Entry> = BTreeMap::new();
    let s = spill(dir.path(), 0);
    let mut b = ChangeBuffer::new(s.clone());
    for i in 0..20_000u32 {
        let id = rand::Rng::random_range(&mut rng, 0..3_000i64);
        let e = if i % 7 == 0 {
            Entry {
                action: Action::Delete,
                old: Some(Row::parse(&format!(r#"{{"id":{id}}}"#)).unwrap()),
                new: None,
            }
        } else {
            upsert(id, &format!("v{i}"))
        };
        expected.insert(id.to_string(), e.clone());
        b.insert_within(id.to_string().into(), e, 16 * 1024)
            .unwrap();
    }
    assert!(b.has_runs());
    assert!(
        b.runs.len() < 4 * FAN_IN,
        "runs are merged ahead: {}",
        b.runs.len()
    );
    assert!(s.stats().runs_written.load(Ordering::Relaxed) > FAN_IN as u64);
    let got = collect(&b);
    assert_eq!(got.len(), expected.len());
    assert_eq!(got, expected.into_iter().collect::<Vec<_>>());
    // Dropping the buffer deletes its runs; the spill's directory stays until the spill goes.
    let live = s.live_dir().unwrap();
    assert!(!run_files(&live).is_empty());
    drop(b);
    assert!(run_files(&live).is_empty());
    assert_eq!(s.stats().disk_bytes.load(Ordering::Relaxed), 0);
    assert_eq!(s.stats().memory_bytes.load(Ordering::Relaxed), 0);
    drop(s);
    assert!(!live.exists());
}

#[test]
fn append_keeps_age_order_and_truncate_resets() {
    let dir = tempfile::tempdir().unwrap();
    let s = spill(dir.path(), 0);
    let mut committed = ChangeBuffer::new(s.clone());
    committed.insert("1".into(), upsert(1, "old"));
    committed.insert("2".into(), upsert(2, "old"));
    committed.spill().unwrap();
    committed.insert("3".into(), upsert(3, "memory"));
    let mut txn = ChangeBuffer::new(s.clone());
    txn.insert("1".into(), upsert(1, "txn-run"));
    txn.spill().unwrap();
    txn.insert("3".into(), upsert(3, "txn-memory"));
    committed.append(txn).unwrap();
    let got: Vec<String> = collect(&committed)
        .into_iter()
        .map(|(_, e)| e.new.unwrap().as_str().to_string())
        .collect();
    assert_eq!(
        got,
        [
            r#"{"id":1,"v":"txn-run"}"#,
            r#"{"id":2,"v":"old"}"#,
            r#"{"id":3,"v":"txn-memory"}"#
        ]
    );
    let mut txn = ChangeBuffer::new(s.clone());
    txn.truncate();
    txn.insert("9".into(), upsert(9, "after"));
    committed.append(txn).unwrap();
    assert!(committed.truncated());
    assert_eq!(collect(&committed).len(), 1);
    assert!(
        run_files(dir.path()).is_empty(),
        "the truncate deleted the runs"
    );
}

#[test]
fn the_disk_limit_is_a_clear_error_and_leaves_no_partial_run() {
    let dir = tempfile::tempdir().unwrap();
    let s = Spill::open(
        SpillConfig {
            dir: dir.path().to_path_buf(),
            memory_limit: 0,
            disk_limit: 4096,
        },
        "t",
    );
    let mut b = ChangeBuffer::new(s.clone());
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1);
    for i in 0..5_000i64 {
        // Random text does not compress: the limit is reached for sure.
        let noise: String = (0..40)
            .map(|_| rand::Rng::random_range(&mut rng, b'a'..=b'z') as char)
            .collect();
        b.insert(i.to_string().into(), upsert(i, &noise));
    }
    let e = b.spill().unwrap_err();
    let text = e.to_string();
    assert!(text.contains("spill limit of 4096 bytes"), "{text}");
    assert!(text.contains(&dir.path().display().to_string()), "{text}");
    assert!(run_files(dir.path()).is_empty());
    assert_eq!(s.stats().disk_bytes.load(Ordering::Relaxed), 0);
    // Nothing was lost: memory still holds every entry.
    assert_eq!(b.depth(), 5_000);
}

#[test]
fn a_dead_process_directory_is_swept_and_a_live_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    // Left behind by a process that died: a directory with a free lock and a run.
    let stale = dir.path().join("t-00000000000000aa");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("lock"), "").unwrap();
    std::fs::write(stale.join("run-000000.zst"), "x").unwrap();
    // Another archive's directory: never touched.
    let other = dir.path().join("u-00000000000000bb");
    std::fs::create_dir_all(&other).unwrap();
    let live = spill(dir.path(), 0);
    let mut b = ChangeBuffer::new(live.clone());
    b.insert("1".into(), upsert(1, "x"));
    b.spill().unwrap();
    assert!(!stale.exists());
    assert!(other.exists());
    // A second spill of the same archive (same process) sees the lock held.
    let _second = spill(dir.path(), 0);
    assert!(live.live_dir().unwrap().exists());
    assert_eq!(collect(&b).len(), 1);
}
