//! The ArchiveSourceSet reconcile's pure steps.

use super::*;

/// On a large fleet the per-namespace record stays bounded: 100 entries, failing ones
/// first, messages cut; what a namespace's earlier refresh recorded is kept while a new
/// run goes on.
#[test]
fn namespace_restores_are_bounded_failing_first() {
    let namespaces: Vec<(String, NamespaceState)> = (0..150)
        .map(|i| {
            let state = if i % 50 == 49 {
                NamespaceState::Failing {
                    reason: "DatabaseUnavailable".into(),
                    message: "x".repeat(5000),
                }
            } else {
                NamespaceState::Progressing("running".into())
            };
            (format!("dev-{i:03}"), state)
        })
        .collect();
    let obs = SetObservation {
        invalid: None,
        namespaces,
    };
    let previous = vec![NamespaceRestore {
        namespace: "dev-000".into(),
        last_refresh_time: Some("2026-12-01T00:00:00Z".into()),
        epoch: Some(3),
        rows: Some(10),
        ..Default::default()
    }];
    let out = namespace_restores(&obs, &BTreeMap::new(), &previous);
    assert_eq!(out.len(), MAX_RESTORES);
    let failing: Vec<&str> = out[..3].iter().map(|r| r.namespace.as_str()).collect();
    assert_eq!(failing, ["dev-049", "dev-099", "dev-149"]);
    assert_eq!(out[0].failure_message.as_ref().unwrap().len(), 1024);
    assert_eq!(out[3].namespace, "dev-000");
    assert_eq!(out[3].epoch, Some(3), "the last refresh is kept");
    assert_eq!(out[3].failure_reason, None);
    assert_eq!(out[99].namespace, "dev-097");
}
