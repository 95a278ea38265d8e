//! What of a PostgreSQL server's error larch repeats. The message, detail and hint of a data
//! error (SQLSTATE class 22, data exception, and 23, integrity constraint violation) may quote
//! the row's values (`invalid input syntax for type integer: "user1@corp.example"`, `Key
//! (email)=(alice@…) already exists`), and an error's text travels far: into the pod's
//! termination message, then the custom resource's conditions and Events, readable by anyone
//! with `view` in the namespace. Such an error is reduced to its SQLSTATE and the names the
//! server gives with it (schema, table, column, constraint, type), never its text
//! (docs/security.md). Other errors (a missing table, a permission, a syntax error) name
//! objects, not values, and keep their text.

use tokio_postgres::error::DbError;

/// Whether errors of this SQLSTATE may quote values: classes 22 and 23.
pub fn carries_data(code: &str) -> bool {
    code.starts_with("22") || code.starts_with("23")
}

/// The condition name of the commonest data SQLSTATEs (PostgreSQL's appendix A), else the
/// class's.
fn condition(code: &str) -> &'static str {
    match code {
        "22001" => "string_data_right_truncation",
        "22003" => "numeric_value_out_of_range",
        "22004" => "null_value_not_allowed",
        "22007" => "invalid_datetime_format",
        "22008" => "datetime_field_overflow",
        "22012" => "division_by_zero",
        "22021" => "character_not_in_repertoire",
        "22023" => "invalid_parameter_value",
        "22P02" => "invalid_text_representation",
        "22P05" => "untranslatable_character",
        "23001" => "restrict_violation",
        "23502" => "not_null_violation",
        "23503" => "foreign_key_violation",
        "23505" => "unique_violation",
        "23514" => "check_violation",
        "23P01" => "exclusion_violation",
        c if c.starts_with("23") => "integrity_constraint_violation",
        _ => "data_exception",
    }
}

/// A data error without its text: `the server refused a value (SQLSTATE 22P02
/// invalid_text_representation; table public.users, column email; its message is withheld: it
/// may quote row values)`.
pub fn describe_data_error(db: &DbError) -> String {
    let code = db.code().code();
    let mut names = Vec::new();
    match (db.schema(), db.table()) {
        (Some(s), Some(t)) => names.push(format!("table {s}.{t}")),
        (None, Some(t)) => names.push(format!("table {t}")),
        _ => {}
    }
    // A COPY's context names the line and the column before the value (`COPY orders, line 3,
    // column amount: "1.25"`): the part before the value is kept.
    if let Some((line, column)) = db.where_().and_then(copy_position) {
        names.push(format!("COPY line {line}"));
        if db.column().is_none() {
            names.push(format!("column {column}"));
        }
    }
    for (what, value) in [
        ("column", db.column()),
        ("constraint", db.constraint()),
        ("type", db.datatype()),
    ] {
        if let Some(v) = value {
            names.push(format!("{what} {v}"));
        }
    }
    let names = if names.is_empty() {
        String::new()
    } else {
        format!("; {}", names.join(", "))
    };
    format!(
        "the server refused a value (SQLSTATE {code} {}{names}; its message is withheld: it may \
         quote row values)",
        condition(code)
    )
}

/// The line and column of a COPY's error context `COPY t, line N, column C: …` (PostgreSQL's
/// English text; anything else gives none).
fn copy_position(context: &str) -> Option<(u64, &str)> {
    let first = context.lines().next()?;
    let rest = first.strip_prefix("COPY ")?;
    let (_, rest) = rest.split_once(", line ")?;
    let (line, rest) = rest.split_once(", column ")?;
    let line = line.parse().ok()?;
    let (column, _) = rest.split_once(':')?;
    Some((line, column))
}

/// A server error's message (with its detail), reduced for a data error; else the client
/// error's text.
pub fn message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) if carries_data(db.code().code()) => describe_data_error(db),
        Some(db) => match db.detail() {
            Some(d) => format!("{} ({d})", db.message()),
            None => db.message().to_string(),
        },
        None => e.to_string(),
    }
}

/// A [`larch_core::failure::Redactor`]: a PostgreSQL client or server error of a data class
/// in an error chain is shown reduced ([`describe_data_error`]) and nothing under it.
pub fn redact(cause: &(dyn std::error::Error + 'static)) -> Option<String> {
    let db = match cause.downcast_ref::<tokio_postgres::Error>() {
        Some(e) => e.as_db_error(),
        None => cause.downcast_ref::<DbError>(),
    }?;
    carries_data(db.code().code()).then(|| describe_data_error(db))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_copy_context_gives_its_line_and_column_never_the_value() {
        assert_eq!(
            super::copy_position("COPY orders, line 3, column amount: \"1.25\""),
            Some((3, "amount"))
        );
        assert_eq!(
            super::copy_position("COPY orders, line 3: \"1.25\t\""),
            None
        );
        assert_eq!(super::copy_position("SQL function \"f\" statement 1"), None);
    }
}
