//! What an ArchiveRestore builds: its Job and request.

use crate::builders::tests::*;
use crate::restore::build as restore;

fn restore_job(name: &str, export: Option<&str>) -> k8s_openapi::api::batch::v1::Job {
    restore_job_in(name, export, &ctx())
}

#[test]
fn restore_jobs_match_golden() {
    for (name, export) in RESTORES {
        golden(name, &docs(&[restore_job(name, export)]));
    }
}

/// The run changes with the spec and with the run-requested token, not with metadata.
#[test]
fn a_restore_run_is_the_spec_and_the_token() {
    let r = restore_fixture("restore-s3-at-position");
    let first = restore::run_id(&r, None);
    let mut labelled = r.clone();
    labelled.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
    assert_eq!(restore::run_id(&labelled, None), first);
    assert_ne!(restore::run_id(&r, Some("2026-12-01T10:00:00Z")), first);
    let mut replace = r.clone();
    replace.spec.if_exists = Some(crate::crd::archive_restore::IfExists::Replace);
    assert_ne!(restore::run_id(&replace, None), first);
}

/// A table the export does not write is refused, naming it.
#[test]
fn a_restore_of_a_table_the_export_lacks_is_refused() {
    let mut r = restore_fixture("restore-exportref-tables");
    r.spec.tables = Some(vec![crate::crd::common::TableRef {
        schema: None,
        name: "nope".into(),
    }]);
    let e = export_fixture("export-scheduled-tables");
    let err = restore::resolve(&r, Some(&e)).unwrap_err();
    assert!(err.contains("public.nope"), "{err}");
}

/// A restore applied with its export waits for the export's first archive (ExportNotReady,
/// looked at again) instead of starting a run that fails for an archive not there yet.
#[test]
fn a_restore_waits_for_its_exports_first_archive() {
    let r = restore_fixture("restore-exportref-tables");
    let mut e = export_fixture("export-scheduled-tables");
    e.status = None;
    let blocked = crate::restore::reconcile::validate(&r, Some(&e)).unwrap_err();
    assert_eq!(blocked.problem.reason, "ExportNotReady");
    assert!(
        blocked
            .problem
            .message
            .contains("has written no archive yet"),
        "{:?}",
        blocked.problem
    );
    assert!(blocked.recheck.is_some());
    e.status = Some(serde_json::from_value(serde_json::json!({
        "lastExport": {"table": "public.invoices", "epoch": 1, "position": "0/16B3748", "rowCount": 3}
    })).unwrap());
    assert!(crate::restore::reconcile::validate(&r, Some(&e)).is_ok());
}
