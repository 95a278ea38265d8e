//! ArchiveRestore conditions.

use crate::reconcile::conditions::*;
use crate::reconcile::tests::conditions::status_of;
use crate::restore::conditions::*;

#[test]
fn credentials_are_masked_in_database_errors() {
    assert_eq!(
        without_credentials("connecting to postgresql://app:hunter2@db:5432/app failed"),
        "connecting to postgresql://app:***@db:5432/app failed"
    );
    assert_eq!(
        without_credentials("dsn host=db password=hunter2 dbname=app: refused"),
        "dsn host=db password=*** dbname=app: refused"
    );
    // No password, no URL, an @ before the scheme: left as they are.
    for text in [
        "postgresql://app@db/app refused",
        "database \"app\" does not exist",
        "a@b://c",
    ] {
        assert_eq!(without_credentials(text), text);
    }
}

#[test]
fn a_restore_waiting_for_its_database_is_reconciling_not_stalled() {
    let o = RestoreObservation {
        run: Some(("r1".into(), None)),
        pod_failure: Some(Problem::new(
            "DatabaseNotFound",
            "restore pod x: database \"app\" does not exist",
        )),
        ..Default::default()
    };
    let cs = restore_conditions(&o);
    assert_eq!(status_of(&cs, READY), (Status::False, DATABASE_UNAVAILABLE));
    assert_eq!(
        status_of(&cs, RECONCILING),
        (Status::True, DATABASE_UNAVAILABLE)
    );
    assert_eq!(status_of(&cs, STALLED).0, Status::False);
    // Another failure of a running Job is a retry, not the database.
    let other = RestoreObservation {
        pod_failure: Some(Problem::new("StorageUnavailable", "s3 down")),
        ..o
    };
    assert_eq!(status_of(&restore_conditions(&other), READY).1, "Restoring");
}
