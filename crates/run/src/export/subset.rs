//! Subsetting a one-shot export (dev seeds): a row filter (`where:`, an SQL predicate the
//! baseline's COPY applies inside the exported snapshot) and a sample (`sample:`, a percentage
//! of the rows). The sample is decided per row by a keyed hash of the `by` column(s) (default:
//! the key fields), not by `TABLESAMPLE`: it is deterministic (two runs over the same rows
//! keep the same rows) and consistent across tables (sampling `users` by `id` and `orders` by
//! `user_id` keeps the orders of the users kept), which a block sample cannot be.

use std::borrow::Cow;

use crate::export::transform::{TableRules, TransformKey};
use larch_archive::masking::{ClosureRecord, SubsetRecord};
use larch_archive::value::Row;
use larch_postgres::TableSchema;

pub use larch_contract::transform_rules::SampleRule;

/// The subset of one table: where it came from is checked, the sample compiled for its columns.
#[derive(Clone, Debug, Default)]
pub struct Subset {
    pub row_filter: Option<String>,
    pub sample: Option<SampleRule>,
    /// A subset that follows foreign keys: the rows are the closure's (its COPY query), this
    /// is what the manifest records of it.
    pub closure: Option<ClosureRecord>,
}

/// Resolution of a sample: parts per million.
const PPM: u64 = 1_000_000;

/// A compiled sample: keeps a row when the keyed hash of its `by` values falls under the
/// percentage.
#[derive(Clone)]
pub struct Sampler {
    key: std::sync::Arc<TransformKey>,
    by: Vec<String>,
    threshold: u64,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("by", &self.by)
            .field("threshold_ppm", &self.threshold)
            .finish()
    }
}

impl From<&TableRules> for Subset {
    /// The subset a table's rules ask for (`where:`, `sample:`).
    fn from(rules: &TableRules) -> Subset {
        Subset {
            row_filter: rules.row_filter.clone(),
            sample: rules.sample.clone(),
            closure: None,
        }
    }
}

impl Subset {
    pub fn is_empty(&self) -> bool {
        self.row_filter.is_none() && self.sample.is_none() && self.closure.is_none()
    }

    /// Checks the rule's values (the predicate, parsed: [`larch_postgres::row_filter`]; the
    /// percentage) for `table`, before anything connects.
    pub fn check(
        &self,
        table: &larch_archive::model::TableId,
        subqueries: Option<&larch_postgres::SubqueryTables>,
    ) -> Result<(), String> {
        if let Some(p) = &self.row_filter {
            larch_postgres::check_row_filter_with(table, p, subqueries)
                .map_err(|why| format!("the row filter of table {table} (where: {p}): {why}"))?;
        }
        if let Some(s) = &self.sample
            && !(s.percent > 0.0 && s.percent <= 100.0)
        {
            return Err(format!(
                "the sample of table {table}: percent {} is not in (0, 100]",
                s.percent
            ));
        }
        Ok(())
    }

    /// The sample for `schema`'s columns, keyed by `key` (the transform key when there is one,
    /// so who lacks it cannot tell which rows were kept; else a fixed key: still
    /// deterministic). None without a sample.
    pub fn sampler(
        &self,
        schema: &TableSchema,
        key: Option<std::sync::Arc<TransformKey>>,
    ) -> Result<Option<Sampler>, String> {
        let Some(rule) = &self.sample else {
            return Ok(None);
        };
        let by = match &rule.by {
            Some(c) => {
                if !schema.columns.iter().any(|d| &d.name == c) {
                    let names: Vec<&str> = schema.columns.iter().map(|c| c.name.as_str()).collect();
                    return Err(format!(
                        "the sample of table {}: column {c:?} (by) does not exist (columns: {})",
                        schema.id,
                        names.join(", ")
                    ));
                }
                vec![c.clone()]
            }
            None => schema.key_fields.clone(),
        };
        let key = match key {
            Some(k) => k,
            None => std::sync::Arc::new(
                TransformKey::from_bytes(b"larch sample without a transform key", "built-in")
                    .expect("a long enough key"),
            ),
        };
        Ok(Some(Sampler {
            key,
            by,
            threshold: (rule.percent / 100.0 * PPM as f64).round() as u64,
        }))
    }

    /// What the manifest records (None without a subset).
    pub fn record(&self, schema: Option<&TableSchema>) -> Option<SubsetRecord> {
        if self.is_empty() {
            return None;
        }
        Some(SubsetRecord {
            row_filter: self.row_filter.clone(),
            sample_percent: self
                .sample
                .as_ref()
                .and_then(|s| serde_json::Number::from_f64(s.percent)),
            sample_by: match (&self.sample, schema) {
                (Some(SampleRule { by: Some(c), .. }), _) => vec![c.clone()],
                (Some(_), Some(s)) => s.key_fields.clone(),
                _ => Vec::new(),
            },
            closure: self.closure.clone(),
        })
    }
}

impl Sampler {
    /// Whether the row is in the sample. A missing `by` field counts as NULL.
    pub fn keeps(&self, row: &Row) -> bool {
        let mut input = Vec::new();
        for (i, c) in self.by.iter().enumerate() {
            if i > 0 {
                input.push(0);
            }
            let value = row.get(c);
            let text = value.as_ref().map(|v| v.get()).unwrap_or("null");
            // A string's content (so text and varchar agree), else the JSON (numbers).
            let canonical: Cow<'_, str> = match text.as_bytes().first() {
                Some(b'"') => serde_json::from_str(text).unwrap_or(Cow::Borrowed(text)),
                _ => Cow::Borrowed(text),
            };
            input.extend_from_slice(canonical.as_bytes());
        }
        let tag = self.key.sample_tag(&input);
        let n = u64::from_be_bytes(tag[..8].try_into().expect("8 bytes"));
        n % PPM < self.threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use larch_archive::model::{ColumnDefinition, TableId};

    fn schema(name: &str, cols: &[&str]) -> TableSchema {
        TableSchema {
            id: TableId::new("public", name),
            columns: cols
                .iter()
                .map(|c| ColumnDefinition {
                    name: c.to_string(),
                    type_name: "int8".into(),
                    ..Default::default()
                })
                .collect(),
            key_fields: vec![cols[0].to_string()],
            type_oids: vec![20; cols.len()],
            type_mods: vec![-1; cols.len()],
            sql_types: vec!["bigint".into(); cols.len()],
            generated: vec![false; cols.len()],
            has_primary_key: true,
            replica_identity: 'd',
        }
    }

    #[test]
    fn the_sample_is_deterministic_consistent_and_near_its_percentage() {
        let users = Subset {
            row_filter: None,
            closure: None,
            sample: Some(SampleRule {
                percent: 10.0,
                by: None,
            }),
        };
        let orders = Subset {
            row_filter: None,
            closure: None,
            sample: Some(SampleRule {
                percent: 10.0,
                by: Some("user_id".into()),
            }),
        };
        let u = users
            .sampler(&schema("users", &["id"]), None)
            .unwrap()
            .unwrap();
        let o = orders
            .sampler(&schema("orders", &["id", "user_id"]), None)
            .unwrap()
            .unwrap();
        let mut kept = 0;
        for id in 0..20_000 {
            let user = Row::parse(&format!(r#"{{"id":{id}}}"#)).unwrap();
            let order = Row::parse(&format!(r#"{{"id":{},"user_id":{id}}}"#, id + 7)).unwrap();
            let k = u.keeps(&user);
            assert_eq!(k, u.keeps(&user), "deterministic");
            assert_eq!(k, o.keeps(&order), "an order is kept with its user");
            kept += usize::from(k);
        }
        assert!((1_700..2_300).contains(&kept), "{kept} of 20000 at 10 %");
        let all = Subset {
            row_filter: None,
            closure: None,
            sample: Some(SampleRule {
                percent: 100.0,
                by: None,
            }),
        }
        .sampler(&schema("users", &["id"]), None)
        .unwrap()
        .unwrap();
        assert!((0..1000).all(|id| all.keeps(&Row::parse(&format!(r#"{{"id":{id}}}"#)).unwrap())));
        let e = orders
            .sampler(&schema("orders", &["id"]), None)
            .unwrap_err();
        assert!(e.contains("column \"user_id\" (by) does not exist"), "{e}");
        let bad = Subset {
            row_filter: None,
            closure: None,
            sample: Some(SampleRule {
                percent: 0.0,
                by: None,
            }),
        };
        assert!(
            bad.check(&"public.users".parse().unwrap(), None)
                .unwrap_err()
                .contains("percent 0 is not in (0, 100]")
        );
    }

    #[test]
    fn a_row_filter_is_checked_by_the_parser() {
        let users: larch_archive::model::TableId = "public.users".parse().unwrap();
        let ok = Subset {
            row_filter: Some("created_at > CURRENT_DATE - 90".into()),
            sample: None,
            closure: None,
        };
        assert_eq!(ok.check(&users, None), Ok(()));
        let bad = Subset {
            row_filter: Some("pg_sleep(1) IS NULL".into()),
            sample: None,
            closure: None,
        };
        let e = bad.check(&users, None).unwrap_err();
        assert!(
            e.starts_with(
                "the row filter of table public.users (where: pg_sleep(1) IS NULL): \
                 function pg_sleep is not allowed in a row filter (allowed: abs,"
            ),
            "{e}"
        );
    }
}
