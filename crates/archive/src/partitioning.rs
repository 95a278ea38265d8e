//! The manifest's `partitioning` field (larch's, additive): how the source table is
//! partitioned, so a restore that creates the table recreates the same partitions and rows go
//! where they went. Recorded as PostgreSQL prints it (`pg_get_partkeydef`, `pg_get_expr` of
//! each partition's bound); laredo ignores it.

use serde::{Deserialize, Serialize};

/// A partitioned table's key and its partitions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitioningRecord {
    /// The partition key as PostgreSQL prints it: `RANGE (created_at)`, `LIST (region)`,
    /// `HASH (id)`.
    pub key: String,
    /// Every direct partition, by name.
    #[serde(default)]
    pub partitions: Vec<PartitionRecord>,
}

/// One partition: its table and bound, and its own partitions when it is partitioned too.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRecord {
    /// The partition's table.
    pub schema: String,
    pub name: String,
    /// `FOR VALUES FROM (…) TO (…)`, `FOR VALUES IN (…)`, `FOR VALUES WITH (…)` or `DEFAULT`.
    pub bound: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitioning: Option<Box<PartitioningRecord>>,
}

impl PartitioningRecord {
    /// Partitions at every level.
    pub fn count(&self) -> usize {
        self.partitions
            .iter()
            .map(|p| 1 + p.partitioning.as_ref().map_or(0, |s| s.count()))
            .sum()
    }
}

/// Why a recorded key or bound is not one PostgreSQL prints, if it is not. A restore runs them
/// as SQL, so an archive cannot smuggle a second statement or a function call into a bound
/// (bounds are constants: PostgreSQL prints literals, casts, MINVALUE/MAXVALUE, MODULUS and
/// REMAINDER).
pub fn check(record: &PartitioningRecord) -> Result<(), String> {
    let key = record.key.trim_start();
    let method = key.split([' ', '(']).next().unwrap_or("");
    if !["RANGE", "LIST", "HASH"].contains(&method.to_ascii_uppercase().as_str())
        || !key[method.len()..].trim_start().starts_with('(')
        || outside_quotes(key).contains(';')
    {
        return Err(format!(
            "partition key {:?} is not RANGE/LIST/HASH (…)",
            record.key
        ));
    }
    for p in &record.partitions {
        check_bound(&p.bound).map_err(|e| format!("partition {}.{}: {e}", p.schema, p.name))?;
        if let Some(sub) = &p.partitioning {
            check(sub)?;
        }
    }
    Ok(())
}

fn check_bound(bound: &str) -> Result<(), String> {
    let bare = outside_quotes(bound);
    if bare.trim() == "DEFAULT" {
        return Ok(());
    }
    if !bare.trim_start().starts_with("FOR VALUES ") || bare.contains(';') {
        return Err(format!("bound {bound:?} is not FOR VALUES … or DEFAULT"));
    }
    // A word right before `(` calls a function, unless it is the bound's own keyword.
    let (mut word, mut ended) = (String::new(), false);
    for c in bare.chars() {
        if c.is_alphanumeric() || c == '_' || c == '"' {
            if ended {
                word.clear();
                ended = false;
            }
            word.push(c);
        } else if c.is_whitespace() {
            ended = true;
        } else {
            if c == '('
                && !word.is_empty()
                && !["FROM", "TO", "IN", "WITH"].contains(&word.as_str())
            {
                return Err(format!(
                    "bound {bound:?} calls {word}(…): bounds are constants"
                ));
            }
            word.clear();
            ended = false;
        }
    }
    Ok(())
}

/// `text` with its single-quoted literals emptied (`'it''s'` → `''`).
fn outside_quotes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut quoted = false;
    for c in text.chars() {
        if c == '\'' {
            quoted = !quoted;
            out.push(c);
        } else if !quoted {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_partitions_round_trip_and_count() {
        let record = PartitioningRecord {
            key: "RANGE (at)".into(),
            partitions: vec![
                PartitionRecord {
                    schema: "public".into(),
                    name: "ev_2025".into(),
                    bound: "FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')".into(),
                    partitioning: Some(Box::new(PartitioningRecord {
                        key: "LIST (region)".into(),
                        partitions: vec![PartitionRecord {
                            schema: "public".into(),
                            name: "ev_2025_eu".into(),
                            bound: "FOR VALUES IN ('eu')".into(),
                            partitioning: None,
                        }],
                    })),
                },
                PartitionRecord {
                    schema: "public".into(),
                    name: "ev_default".into(),
                    bound: "DEFAULT".into(),
                    partitioning: None,
                },
            ],
        };
        let text = serde_json::to_string(&record).unwrap();
        assert!(!text.contains("\"partitioning\":null"), "{text}");
        assert_eq!(
            serde_json::from_str::<PartitioningRecord>(&text).unwrap(),
            record
        );
        assert_eq!(record.count(), 3);
    }

    #[test]
    fn only_keys_and_bounds_postgresql_prints_pass() {
        let with = |key: &str, bound: &str| PartitioningRecord {
            key: key.into(),
            partitions: vec![PartitionRecord {
                schema: "public".into(),
                name: "p".into(),
                bound: bound.into(),
                partitioning: None,
            }],
        };
        for (key, bound) in [
            (
                "RANGE (at)",
                "FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')",
            ),
            (
                "RANGE (a, b)",
                "FOR VALUES FROM (MINVALUE, 0) TO (10, MAXVALUE)",
            ),
            ("LIST (region)", "FOR VALUES IN ('eu', 'it''s; (x)')"),
            ("HASH (id)", "FOR VALUES WITH (modulus 4, remainder 1)"),
            ("RANGE (date_trunc('day'::text, at))", "DEFAULT"),
        ] {
            assert_eq!(check(&with(key, bound)), Ok(()), "{key} {bound}");
        }
        for (key, bound, why) in [
            (
                "RANGE (at); DROP TABLE x",
                "DEFAULT",
                "is not RANGE/LIST/HASH",
            ),
            ("EXEC (at)", "DEFAULT", "is not RANGE/LIST/HASH"),
            (
                "RANGE (at)",
                "FOR VALUES FROM (pg_sleep(1)) TO (2)",
                "calls pg_sleep(…)",
            ),
            (
                "RANGE (at)",
                "FOR VALUES FROM (1) TO (2); DROP TABLE x",
                "is not FOR VALUES",
            ),
            ("RANGE (at)", "DEFAULT PARTITION BY x", "is not FOR VALUES"),
        ] {
            let err = check(&with(key, bound)).unwrap_err();
            assert!(err.contains(why), "{key} {bound}: {err}");
        }
    }
}
