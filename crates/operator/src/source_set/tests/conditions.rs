//! ArchiveSourceSet conditions and the state of each selected namespace.

use crate::crd::common::Condition;
use crate::reconcile::conditions::*;
use crate::reconcile::tests::conditions::status_of;
use crate::restore::conditions::DATABASE_UNAVAILABLE;
use crate::source_set::conditions::*;

fn child(
    generation: i64,
    observed: Option<i64>,
    conds: &[(&str, &str, &str, &str)],
) -> crate::crd::ArchiveSource {
    let mut s: crate::crd::ArchiveSource = serde_json::from_value(serde_json::json!({
        "apiVersion": "larch.dev/v1alpha1", "kind": "ArchiveSource",
        "metadata": {"name": "seed", "namespace": "dev-a", "generation": generation},
        "spec": {"archive": {"exportRef": {"name": "x"}}, "target": {"memory": {}}}
    }))
    .unwrap();
    s.status = Some(crate::crd::ArchiveSourceStatus {
        observed_generation: observed,
        conditions: conds
            .iter()
            .map(|(t, st, r, m)| Condition {
                type_: t.to_string(),
                status: serde_json::from_value(serde_json::json!(st)).unwrap(),
                reason: r.to_string(),
                message: m.to_string(),
                last_transition_time: "2026-01-01T00:00:00Z".into(),
                observed_generation: observed,
            })
            .collect(),
        ..Default::default()
    });
    s
}

#[test]
fn namespace_state_from_the_child() {
    let p = |s: &str| NamespaceState::Progressing(s.into());
    assert_eq!(
        namespace_state(None, None),
        p("the ArchiveSource is not created yet")
    );
    // The set's own finding wins.
    let ready = child(1, Some(1), &[(READY, "True", "EnginesReady", "1/1")]);
    assert_eq!(
        namespace_state(Some(Problem::new("SecretConflict", "taken")), Some(&ready)),
        NamespaceState::Failing {
            reason: "SecretConflict".into(),
            message: "taken".into()
        }
    );
    assert_eq!(namespace_state(None, Some(&ready)), NamespaceState::Ready);
    // A status for an older generation says nothing about the current spec.
    let stale = child(2, Some(1), &[(READY, "True", "EnginesReady", "1/1")]);
    assert_eq!(
        namespace_state(None, Some(&stale)),
        p("the ArchiveSource is not observed yet")
    );
    let stalled = child(
        1,
        Some(1),
        &[
            (READY, "False", "PodCreationFailed", "quota"),
            (
                STALLED,
                "True",
                "PodCreationFailed",
                "0/1 engines ready; quota",
            ),
        ],
    );
    assert_eq!(
        namespace_state(None, Some(&stalled)),
        NamespaceState::Failing {
            reason: "PodCreationFailed".into(),
            message: "0/1 engines ready; quota".into()
        }
    );
    let waiting = child(
        1,
        Some(1),
        &[
            (READY, "False", "WaitingForEngines", "0/1 engines ready"),
            (STALLED, "False", "WaitingForEngines", ""),
        ],
    );
    assert_eq!(
        namespace_state(None, Some(&waiting)),
        p("0/1 engines ready")
    );
}

#[test]
fn source_set_rollup() {
    let obs = |states: Vec<NamespaceState>| SetObservation {
        invalid: None,
        namespaces: states
            .into_iter()
            .enumerate()
            .map(|(i, s)| (format!("dev-{i}"), s))
            .collect(),
    };
    let fail = |r: &str| NamespaceState::Failing {
        reason: r.into(),
        message: "m".into(),
    };
    let prog = NamespaceState::Progressing("p".into());
    use NamespaceState::Ready as R;

    let cs = source_set_conditions(&obs(vec![]));
    assert_eq!(status_of(&cs, READY), (Status::True, "NoNamespaces"));

    let cs = source_set_conditions(&obs(vec![R, R]));
    assert_eq!(status_of(&cs, READY), (Status::True, "NamespacesReady"));
    assert_eq!(status_of(&cs, RECONCILING).0, Status::False);
    assert_eq!(status_of(&cs, STALLED).0, Status::False);
    assert_eq!(
        cs.iter().find(|c| c.type_ == READY).unwrap().message,
        "2/2 namespaces ready"
    );

    let cs = source_set_conditions(&obs(vec![R, prog.clone()]));
    assert_eq!(
        status_of(&cs, READY),
        (Status::False, "WaitingForNamespaces")
    );
    assert_eq!(status_of(&cs, RECONCILING).0, Status::True);
    assert_eq!(status_of(&cs, STALLED).0, Status::False);

    let o = obs(vec![R, fail("PodCreationFailed"), prog]);
    assert_eq!(o.ready(), 1);
    assert_eq!(o.failing(), [("dev-1", "PodCreationFailed", "m")]);
    let cs = source_set_conditions(&o);
    assert_eq!(status_of(&cs, READY), (Status::False, "NamespacesFailing"));
    assert_eq!(status_of(&cs, STALLED), (Status::True, "NamespacesFailing"));
    assert_eq!(
        status_of(&cs, RECONCILING),
        (Status::True, "WaitingForNamespaces")
    );
    let msg = &cs.iter().find(|c| c.type_ == STALLED).unwrap().message;
    assert!(
        msg.contains("1/3 namespaces ready; 1 failing: dev-1 (PodCreationFailed)"),
        "{msg}"
    );

    let cs = source_set_conditions(&obs(vec![R, fail("SecretNotFound")]));
    assert_eq!(
        status_of(&cs, RECONCILING),
        (Status::False, "NamespacesFailing")
    );

    let cs = source_set_conditions(&SetObservation {
        invalid: Some(Problem::new(
            "CredentialsNotFound",
            "Secret platform/x not found",
        )),
        namespaces: vec![("dev-0".into(), R)],
    });
    assert_eq!(
        status_of(&cs, READY),
        (Status::False, "CredentialsNotFound")
    );
    assert_eq!(
        status_of(&cs, STALLED),
        (Status::True, "CredentialsNotFound")
    );
}

#[test]
fn a_stamped_restores_state_follows_its_token_and_conditions() {
    use crate::crd::ArchiveRestore;
    let restore = |token: &str, run_token: &str, ready: (&str, &str)| -> ArchiveRestore {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "larch.dev/v1alpha1", "kind": "ArchiveRestore",
            "metadata": {"name": "s", "namespace": "dev-a", "generation": 1,
                         "annotations": {"larch.dev/run-requested": token}},
            "spec": {"archive": {"s3": {"bucket": "b"}}, "tables": [{"name": "t"}],
                     "target": {"postgres": {"connectionSecretRef": {"name": "db", "key": "uri"}}}},
            "status": {"observedGeneration": 1, "run": {"id": "x", "token": run_token},
                       "conditions": [{"type": "Ready", "status": ready.0, "reason": ready.1,
                                       "message": "m", "lastTransitionTime": "2026-12-01T00:00:00Z"}]}
        }))
        .unwrap()
    };
    let ready = restore("epoch-2", "epoch-2", ("True", "Restored"));
    assert_eq!(
        restore_namespace_state(None, Some(&ready)),
        NamespaceState::Ready
    );
    // A new token the restore has not started yet: in progress, not ready.
    let asked = restore("epoch-3", "epoch-2", ("True", "Restored"));
    assert!(matches!(
        restore_namespace_state(None, Some(&asked)),
        NamespaceState::Progressing(_)
    ));
    let waiting = restore("epoch-2", "epoch-2", ("False", DATABASE_UNAVAILABLE));
    assert_eq!(
        restore_namespace_state(None, Some(&waiting)),
        NamespaceState::Failing {
            reason: DATABASE_UNAVAILABLE.into(),
            message: "m".into()
        }
    );
    let running = restore("epoch-2", "epoch-2", ("False", "Restoring"));
    assert!(matches!(
        restore_namespace_state(None, Some(&running)),
        NamespaceState::Progressing(_)
    ));
    assert!(matches!(
        restore_namespace_state(None, None),
        NamespaceState::Progressing(_)
    ));
}
