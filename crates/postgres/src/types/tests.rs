/// The hand-written timestamp parse and format agree with chrono's format strings (what
/// they replace) on PostgreSQL's output and on the odd cases.
#[test]
fn fast_timestamps_match_chrono_format_strings() {
    let old_parse = |t: &str| NaiveDateTime::parse_from_str(t, "%Y-%m-%d %H:%M:%S%.f").ok();
    let old_format = |ts: &NaiveDateTime| {
        let mut s = ts.format("%Y-%m-%dT%H:%M:%S%.6f").to_string();
        trim_fraction(&mut s);
        s.push('Z');
        s
    };
    for t in [
        "2026-11-29 12:34:56",
        "2026-11-29 12:34:56.5",
        "2026-11-29 12:34:56.000001",
        "2026-11-29 12:34:56.123456",
        "2026-11-29 12:34:56.123456789",
        "0001-01-01 00:00:00",
        "9999-12-31 23:59:59.999999",
        "2024-02-29 00:00:00",
        "2023-02-29 00:00:00",
        "2026-11-29 24:00:00",
        "2026-11-29 12:34:56.",
        "2026-11-29T12:34:56",
        "2026-11-29 1:02:03",
        "2026-13-01 00:00:00",
    ] {
        let new = parse_iso_datetime(t);
        assert_eq!(new, old_parse(t), "{t}");
        if let Some(ts) = new {
            assert_eq!(format_utc(&ts), old_format(&ts), "{t}");
        }
    }
}

use super::*;

fn j(kind: &Kind, text: &str) -> String {
    to_json(kind, text).get().to_string()
}

#[test]
fn numbers() {
    assert_eq!(j(&Kind::Int, "9007199254740993"), "9007199254740993");
    assert_eq!(j(&Kind::Int, "-32768"), "-32768");
    assert_eq!(j(&Kind::Numeric, "123.450"), "123.450");
    assert_eq!(j(&Kind::Numeric, "-0.000001"), "-0.000001");
    assert_eq!(j(&Kind::Numeric, "NaN"), "\"NaN\"");
    assert_eq!(j(&Kind::Numeric, "-Infinity"), "\"-Infinity\"");
    assert_eq!(j(&Kind::Float, "1e+21"), "1e+21");
    assert_eq!(j(&Kind::Float, "1.5e-07"), "1.5e-07");
    assert_eq!(j(&Kind::Float, "Infinity"), "\"Infinity\"");
    assert_eq!(j(&Kind::Float, "-0"), "-0");
    assert!(!is_json_number("01"));
    assert!(!is_json_number("1."));
    assert!(!is_json_number(".5"));
}

#[test]
fn scalars() {
    assert_eq!(j(&Kind::Bool, "t"), "true");
    assert_eq!(j(&Kind::Bool, "f"), "false");
    assert_eq!(j(&Kind::Text, "a\"b\\c\n"), r#""a\"b\\c\n""#);
    assert_eq!(j(&Kind::Bytea, "\\x0102ff"), "\"AQL/\"");
    assert_eq!(j(&Kind::Bytea, "\\x"), "\"\"");
    assert_eq!(j(&Kind::Bytea, "a\\\\b\\001"), "\"YVxiAQ==\"");
    assert_eq!(
        j(&Kind::Json, "{\"a\": [1, 2.50, \"x y\"],\n \"b\": null}"),
        r#"{"a":[1,2.50,"x y"],"b":null}"#
    );
}

#[test]
fn times() {
    assert_eq!(
        j(&Kind::Timestamptz, "2024-01-02 03:04:05.123+00"),
        "\"2024-01-02T03:04:05.123Z\""
    );
    assert_eq!(
        j(&Kind::Timestamptz, "2024-01-02 03:04:05+05:30"),
        "\"2024-01-01T21:34:05Z\""
    );
    assert_eq!(
        j(&Kind::Timestamptz, "1900-01-01 00:00:00+00:09:21"),
        "\"1899-12-31T23:50:39Z\""
    );
    assert_eq!(
        j(&Kind::Timestamp, "2024-01-02 03:04:05.000001"),
        "\"2024-01-02T03:04:05.000001Z\""
    );
    assert_eq!(j(&Kind::Timestamp, "infinity"), "\"infinity\"");
    assert_eq!(
        j(&Kind::Timestamp, "0044-03-15 12:00:00 BC"),
        "\"0044-03-15 12:00:00 BC\""
    );
    assert_eq!(j(&Kind::Date, "2024-02-29"), "\"2024-02-29\"");
    assert_eq!(j(&Kind::Date, "-infinity"), "\"-infinity\"");
    assert_eq!(j(&Kind::Time, "23:59:59.5"), "\"23:59:59.5\"");
    assert_eq!(j(&Kind::Timetz, "03:04:05+02"), "\"03:04:05+02:00\"");
    assert_eq!(
        j(&Kind::Timetz, "03:04:05.25-03:30"),
        "\"03:04:05.25-03:30\""
    );
}

#[test]
fn arrays() {
    let ints = Kind::Array {
        elem: Box::new(Kind::Int),
        delim: b',',
    };
    assert_eq!(j(&ints, "{1,2,NULL}"), "[1,2,null]");
    assert_eq!(j(&ints, "{{1,2},{3,4}}"), "[[1,2],[3,4]]");
    assert_eq!(j(&ints, "[0:1]={7,8}"), "[7,8]");
    assert_eq!(j(&ints, "{}"), "[]");
    let texts = Kind::Array {
        elem: Box::new(Kind::Text),
        delim: b',',
    };
    assert_eq!(
        j(&texts, r#"{"a b","NULL",NULL,"x\"y","c\\d",plain,"{}"}"#),
        r#"["a b","NULL",null,"x\"y","c\\d","plain","{}"]"#
    );
    let jsons = Kind::Array {
        elem: Box::new(Kind::Json),
        delim: b',',
    };
    assert_eq!(j(&jsons, r#"{"{\"a\": 1}",NULL}"#), r#"[{"a":1},null]"#);
    let nums = Kind::Array {
        elem: Box::new(Kind::Numeric),
        delim: b',',
    };
    assert_eq!(j(&nums, "{1.50,NaN}"), r#"[1.50,"NaN"]"#);
    let boxes = Kind::Array {
        elem: Box::new(Kind::Text),
        delim: b';',
    };
    assert_eq!(
        j(&boxes, "{(1,1),(0,0);(2,2),(1,1)}"),
        r#"["(1,1),(0,0)","(2,2),(1,1)"]"#
    );
    // Malformed input keeps its text.
    assert_eq!(j(&ints, "{1,2"), "\"{1,2\"");
}
