//! The ArchiveExport reconcile's pure helpers.

use super::*;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

fn pod(name: &str, exit: i32, msg: &str, minute: i64) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some(name.into());
    p.status = Some(PodStatus {
        container_statuses: Some(vec![ContainerStatus {
            name: "larch".into(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: exit,
                    message: Some(msg.into()),
                    finished_at: Some(Time(
                        jiff::Timestamp::from_second(1_800_000_000 + minute * 60).unwrap(),
                    )),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ..Default::default()
    });
    p
}

#[test]
fn pods_yield_summaries_and_the_newest_outcome() {
    let ok =
        r#"{"key_prefix":"public.a/","position":"0/1","row_count":3,"table":"public.a","epoch":1}"#;
    let ok2 =
        r#"{"key_prefix":"public.a/","position":"0/2","row_count":4,"table":"public.a","epoch":1}"#;
    let pods = [
        pod("p1", 0, ok, 1),
        pod("p2", 1, "connection refused", 3),
        pod("p3", 0, ok2, 2),
    ];
    let f = read_pods(&pods);
    assert_eq!(f.summaries.len(), 2);
    let PodOutcome {
        succeeded: success,
        detail: msg,
    } = f.newest.unwrap().outcome;
    assert!(!success);
    assert!(
        msg.contains("exited 1") && msg.contains("connection refused"),
        "{msg}"
    );
    let merged = merge_summaries(vec![], f.summaries);
    assert_eq!(merged.len(), 1);
    assert_eq!(
        merged[0].position.as_deref(),
        Some("0/2"),
        "the newest summary per table wins"
    );
}
