//! Reviewing masking rules before and while they run: which columns look sensitive and the
//! rule each wants (`larch transform suggest`, and a continuous export's report of the columns
//! its rules do not name), and rows shown raw beside masked (`larch transform preview`).

pub mod detect;
pub mod preview;
pub mod suggest;

use std::sync::{Arc, LazyLock};

use larch_core::locks::MutexExt;
use serde::Serialize;

use crate::export::transform::{CompileRules, TransformKey};
use detect::{Kind, ValueEvidence};
use larch_archive::model::{ColumnDefinition, TableId};
use larch_contract::transform_rules::{ColumnRule, FakeKind, TableRules, TransformRules};

/// A rule proposed for a column, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Suggestion {
    pub rule: ColumnRule,
    pub reason: String,
}

/// Types whose values are read for evidence (text and JSON).
fn holds_text(c: &ColumnDefinition) -> bool {
    matches!(
        c.type_name.as_str(),
        "text" | "varchar" | "bpchar" | "citext" | "name" | "json" | "jsonb"
    )
}

/// The rule for `c` of `table` when its name or its sampled values (`evidence`) look
/// sensitive; None when neither does. The rule fits the column (its type, NOT NULL, a key
/// field takes only hash or keep), checked by compiling it as the exporter would.
pub fn suggest_column(
    table: &TableId,
    c: &ColumnDefinition,
    key_field: bool,
    evidence: Option<&ValueEvidence>,
) -> Option<Suggestion> {
    let named = detect::by_name(&c.name);
    let valued = evidence
        .filter(|_| holds_text(c))
        .and_then(|e| e.verdict().map(|(k, n)| (k, n, e.values)));
    let network_type = matches!(
        c.type_name.as_str(),
        "inet" | "cidr" | "macaddr" | "macaddr8"
    );
    let values_say = |(k, n, of): (Kind, usize, usize)| {
        format!("{n} of {of} sampled values hold {}", k.describe())
    };
    let (kind, reason, from_name) = match (named, valued) {
        (Some(k), v) => {
            let mut why = format!("its name suggests {}", k.describe());
            if let Some(v) = v.filter(|v| v.0 == k) {
                why = format!("{why}; {}", values_say(v));
            }
            (k, why, true)
        }
        (None, Some(v)) => (v.0, values_say(v), false),
        (None, None) if network_type => (
            Kind::IpAddress,
            format!("its type {} holds network addresses", c.type_name),
            true,
        ),
        (None, None) => return None,
    };
    let (rule, note) = fitting_rule(table, c, key_field, preferred(kind, from_name, key_field));
    Some(Suggestion {
        rule,
        reason: format!("{reason}{note}"),
    })
}

/// What a column of `kind` wants: a realistic fake for names, addresses and phones, a keyed
/// hash (shape kept, joins kept) for identifiers, NULL for secrets, birth dates and free text
/// holding sensitive values.
fn preferred(kind: Kind, from_name: bool, key_field: bool) -> ColumnRule {
    if key_field {
        return ColumnRule::Hash;
    }
    if !from_name {
        return ColumnRule::Null;
    }
    match kind {
        Kind::Email
        | Kind::PostalCode
        | Kind::NationalId
        | Kind::Iban
        | Kind::Card
        | Kind::IpAddress => ColumnRule::Hash,
        Kind::Phone => ColumnRule::Fake(FakeKind::Phone),
        Kind::FirstName => ColumnRule::Fake(FakeKind::FirstName),
        Kind::LastName => ColumnRule::Fake(FakeKind::LastName),
        Kind::FullName => ColumnRule::Fake(FakeKind::FullName),
        Kind::StreetAddress => ColumnRule::Fake(FakeKind::StreetAddress),
        Kind::City => ColumnRule::Fake(FakeKind::City),
        Kind::BirthDate | Kind::Secret => ColumnRule::Null,
    }
}

/// `want` if the exporter accepts it for `c`, else the first of null, hash and a redact
/// constant that it accepts (a key field: hash, else keep, said in the note).
fn fitting_rule(
    table: &TableId,
    c: &ColumnDefinition,
    key_field: bool,
    want: ColumnRule,
) -> (ColumnRule, String) {
    let candidates = [
        want,
        ColumnRule::Null,
        ColumnRule::Hash,
        ColumnRule::Redact(redact_constant(c)),
    ];
    for rule in candidates {
        if fits(table, c, key_field, &rule) {
            return (rule, String::new());
        }
    }
    (
        ColumnRule::Keep,
        format!(
            "; a key field of type {} takes only keep here: consider leaving the table out",
            c.type_name
        ),
    )
}

/// A constant of `c`'s type for `redact`.
fn redact_constant(c: &ColumnDefinition) -> serde_json::Value {
    match c.type_name.as_str() {
        "int2" | "int4" | "int8" | "numeric" | "float4" | "float8" => 0.into(),
        "bool" => false.into(),
        "date" => "1970-01-01".into(),
        _ => {
            let n = if c.max_length > 0 {
                c.max_length as usize
            } else {
                8
            };
            "redacted".chars().take(n.max(1)).collect::<String>().into()
        }
    }
}

/// Whether the exporter's compilation accepts `rule` for `c` (a fixed key stands in for the
/// real one: only the rule's fit is checked).
fn fits(table: &TableId, c: &ColumnDefinition, key_field: bool, rule: &ColumnRule) -> bool {
    static KEY: LazyLock<Arc<TransformKey>> = LazyLock::new(|| {
        Arc::new(
            TransformKey::from_bytes(b"larch transform suggest: fit check", "(fit check)")
                .expect("a long enough key"),
        )
    });
    let rules = TransformRules {
        tables: [(
            table.to_string(),
            TableRules {
                undeclared: ColumnRule::Keep,
                columns: [(c.name.clone(), rule.clone())].into(),
                ..Default::default()
            },
        )]
        .into(),
        subqueries: false,
    };
    let keys = if key_field {
        vec![c.name.clone()]
    } else {
        vec![]
    };
    rules
        .compile(table, std::slice::from_ref(c), &keys, Some(KEY.clone()))
        .is_ok()
}

/// A rule as it reads in a rules file (YAML flow style).
pub fn rule_yaml(rule: &ColumnRule) -> String {
    match rule {
        ColumnRule::Redact(v) => format!("{{redact: {v}}}"),
        ColumnRule::Fake(k) => format!("{{fake: {k}}}"),
        other => other.name().to_string(),
    }
}

/// A column of a masked export its rules do not name: it goes through `undeclared` (`applied`)
/// until someone reviews it. Reported on the export's `/status` (names and rules, never values).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnreviewedColumn {
    pub table: String,
    pub column: String,
    /// What the column goes through now (the table's `undeclared`).
    pub applied: String,
    /// The rule `larch transform suggest` would propose from its name and type.
    pub suggestion: String,
    pub reason: String,
}

/// The columns of `table` that `rules` do not name, with a suggestion from each one's name and
/// type (no values are read: the export reports, `larch transform suggest` looks closer).
pub fn unreviewed(
    rules: &TransformRules,
    table: &TableId,
    columns: &[ColumnDefinition],
    key_fields: &[String],
) -> Vec<UnreviewedColumn> {
    let Some(t) = rules.tables.get(&table.to_string()) else {
        return vec![];
    };
    columns
        .iter()
        .filter(|c| !t.columns.contains_key(&c.name))
        .map(|c| {
            let s = suggest_column(table, c, key_fields.contains(&c.name), None);
            let (suggestion, reason) = match s {
                Some(s) => (rule_yaml(&s.rule), s.reason),
                None => (
                    "keep".to_string(),
                    "no sensitive name; check its values (`larch transform suggest`)".to_string(),
                ),
            };
            UnreviewedColumn {
                table: table.to_string(),
                column: c.name.clone(),
                applied: rule_yaml(&t.undeclared),
                suggestion,
                reason,
            }
        })
        .collect()
}

/// The columns of an export's current epoch its rules do not name, as last compiled.
#[derive(Debug, Default)]
pub struct Unreviewed(std::sync::Mutex<Vec<UnreviewedColumn>>);

impl Unreviewed {
    /// Records the columns of `schema` that `rules` do not name, and logs them (names and
    /// rules, never values) when they changed.
    pub fn note(&self, rules: &TransformRules, schema: &larch_postgres::TableSchema) {
        let found = unreviewed(rules, &schema.id, &schema.columns, &schema.key_fields);
        let mut current = self.0.locked();
        if found != *current && !found.is_empty() {
            let columns: Vec<String> = found
                .iter()
                .map(|c| {
                    format!(
                        "{} ({} now; suggested: {})",
                        c.column, c.applied, c.suggestion
                    )
                })
                .collect();
            tracing::warn!(table = %schema.id, columns = %columns.join(", "), "columns the transform rules do not name go through `undeclared`: review them (larch transform suggest)");
        }
        *current = found;
    }

    pub fn current(&self) -> Vec<UnreviewedColumn> {
        self.0.locked().clone()
    }
}

#[cfg(test)]
mod tests;
