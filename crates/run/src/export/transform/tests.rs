use super::*;

fn key() -> Arc<TransformKey> {
    Arc::new(TransformKey::from_bytes(b"0123456789abcdef-test-key\n", "test").unwrap())
}

fn col(name: &str, ty: &str, pk: bool) -> ColumnDefinition {
    ColumnDefinition {
        name: name.into(),
        type_name: ty.into(),
        nullable: !pk,
        primary_key: pk,
        primary_key_ordinal: i64::from(pk),
        ..Default::default()
    }
}

fn users() -> Vec<ColumnDefinition> {
    vec![
        col("id", "int8", true),
        col("email", "text", false),
        col("name", "varchar", false),
        col("ssn", "text", false),
        col("note", "text", false),
        col("token", "uuid", false),
        col("born", "date", false),
    ]
}

const RULES: &str = r#"
tables:
  public.users:
    columns:
      id: hash
      email: hash
      name: {redact: "REDACTED"}
      ssn: drop
      note: null
      token: hash
  public.orders:
    undeclared: "null"
    columns:
      id: keep
      user_id: hash
"#;

fn users_transform() -> TableTransform {
    let rules = TransformRules::parse(RULES, "test.yaml").unwrap();
    rules
        .compile(
            &TableId::new("public", "users"),
            &users(),
            &["id".into()],
            Some(key()),
        )
        .unwrap()
}

#[test]
fn every_transform_applies_to_its_column() {
    let t = users_transform();
    let row = Row::parse(
            r#"{"id":42,"email":"alice.smith@example.com","name":"Alice","ssn":"123-45-6789","note":"private","token":"6F9619FF-8B86-D011-B42D-00CF4FC964FF","born":"1990-01-02"}"#,
        )
        .unwrap();
    let out = t.apply(row.clone()).unwrap();
    let m = out.to_map();
    assert!(!m.contains_key("ssn"), "{out:?}");
    assert_eq!(m["note"].get(), "null");
    assert_eq!(m["name"].get(), r#""REDACTED""#);
    assert_eq!(m["born"].get(), "null", "undeclared is null by default");
    let kept = TransformRules::parse(
        &RULES.replace(
            "  public.users:\n",
            "  public.users:\n    undeclared: keep\n",
        ),
        "test.yaml",
    )
    .unwrap()
    .compile(
        &TableId::new("public", "users"),
        &users(),
        &["id".into()],
        Some(key()),
    )
    .unwrap();
    let kept_row = kept.apply(row.clone()).unwrap();
    assert_eq!(
        kept_row.to_map()["born"].get(),
        r#""1990-01-02""#,
        "undeclared: keep"
    );
    assert_eq!(kept.record().undeclared, "keep");
    assert!(
        kept.record()
            .undeclared_columns
            .contains(&"born".to_string())
    );
    let id: i64 = m["id"].get().parse().unwrap();
    assert_ne!(id, 42);
    assert!(id >= 0);
    let email: String = serde_json::from_str(m["email"].get()).unwrap();
    assert_ne!(email, "alice.smith@example.com");
    let (local, domain) = email.split_once('@').unwrap();
    assert_eq!(local.len(), "alice.smith".len());
    assert_eq!(&local[5..6], ".");
    assert!(
        domain.ends_with(".com") && domain.len() == "example.com".len(),
        "{email}"
    );
    let token: String = serde_json::from_str(m["token"].get()).unwrap();
    assert_eq!(token.len(), 36);
    assert_eq!(&token[14..15], "4", "version 4: {token}");
    assert!(!token.eq_ignore_ascii_case("6F9619FF-8B86-D011-B42D-00CF4FC964FF"));
    // Deterministic: the same row gives the same output.
    assert_eq!(t.apply(row).unwrap(), out);
    // Columns: the dropped one is gone; the record names every column's transform.
    let cols = t.columns(&users());
    assert!(!cols.iter().any(|c| c.name == "ssn"));
    assert_eq!(cols.len(), users().len() - 1);
    let rec = t.record();
    assert_eq!(rec.columns["ssn"], "drop");
    assert_eq!(rec.columns["born"], "null");
    assert_eq!(
        rec.undeclared_columns,
        ["born"],
        "the columns the rules did not name"
    );
    assert!(
        rec.uncovered(["id", "born", "later"]).is_empty(),
        "undeclared: null covers"
    );
    assert_eq!(
        kept.record().uncovered(["id", "born", "later"]),
        ["born", "later"]
    );
    assert_eq!(rec.columns["name"], "redact");
    assert_eq!(rec.key_id.as_deref(), Some(key().id()));
    assert!(rec.masks_anything());
    // NULL stays NULL.
    let nulls = t
        .apply(Row::parse(r#"{"id":1,"email":null}"#).unwrap())
        .unwrap();
    assert_eq!(nulls.get("email").unwrap().get(), "null");
}

#[test]
fn the_same_value_hashes_alike_in_two_tables() {
    let rules = TransformRules::parse(RULES, "test.yaml").unwrap();
    let users = users_transform();
    let orders = rules
        .compile(
            &TableId::new("public", "orders"),
            &[
                col("id", "int8", true),
                col("user_id", "int8", false),
                col("total", "numeric", false),
            ],
            &["id".into()],
            Some(key()),
        )
        .unwrap();
    let u = users.apply(Row::parse(r#"{"id":7}"#).unwrap()).unwrap();
    let o = orders
        .apply(Row::parse(r#"{"id":1,"user_id":7,"total":"9.50"}"#).unwrap())
        .unwrap();
    assert_eq!(u.get("id").unwrap().get(), o.get("user_id").unwrap().get());
    assert_eq!(o.get("id").unwrap().get(), "1", "kept");
    assert_eq!(o.get("total").unwrap().get(), "null", "undeclared: null");
    // A field the validated columns lacked (a column added later) is masked too.
    let later = orders
        .apply(Row::parse(r#"{"id":1,"secret":"raw"}"#).unwrap())
        .unwrap();
    assert_eq!(later.get("secret").unwrap().get(), "null");
    // Another key gives other outputs, and another id.
    let other = Arc::new(TransformKey::from_bytes(b"another key of 16+ bytes", "t").unwrap());
    assert_ne!(other.id(), key().id());
    assert_ne!(hash_int(&other, 7, 64), hash_int(&key(), 7, 64));
}

/// Known answers: a hashed value changes only with the key or with [`HASH_ALGORITHM`]
/// (whose change starts a new epoch). Text, uuid and fake are as in version 1.
#[test]
fn hashed_values_are_pinned_to_the_algorithm_version() {
    let k = key();
    assert_eq!(HASH_ALGORITHM, "larch-hash-2");
    let got = (
        hash_int(&k, 42, 64),
        hash_int(&k, -7, 32),
        hash_int(&k, 3, 16),
        hash_text(&k, "alice.smith@example.com"),
        hash_uuid(&k, "6F9619FF-8B86-D011-B42D-00CF4FC964FF"),
        FakeKind::City.generate(&k.tag(b"fake", b"tenant-1"), 0),
    );
    let pinned = (
        5516571728129393280,
        -132412500,
        25013,
        "mpiqx.eiyrz@syjuapn.com".to_string(),
        "e1121f3a-998d-4c11-be0c-48c99ec827f0".to_string(),
        "Shelby".to_string(),
    );
    assert_eq!(got, pinned);
}

#[test]
fn integers_are_permuted_within_their_range_and_sign() {
    let k = key();
    // int2: every non-negative value maps into range, no two alike (a permutation).
    let mut seen = std::collections::HashSet::new();
    for n in 0..=i64::from(i16::MAX) {
        let h = hash_int(&k, n, 16);
        assert!((0..=i64::from(i16::MAX)).contains(&h), "{n} -> {h}");
        assert!(seen.insert(h), "collision at {n}");
    }
    for n in [-1, -2, i64::from(i16::MIN)] {
        let h = hash_int(&k, n, 16);
        assert!((i64::from(i16::MIN)..0).contains(&h), "{n} -> {h}");
    }
    for n in [0, 1, 2, i64::from(i32::MAX), -1, i64::from(i32::MIN)] {
        let h = hash_int(&k, n, 32);
        assert!((i64::from(i32::MIN)..=i64::from(i32::MAX)).contains(&h));
        assert_eq!(h >= 0, n >= 0);
    }
    for n in [0, 1, i64::MAX, -1, i64::MIN] {
        let h = hash_int(&k, n, 64);
        assert_eq!(h >= 0, n >= 0, "{n} -> {h}");
        assert_eq!(h, hash_int(&k, n, 64));
    }
    // Different widths are different permutations, each deterministic.
    let distinct: std::collections::HashSet<i64> = (1..1000).map(|n| hash_int(&k, n, 32)).collect();
    assert_eq!(distinct.len(), 999);
}

#[test]
fn text_keeps_its_shape() {
    let k = key();
    let h = hash_text(&k, "Ab-12 xy");
    assert_eq!(h.len(), 8);
    let b = h.as_bytes();
    assert!(b[0].is_ascii_uppercase() && b[1].is_ascii_lowercase());
    assert_eq!(b[2], b'-');
    assert!(b[3].is_ascii_digit() && b[4].is_ascii_digit());
    assert_eq!(b[5], b' ');
    assert_ne!(h, "Ab-12 xy");
    assert_eq!(hash_text(&k, "Ab-12 xy"), h);
    // Long text draws more than one block of keyed bytes.
    let long = "x".repeat(100);
    let hl = hash_text(&k, &long);
    assert_eq!(hl.len(), 100);
    assert!(hl.bytes().all(|c| c.is_ascii_lowercase()));
    // One domain stays one domain.
    let (_, d1) = hash_text(&k, "a@corp.io")
        .split_once('@')
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .unwrap();
    let (_, d2) = hash_text(&k, "bob@corp.io")
        .split_once('@')
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .unwrap();
    assert_eq!(d1, d2);
    assert_ne!(d1, "corp.io");
    // uuid: case does not matter, as PostgreSQL compares uuids.
    assert_eq!(
        hash_uuid(&k, "6f9619ff-8b86-d011-b42d-00cf4fc964ff"),
        hash_uuid(&k, "6F9619FF-8B86-D011-B42D-00CF4FC964FF")
    );
}

#[test]
fn fakes_are_deterministic_realistic_and_fit_the_column() {
    let rules = TransformRules::parse(
        r#"
tables:
  public.users:
    columns:
      id: keep
      email: {fake: email}
      name: {fake: full_name}
      note: {fake: city}
  public.contacts:
    columns:
      id: keep
      mail: {fake: email}
      phone: {fake: phone}
"#,
        "fake.yaml",
    )
    .unwrap();
    assert!(rules.hashes(), "a fake needs the key");
    let mut cols = users();
    cols[2].max_length = 12; // name varchar(12): fakes are cut to fit
    let users_t = rules
        .compile(
            &TableId::new("public", "users"),
            &cols,
            &["id".into()],
            Some(key()),
        )
        .unwrap();
    let contacts = rules
        .compile(
            &TableId::new("public", "contacts"),
            &[
                col("id", "int4", true),
                col("mail", "varchar", false),
                col("phone", "text", false),
            ],
            &["id".into()],
            Some(key()),
        )
        .unwrap();
    assert_eq!(users_t.record().columns["email"], "fake:email");
    assert_eq!(users_t.record().key_id.as_deref(), Some(key().id()));
    let row = r#"{"id":1,"email":"alice.smith@corp.io","name":"Alice Smith","note":"x"}"#;
    let u = users_t.apply(Row::parse(row).unwrap()).unwrap();
    let email: String = serde_json::from_str(u.get("email").unwrap().get()).unwrap();
    assert!(
        email.ends_with("@example.com")
            || email.ends_with("@example.org")
            || email.ends_with("@example.net"),
        "{email}"
    );
    assert!(!email.contains("alice.smith@corp"), "{email}");
    let name: String = serde_json::from_str(u.get("name").unwrap().get()).unwrap();
    assert!(
        name.chars().count() <= 12 && name != "Alice Smith",
        "{name}"
    );
    // Same input, same fake: in another table and on another run (a fresh key object).
    let c = contacts
        .apply(
            Row::parse(r#"{"id":9,"mail":"alice.smith@corp.io","phone":"+44 20 7946 0000"}"#)
                .unwrap(),
        )
        .unwrap();
    assert_eq!(c.get("mail").unwrap().get(), u.get("email").unwrap().get());
    let again = rules
        .compile(
            &TableId::new("public", "users"),
            &cols,
            &["id".into()],
            Some(key()),
        )
        .unwrap()
        .apply(Row::parse(row).unwrap())
        .unwrap();
    assert_eq!(again, u);
    let phone: String = serde_json::from_str(c.get("phone").unwrap().get()).unwrap();
    assert!(
        phone.starts_with("+1 ") && phone.contains("-555-01"),
        "{phone}"
    );
    // Another key, other fakes (for most inputs).
    let other = Arc::new(TransformKey::from_bytes(b"another key of 16+ bytes", "t").unwrap());
    let differ = (0..50)
        .filter(|i| {
            let v = serde_json::value::to_raw_value(&format!("user{i}@corp.io")).unwrap();
            let fake = |k: &Arc<TransformKey>| {
                Op::Fake(k.clone(), FakeKind::Email, 0)
                    .apply(&v)
                    .unwrap()
                    .unwrap()
            };
            fake(&key()).get() != fake(&other).get()
        })
        .count();
    assert!(differ > 40, "{differ}");
    // NULL stays NULL.
    let n = users_t
        .apply(Row::parse(r#"{"id":2,"email":null}"#).unwrap())
        .unwrap();
    assert_eq!(n.get("email").unwrap().get(), "null");
    // Type fit: a fake only goes into text, and a varchar too short for the kind is refused.
    let compile = |cols: &[ColumnDefinition]| {
        rules
            .compile(
                &TableId::new("public", "users"),
                cols,
                &["id".into()],
                Some(key()),
            )
            .unwrap_err()
            .to_string()
    };
    let mut short = users();
    short[1].max_length = 10;
    short[1].sql_type = "character varying(10)".into();
    let e = compile(&short);
    assert!(
            e.contains("column \"email\": a fake email needs at least 15 characters; the type character varying(10) holds 10"),
            "{e}"
        );
    let mut int = users();
    int[4].type_name = "int4".into();
    int[4].sql_type = "integer".into();
    let e = compile(&int);
    assert!(
        e.contains("column \"note\": fake makes text; the type integer is not"),
        "{e}"
    );
    let on_key = TransformRules::parse(
        "tables: {public.users: {columns: {id: {fake: city}}}}",
        "f.yaml",
    )
    .unwrap()
    .compile(
        &TableId::new("public", "users"),
        &users(),
        &["id".into()],
        Some(key()),
    )
    .unwrap_err()
    .to_string();
    assert!(
        on_key.contains("column \"id\" is a key field; `fake`"),
        "{on_key}"
    );
    let e = TransformRules::parse(
        "tables: {public.users: {columns: {email: {fake: ssn}}}}",
        "f.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("unknown fake \"ssn\": expected one of first_name, last_name"),
        "{e}"
    );
}

#[test]
fn bad_rules_are_clear_errors() {
    let rules = TransformRules::parse(RULES, "test.yaml").unwrap();
    let table = TableId::new("public", "users");
    let compile = |cols: &[ColumnDefinition], key: Option<Arc<TransformKey>>| {
        rules
            .compile(&table, cols, &["id".into()], key)
            .unwrap_err()
            .to_string()
    };
    let mut cols = users();
    cols.retain(|c| c.name != "email");
    let e = compile(&cols, Some(key()));
    assert!(
        e.contains("table public.users: column \"email\" does not exist"),
        "{e}"
    );
    let mut cols = users();
    cols[1].type_name = "jsonb".into();
    cols[1].sql_type = "jsonb".into();
    let e = compile(&cols, Some(key()));
    assert!(
        e.contains("column \"email\": hash cannot keep the type jsonb"),
        "{e}"
    );
    let e = compile(&users(), None);
    assert!(e.contains("column \"id\": hash needs a key"), "{e}");
    let e = rules
        .compile(&TableId::new("public", "other"), &users(), &[], Some(key()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no entry for table public.other"), "{e}");
    let drop_key =
        TransformRules::parse("tables: {public.users: {columns: {id: drop}}}", "f.yaml").unwrap();
    let e = drop_key
        .compile(&table, &users(), &["id".into()], None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("column \"id\" is a key field; `drop`"), "{e}");
    let e = TransformRules::parse("tables: {public.users: {columns: {id: sha1}}}", "f.yaml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("f.yaml") && e.contains("sha1"), "{e}");
    let e = TransformRules::parse("tables: {users: {}}", "f.yaml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"users\" must be schema.table"), "{e}");
    let bad_redact = TransformRules::parse(
        "tables: {public.users: {columns: {id: {redact: x}}}}",
        "f.yaml",
    )
    .unwrap();
    let e = bad_redact
        .compile(&table, &users(), &[], None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("redact constant \"x\" does not fit the type int8"),
        "{e}"
    );
    let e = TransformKey::from_bytes(b"short\n", "file k")
        .unwrap_err()
        .to_string();
    assert!(e.contains("file k has 5 byte(s)"), "{e}");
}

/// A masked baseline row written by the encoder is byte for byte the row the transform
/// makes of the unmasked one (the path changes take), for every op, NULLs, escapes and a
/// column the transform was not compiled for (the undeclared policy).
#[test]
fn the_encoder_masks_as_the_transform_does() {
    use larch_archive::model::ColumnDefinition;
    use larch_archive::model::TableId;
    use larch_postgres::{TableSchema, encode_copy_lines};
    use std::sync::Arc;
    let col = |name: &str, ty: &str, oid: u32| ColumnDefinition {
        name: name.into(),
        type_name: ty.into(),
        nullable: name != "id",
        primary_key: name == "id",
        type_oid: oid,
        ..Default::default()
    };
    let columns = vec![
        col("id", "int8", 20),
        col("email", "text", 25),
        col("ref", "uuid", 2950),
        col("first", "text", 25),
        col("ssn", "text", 25),
        col("note", "text", 25),
        col("secret", "text", 25),
        col("payload", "jsonb", 3802),
        col("small", "int2", 21),
        col("born", "date", 1082),
        col("added", "text", 25),
    ];
    let rules = TransformRules::parse(
        r#"
tables:
  public.people:
    undeclared: {redact: "gone"}
    columns:
      id: hash
      email: hash
      ref: hash
      first: {fake: first_name}
      ssn: drop
      note: {redact: "REDACTED"}
      secret: null
      payload: keep
      small: hash
      born: keep
"#,
        "test.yaml",
    )
    .unwrap();
    let key = Arc::new(TransformKey::from_bytes(b"0123456789abcdef-test-key", "test").unwrap());
    // Compiled without `added`: a column that appeared after the rules were checked.
    let transform = rules
        .compile(
            &TableId::new("public", "people"),
            &columns[..columns.len() - 1],
            &["id".into()],
            Some(key),
        )
        .unwrap();
    let schema = TableSchema {
        id: TableId::new("public", "people"),
        type_oids: columns.iter().map(|c| c.type_oid).collect(),
        columns,
        type_mods: vec![],
        sql_types: vec![],
        generated: vec![],
        key_fields: vec!["id".into()],
        has_primary_key: true,
        replica_identity: 'd',
    };
    let mask = transform.baseline_mask(&schema.columns).unwrap();
    let lines = [
        "42\talice.smith@example.com\t6f9619ff-8b86-d011-b42d-00cf4fc964ff\tAlice\t123-45-6789\tprivate\ts3cr3t\t{\"a\": 1}\t7\t1990-01-02\tnew",
        "-9223372036854775808\tbob@corp.io\t6F9619FF-8B86-D011-B42D-00CF4FC964FF\tBo\\tb\t000\tx\ty\t[]\t-32768\t2000-02-29\tz",
        "0\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N",
        "9223372036854775807\tno-at-sign \\\\ \"quoted\"\t00000000-0000-0000-0000-000000000000\tÉlodie\t1\t2\t3\tnull\t32767\t2026-12-03\t",
    ];
    let plain = encode_copy_lines(&schema, None, &lines);
    let masked = encode_copy_lines(&schema, Some(Box::new(mask)), &lines);
    for ((line, plain), masked) in lines.iter().zip(plain).zip(masked) {
        let want = transform.apply(plain.unwrap()).unwrap();
        let got = masked.unwrap();
        assert_eq!(got.as_str(), want.as_str(), "line {line:?}");
        assert!(!got.as_str().contains("ssn"), "{got:?}");
    }
    // A hash on a value it cannot read fails naming the table and column, not the value.
    let mask = transform.baseline_mask(&schema.columns).unwrap();
    let bad = ["x1\ta@b.c\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N"];
    let err = encode_copy_lines(&schema, Some(Box::new(mask)), &bad)
        .remove(0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("public.people") && err.contains("\"id\"") && !err.contains("x1"),
        "{err}"
    );
}

/// `permute`: allowed on key fields, recorded with its algorithm's version, the same value
/// alike in two tables (joins), pinned so a change of the algorithm cannot go unnoticed.
#[test]
fn permute_compiles_records_its_version_and_is_pinned() {
    let rules = TransformRules::parse(
        "tables:\n  public.users:\n    undeclared: keep\n    columns: {id: permute, email: \
         permute, token: permute, note: permute}\n  public.orders:\n    columns: {id: keep, user_email: \
         permute}\n",
        "test.yaml",
    )
    .unwrap();
    let t = rules
        .compile(
            &TableId::new("public", "users"),
            &users(),
            &["id".into()],
            Some(key()),
        )
        .unwrap();
    assert_eq!(t.record().permute.as_deref(), Some("larch-permute-1"));
    assert_eq!(t.record().hash.as_deref(), Some(HASH_ALGORITHM));
    assert_eq!(t.record().columns["email"], "permute");
    let row = Row::parse(
        r#"{"id":42,"email":"alice.smith@example.com","note":"ORD-000123","token":"6F9619FF-8B86-D011-B42D-00CF4FC964FF"}"#,
    )
    .unwrap();
    let m = t.apply(row).unwrap().to_map();
    let got = (
        m["id"].get().to_string(),
        m["email"].get().to_string(),
        m["note"].get().to_string(),
        m["token"].get().to_string(),
    );
    // Integers: the hash's permutation.
    assert_eq!(got.0, hash_int(&key(), 42, 64).to_string());
    let pinned = (
        got.0.clone(),
        r#""bqbcy.eveoq@dymynnr.com""#.to_string(),
        r#""BSS-586481""#.to_string(),
        r#""c8dfc697-a464-bb58-ab12-74fbd0c635df""#.to_string(),
    );
    assert_eq!(got, pinned);
    let orders = rules
        .compile(
            &TableId::new("public", "orders"),
            &[col("id", "int4", true), col("user_email", "varchar", false)],
            &["id".into()],
            Some(key()),
        )
        .unwrap();
    let o = orders
        .apply(Row::parse(r#"{"id":1,"user_email":"alice.smith@example.com"}"#).unwrap())
        .unwrap();
    assert_eq!(
        o.to_map()["user_email"].get(),
        got.1,
        "one value, one output in every table"
    );
    let no_key = rules.compile(
        &TableId::new("public", "users"),
        &users(),
        &["id".into()],
        None,
    );
    assert!(no_key.unwrap_err().0.contains("permute needs a key"));
    let date = TransformRules::parse(
        "tables:\n  public.users:\n    columns: {id: keep, born: permute}\n",
        "t",
    )
    .unwrap()
    .compile(
        &TableId::new("public", "users"),
        &users(),
        &["id".into()],
        Some(key()),
    );
    assert!(
        date.unwrap_err()
            .0
            .contains("column \"born\": permute cannot keep the type date"),
    );
}
