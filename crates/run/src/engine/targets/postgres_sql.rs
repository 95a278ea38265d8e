//! SQL spelling shared by the PostgreSQL target and its schema changes: quoted identifiers and
//! the SQL type of an archived column.

/// SQL type for a laredo `Type` (PostgreSQL udt name): arrays are `_name`.
pub fn sql_type(udt: &str) -> String {
    let udt = udt.trim();
    if udt.is_empty() {
        return "jsonb".into();
    }
    if let Some(elem) = udt.strip_prefix('_') {
        let inner = sql_type(elem);
        return if inner == "jsonb" && elem.is_empty() {
            "jsonb".into()
        } else {
            format!("{inner}[]")
        };
    }
    const KNOWN: &[&str] = &[
        "bool",
        "int2",
        "int4",
        "int8",
        "float4",
        "float8",
        "numeric",
        "text",
        "varchar",
        "bpchar",
        "name",
        "char",
        "json",
        "jsonb",
        "uuid",
        "bytea",
        "date",
        "time",
        "timetz",
        "timestamp",
        "timestamptz",
        "interval",
        "inet",
        "cidr",
        "macaddr",
        "money",
        "oid",
        "xml",
        "bit",
        "varbit",
        "tsvector",
        "point",
    ];
    if KNOWN.contains(&udt) {
        udt.to_string()
    } else {
        "text".into()
    }
}

pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}
