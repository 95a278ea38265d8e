//! The second step of a reconcile: what the schema and its CEL rules cannot say (or what a
//! cluster still running older CRDs did not check). Each check names the field; a failure
//! sets `Stalled=True`, reason `InvalidSpec`, and nothing is built.
//!
//! - `spec.schedule.cron`: parsed as Kubernetes parses CronJob schedules ([`crate::cron`]);
//! - key prefixes: the rule the CLI and the readers apply
//!   ([`larch_archive::store::check_key_prefix`]: no `..` or `.` segment, no leading `/`);
//! - table and schema names: no `/` or `..` (they become the archive's key prefix, as the
//!   engine's configuration requires); an export's key fields: no `,` and no surrounding
//!   spaces (`larch export --key-fields a,b` takes them as a list);
//! - `spec.pod.affinity` must parse as a core/v1 Affinity (it is free-form in the schema);
//! - `spec.networkPolicy.from[i]` must parse as a NetworkPolicyPeer naming a peer (likewise);
//! - `spec.transform.tables[T].where`: parsed by PostgreSQL's parser and refused unless it is a
//!   predicate on the row ([`larch_postgres::row_filter`]), as the exporter refuses it, so the
//!   export stalls naming the node before a pod runs anything on the primary.

use crate::crd::common::TableRef;
use crate::crd::common_pod::PodOverrides;
use larch_archive::model::TableId;

/// `spec.pod.affinity` is free-form in the schema: it must still parse as an Affinity.
pub(crate) fn affinity(pod: Option<&PodOverrides>) -> Result<(), String> {
    let Some(a) = pod.and_then(|p| p.affinity.as_ref()) else {
        return Ok(());
    };
    serde_json::from_value::<k8s_openapi::api::core::v1::Affinity>(a.clone())
        .map(|_| ())
        .map_err(|e| format!("spec.pod.affinity is not a valid Affinity: {e}"))
}

pub(crate) fn key_prefix(field: &str, prefix: Option<&str>) -> Result<(), String> {
    match prefix {
        Some(p) => larch_archive::store::check_key_prefix(p).map_err(|_| {
            format!("{field} {p:?} is not a valid key prefix: no '..' or '.' segment, no leading '/', no backslash (the archive would leave the store's root)")
        }),
        None => Ok(()),
    }
}

pub(crate) fn tables(field: &str, tables: &[TableRef]) -> Result<(), String> {
    for (i, t) in tables.iter().enumerate() {
        let at = if field.ends_with("tables") {
            format!("{field}[{i}]")
        } else {
            field.to_string()
        };
        for (part, value) in [("schema", t.schema()), ("name", t.name.as_str())] {
            if !TableId::is_valid_part(value) {
                return Err(format!(
                    "{at}.{part} {value:?} is not a valid name: it must not contain '/' or '..' (it names the archive's key prefix)"
                ));
            }
        }
    }
    Ok(())
}

pub(crate) fn key_fields(field: &str, fields: Option<&Vec<String>>) -> Result<(), String> {
    for k in fields.into_iter().flatten() {
        if k.contains(',') || k.trim() != k || k.is_empty() {
            return Err(format!(
                "{field} {k:?} is not a valid key field: no ',' and no surrounding spaces (the exporter takes key fields as a comma-separated list)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::tests::{export_fixture, source_fixture};
    use crate::crd::archive_export::ArchiveExport;
    use crate::crd::archive_export::Schedule;
    use crate::export::validate::export;

    use crate::source::validate::source;

    #[test]
    fn the_fixtures_are_valid() {
        for f in [
            "export-oneshot-s3",
            "export-continuous-s3",
            "export-scheduled-tables",
        ] {
            assert_eq!(export(&export_fixture(f)), Ok(()), "{f}");
        }
        for f in ["source-exportref-memory", "source-s3-postgres"] {
            assert_eq!(source(&source_fixture(f)), Ok(()), "{f}");
        }
    }

    #[test]
    fn each_check_names_its_field() {
        let base = export_fixture("export-oneshot-s3");
        let refuse = |e: ArchiveExport, fragment: &str| {
            let err = export(&e).expect_err(fragment);
            assert!(err.contains(fragment), "{err:?} lacks {fragment:?}");
        };
        let mut e = base.clone();
        e.spec.schedule = Some(Schedule {
            cron: "61 25 * * *".into(),
            time_zone: None,
            suspend: None,
            concurrency_policy: None,
            successful_jobs_history_limit: None,
            failed_jobs_history_limit: None,
        });
        refuse(
            e,
            "spec.schedule.cron \"61 25 * * *\" is not a valid schedule: end of range (61) above maximum (59): 61",
        );
        for prefix in ["../../etc/", "/abs/", "a/./b/", "a\\b/"] {
            let mut e = base.clone();
            e.spec.key_prefix = Some(prefix.into());
            refuse(
                e,
                &format!("spec.keyPrefix {prefix:?} is not a valid key prefix"),
            );
        }
        let mut e = base.clone();
        e.spec.source.table.as_mut().unwrap().name = "a/b".into();
        refuse(e, "spec.source.table.name \"a/b\" is not a valid name");
        let mut e = base.clone();
        e.spec.source.key_fields = Some(vec!["id".into(), "a,b".into()]);
        refuse(e, "spec.source.keyFields \"a,b\"");
        let mut e = base.clone();
        e.spec.pod = Some(PodOverrides {
            affinity: Some(serde_json::json!({"nodeAffinity": 3})),
            ..Default::default()
        });
        refuse(e, "spec.pod.affinity is not a valid Affinity");
        let mut e = base.clone();
        e.spec.transform = Some(crate::crd::archive_export::ExportTransform {
            tables: [(
                "public.users".to_string(),
                larch_contract::transform_rules::TableRules {
                    row_filter: Some("pg_drop_replication_slot('other') IS NULL".into()),
                    ..Default::default()
                },
            )]
            .into(),
            key_secret_ref: None,
            subqueries: false,
            leak_check: false,
            require_validated: false,
        });
        refuse(
            e,
            "spec.transform.tables[\"public.users\"].where \"pg_drop_replication_slot('other') IS NULL\": function pg_drop_replication_slot is not allowed in a row filter (allowed: abs,",
        );
        // Subqueries: only with `subqueries: true`, only into the export's tables, and only
        // their unmasked columns, as the exporter decides.
        let table = base.spec.source.all_tables()[0].qualified();
        let with_filter = |predicate: &str, subqueries: bool| {
            let mut e = base.clone();
            let rules = larch_contract::transform_rules::TableRules {
                undeclared: larch_contract::transform_rules::ColumnRule::Keep,
                columns: [(
                    "secret".into(),
                    larch_contract::transform_rules::ColumnRule::Hash,
                )]
                .into(),
                row_filter: Some(predicate.into()),
                ..Default::default()
            };
            e.spec.transform = Some(crate::crd::archive_export::ExportTransform {
                tables: [(table.clone(), rules)].into(),
                key_secret_ref: None,
                subqueries,
                leak_check: false,
                require_validated: false,
            });
            e
        };
        let own = format!("EXISTS (SELECT 1 FROM {table} t WHERE t.id = 1)");
        assert_eq!(export(&with_filter(&own, true)), Ok(()));
        refuse(with_filter(&own, false), "need `subqueries: true`");
        refuse(
            with_filter("id IN (SELECT s.id FROM public.elsewhere s)", true),
            "a subquery into public.elsewhere is not allowed in a row filter",
        );
        refuse(
            with_filter(
                &format!("EXISTS (SELECT 1 FROM {table} t WHERE t.secret = 'a')"),
                true,
            ),
            "masks secret",
        );
        // A name PostgreSQL allows (quoted) is fine: it is looked up, not refused.
        let mut e = base;
        e.spec.source.table.as_mut().unwrap().name = "events; DROP TABLE events".into();
        assert_eq!(export(&e), Ok(()));

        let mut s = source_fixture("source-s3-postgres");
        s.spec.tables.as_mut().unwrap()[1].schema = Some("..".into());
        assert!(
            source(&s)
                .unwrap_err()
                .starts_with("spec.tables[1].schema \"..\"")
        );
        let mut s = source_fixture("source-s3-postgres");
        s.spec.archive.key_prefix = Some("../x/".into());
        assert!(
            source(&s)
                .unwrap_err()
                .starts_with("spec.archive.keyPrefix \"../x/\"")
        );
        assert_eq!(
            source(&source_fixture("source-access-networkpolicy")),
            Ok(())
        );
        for (peer, message) in [
            (
                serde_json::json!({"podSelector": {"matchLabels": 3}}),
                "spec.networkPolicy.from[1] is not a NetworkPolicyPeer",
            ),
            (
                serde_json::json!({}),
                "spec.networkPolicy.from[1] names no peer: set podSelector, namespaceSelector or ipBlock",
            ),
        ] {
            let mut s = source_fixture("source-access-networkpolicy");
            s.spec
                .network_policy
                .as_mut()
                .unwrap()
                .from
                .as_mut()
                .unwrap()[1] = peer;
            let e = source(&s).unwrap_err();
            assert!(e.starts_with(message), "{e}");
        }
    }
}
