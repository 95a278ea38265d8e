use super::*;

/// The encoder writes exactly the text the map-based path (`to_json` values in a sorted
/// map) gives, for every fast-path kind and the fallbacks, with escapes and NULLs.
#[test]
fn the_row_encoder_writes_the_canonical_row_text() {
    use crate::types::to_json;
    use larch_archive::model::ColumnDefinition;
    use larch_archive::value::{RowMap, raw};
    let cases: Vec<(&str, Kind, Vec<&str>)> = vec![
        ("id", Kind::Int, vec!["1", "-42", "9223372036854775807"]),
        (
            "amount",
            Kind::Numeric,
            vec!["12.500", "NaN", "-0.0001", "1e5"],
        ),
        (
            "ratio",
            Kind::Float,
            vec!["1.5", "Infinity", "-Infinity", "1e-07"],
        ),
        ("flag", Kind::Bool, vec!["t", "f", "x"]),
        (
            "Name",
            Kind::Text,
            vec![
                "plain",
                "tab\\there",
                "quote\"and\\\\back",
                "\\x01ctl",
                "ünï",
            ],
        ),
        (
            "payload",
            Kind::Json,
            vec!["{\"a\": [1, 2.50]}", "not json"],
        ),
        (
            "blob",
            Kind::Bytea,
            vec![
                "\\\\x0102ff",
                "\\\\x",
                "\\\\x00ffee11223344556677",
                "not hex",
            ],
        ),
        (
            "at",
            Kind::Timestamptz,
            vec![
                "2026-01-02 03:04:05.5+01",
                "2026-01-02 03:04:05+00",
                "0001-01-01 00:00:00.000001+00",
                "2026-12-31 23:59:59.123450-09:30",
                "infinity",
            ],
        ),
        (
            "local",
            Kind::Timestamp,
            vec![
                "2026-01-02 03:04:05.250",
                "1999-12-31 23:59:59",
                "-infinity",
            ],
        ),
        (
            "tags",
            Kind::Array {
                elem: Box::new(Kind::Text),
                delim: b',',
            },
            vec!["{a,\"b c\"}", "{}", "{{a,NULL},{\"\\\\\"q\",z  }}"],
        ),
        (
            "nums",
            Kind::Array {
                elem: Box::new(Kind::Numeric),
                delim: b',',
            },
            vec!["{1,2.50,NaN,NULL}", "[0:1]={7,8}"],
        ),
        (
            "docs",
            Kind::Array {
                elem: Box::new(Kind::Json),
                delim: b',',
            },
            vec!["{\"{\\\\\"a\\\\\": 1}\",\"[1, 2]\"}"],
        ),
        (
            "times",
            Kind::Array {
                elem: Box::new(Kind::Timestamptz),
                delim: b',',
            },
            vec!["{\"2026-01-02 03:04:05+00\",NULL}"],
        ),
    ];
    let schema = TableSchema {
        id: TableId::new("public", "t"),
        columns: cases
            .iter()
            .map(|(n, _, _)| ColumnDefinition {
                name: n.to_string(),
                ..Default::default()
            })
            .collect(),
        type_oids: (0..cases.len() as u32).collect(),
        type_mods: vec![],
        sql_types: vec![],
        generated: vec![],
        key_fields: vec![],
        has_primary_key: false,
        replica_identity: 'd',
    };
    let kinds: HashMap<u32, Kind> = cases
        .iter()
        .enumerate()
        .map(|(i, (_, k, _))| (i as u32, k.clone()))
        .collect();
    let encoder = RowEncoder::new(&schema, &kinds, None);
    let mut scratch = Scratch::default();
    for round in 0..5 {
        let fields: Vec<&str> = cases
            .iter()
            .enumerate()
            .map(|(i, (_, _, v))| {
                if (round + i) % 4 == 3 {
                    "\\N"
                } else {
                    v[round % v.len()]
                }
            })
            .collect();
        let line = fields.join("\t");
        let mut map = RowMap::new();
        for ((name, kind, _), f) in cases.iter().zip(&fields) {
            let v = if *f == "\\N" {
                raw("null")
            } else {
                to_json(kind, &unescape_copy_str(f).unwrap())
            };
            map.insert(name.to_string(), v);
        }
        let want = Row::from_map(&map);
        let got = encoder.row(line.as_bytes(), &mut scratch).unwrap();
        assert_eq!(got.as_str(), want.as_str(), "line {line:?}");
    }
    let err = encoder.row(b"1\t2", &mut scratch).unwrap_err().to_string();
    assert!(err.contains("2 fields, expected 13"), "{err}");
}

#[test]
fn copy_unescape() {
    assert_eq!(unescape_copy_str("a\\tb\\nc\\\\d").unwrap(), "a\tb\nc\\d");
    assert_eq!(unescape_copy_str("\\\\x0102").unwrap(), "\\x0102");
    assert_eq!(unescape_copy_str("plain").unwrap(), "plain");
    // An escape making a byte that is not UTF-8 is an error, not a lossy value.
    assert!(unescape_copy_str("\\xff").is_err());
}
