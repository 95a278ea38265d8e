use super::*;

fn sk(s: &str) -> SortKey {
    SortKey::new(s.into())
}

#[test]
fn sort_keys_are_a_total_order() {
    let mut v = vec![
        sk("10"),
        sk("9"),
        sk("-3"),
        sk("-20"),
        sk("1.5"),
        sk("abc"),
        sk("5a"),
        sk("[\"a\",\"1\"]"),
        sk("0"),
        sk("99999999999999999999"),
        sk("-99999999999999999999"),
        sk("9.5"),
    ];
    v.sort();
    let got: Vec<String> = v.iter().map(|k| k.text().into_owned()).collect();
    assert_eq!(
        got,
        [
            "-99999999999999999999",
            "-20",
            "-3",
            "0",
            "1.5",
            "9",
            "9.5",
            "10",
            "99999999999999999999",
            "5a",
            "[\"a\",\"1\"]",
            "abc"
        ]
    );
}

fn ev(action: Action, old: Option<&str>, new: Option<&str>) -> ChangeEvent {
    ChangeEvent {
        table: TableId::new("public", "t"),
        action,
        position: "0/1".into(),
        old: old.map(|r| Row::parse(r).unwrap()),
        new: new.map(|r| Row::parse(r).unwrap()),
        commit_time: None,
    }
}

/// Rebuilding the trees full during a baseline keeps every row, its order and its index
/// entries; a duplicate key is still refused after a rebuild; changes apply afterwards.
#[test]
fn a_baseline_rebuilt_full_keeps_its_rows_and_indexes() {
    let mut data = TableData::new(
        vec!["id".to_string()].into(),
        vec!["tenant".to_string()].into(),
    );
    data.compact_at = 10;
    let mut want = Vec::new();
    // Out of order, mixed identities, so the rebuilt trees are not just appends.
    for i in (1..=300).rev().chain(301..=600) {
        let text = format!(r#"{{"id":{i},"tenant":"t{}"}}"#, i % 7);
        data.insert_baseline(Row::parse(&text).unwrap()).unwrap();
        want.push((i, text));
    }
    assert!(
        data.compact_at > 600,
        "rebuilt several times: {}",
        data.compact_at
    );
    want.sort();
    let got: Vec<String> = data.rows.values().map(|r| data.text(r)).collect();
    let want_texts: Vec<String> = want.iter().map(|(_, t)| t.clone()).collect();
    assert_eq!(got, want_texts);
    for t in 0..7 {
        let ids: Vec<String> = data.indexes[0][format!("t{t}").as_str()]
            .iter()
            .map(|k| k.text().into_owned())
            .collect();
        let expect: Vec<String> = (1..=600)
            .filter(|i| i % 7 == t)
            .map(|i| i.to_string())
            .collect();
        assert_eq!(ids, expect, "tenant t{t}");
    }
    let e = data
        .insert_baseline(Row::parse(r#"{"id":42,"tenant":"x"}"#).unwrap())
        .unwrap_err();
    assert!(e.contains("share a value of the key"), "{e}");
    data.compact();
    data.apply(&ev(Action::Delete, Some(r#"{"id":42}"#), None));
    assert_eq!(data.len(), 599);
    assert!(!data.indexes[0]["t0"].contains(&sk("42")));
}

#[tokio::test]
async fn indexes_follow_changes_and_pages_are_stable() {
    let t = MemoryTarget::new(TableId::new("public", "t"), vec!["tenant".into()]);
    t.init(&[], &["id".into()]).await.unwrap();
    t.begin_baseline().await.unwrap();
    let rows: Vec<Row> = (1..=25)
        .map(|i| Row::parse(&format!(r#"{{"id":{i},"tenant":"t{}"}}"#, i % 3)).unwrap())
        .collect();
    t.baseline_rows(rows).await.unwrap();
    assert_eq!(t.len(), 0, "aside until committed");
    t.commit_baseline("0/1").await.unwrap();
    assert_eq!(t.len(), 25);
    // Paginate everything in pages of 10.
    let mut after: Option<String> = None;
    let mut ids = Vec::new();
    loop {
        let mut p = vec![("limit".to_string(), "10".to_string())];
        if let Some(a) = &after {
            p.push(("after".into(), a.clone()));
        }
        let body: serde_json::Value = serde_json::from_str(&t.page(&p).unwrap()).unwrap();
        for r in body["rows"].as_array().unwrap() {
            ids.push(r["id"].as_i64().unwrap());
        }
        match body["next"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => break,
        }
    }
    assert_eq!(ids, (1..=25).collect::<Vec<_>>());
    // Filter; index follows an update that moves a row to another tenant.
    t.apply(&ev(
        Action::Update,
        Some(r#"{"id":3,"tenant":"t0"}"#),
        Some(r#"{"id":3,"tenant":"t1"}"#),
    ))
    .await
    .unwrap();
    let body: serde_json::Value =
        serde_json::from_str(&t.page(&[("tenant".into(), "t0".into())]).unwrap()).unwrap();
    let ids: Vec<i64> = body["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [6, 9, 12, 15, 18, 21, 24]);
    let e = t.page(&[("kind".into(), "x".into())]).unwrap_err();
    assert!(e.0.contains("\"kind\" is not indexed"), "{e:?}");
    // Delete, get by key.
    t.apply(&ev(Action::Delete, Some(r#"{"id":6}"#), None))
        .await
        .unwrap();
    assert_eq!(t.get(&[("id".into(), "6".into())]).unwrap(), None);
    assert_eq!(
        t.get(&[("id".into(), "3".into())]).unwrap().unwrap(),
        r#"{"id":3,"tenant":"t1"}"#
    );
    assert!(t.get(&[]).is_err());
    t.apply(&ev(Action::Truncate, None, None)).await.unwrap();
    assert_eq!(t.len(), 0);
    assert!(t.live.read_locked().indexes[0].is_empty());
}

/// Issue 14 item 9: a cursor not made by a `next` field (valid base64 of anything else, a
/// cut one, another table's) and a repeated parameter are 400s, not a quiet answer.
#[tokio::test]
async fn forged_cursors_and_repeated_parameters_are_refused() {
    let table = TableId::new("public", "t");
    let t = MemoryTarget::new(table.clone(), vec!["tenant".into()]);
    t.init(&[], &["id".into()]).await.unwrap();
    t.begin_baseline().await.unwrap();
    let rows: Vec<Row> = (1..=5)
        .map(|i| Row::parse(&format!(r#"{{"id":{i},"tenant":"a"}}"#)).unwrap())
        .collect();
    t.baseline_rows(rows).await.unwrap();
    t.commit_baseline("0/1").await.unwrap();
    let p = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let body: serde_json::Value =
        serde_json::from_str(&t.page(&p(&[("limit", "2")])).unwrap()).unwrap();
    let next = body["next"].as_str().unwrap().to_string();
    let page2: serde_json::Value =
        serde_json::from_str(&t.page(&p(&[("limit", "2"), ("after", &next)])).unwrap()).unwrap();
    assert_eq!(page2["rows"][0]["id"], 3);
    let b64 = |s: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let other = encode_cursor(&TableId::new("public", "u"), &SortKey::new("2".into()));
    for forged in [
        b64(b"2"),
        b64(b"hello"),
        next[..next.len() - 2].to_string(),
        other,
    ] {
        let e = t.page(&p(&[("after", &forged)])).unwrap_err();
        assert!(
            e.0.contains("is not a cursor from a `next` field of public.t"),
            "{forged}: {e:?}"
        );
    }
    let e = t.get(&p(&[("id", "1"), ("id", "2")])).unwrap_err();
    assert!(e.0.contains("\"id\" is given more than once"), "{e:?}");
    for params in [
        p(&[("limit", "1"), ("limit", "2")]),
        p(&[("after", &next), ("after", &next)]),
        p(&[("tenant", "a"), ("tenant", "b")]),
    ] {
        let e = t.page(&params).unwrap_err();
        assert!(e.0.contains("is given more than once"), "{params:?}: {e:?}");
    }
}

/// A baseline with two rows of the same key values is refused (the key fields do not
/// identify rows), never merged into fewer rows.
#[tokio::test]
async fn a_baseline_with_a_repeated_key_is_refused() {
    let t = MemoryTarget::new(TableId::new("public", "t"), vec![]);
    t.init(&[], &["tenant".into()]).await.unwrap();
    t.begin_baseline().await.unwrap();
    let rows: Vec<Row> = [r#"{"id":1,"tenant":"a"}"#, r#"{"id":2,"tenant":"a"}"#]
        .iter()
        .map(|r| Row::parse(r).unwrap())
        .collect();
    let e = t.baseline_rows(rows).await.unwrap_err().to_string();
    assert!(
        e.contains("share a value of the key (tenant)") && !e.contains("\"a\""),
        "{e}"
    );
    t.abort_baseline().await;
    assert_eq!(t.len(), 0);
}
