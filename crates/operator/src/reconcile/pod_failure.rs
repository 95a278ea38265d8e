//! Why a generated pod's container fails, from its status alone: the termination message the
//! process wrote ([`larch_core::failure::TerminationMessage`]: a reason and the error), the kubelet's
//! verdict (`OOMKilled`, `CreateContainerConfigError`, an image that cannot be pulled), else the
//! exit status and whatever the kubelet kept of the log. Pure: the controllers list the pods,
//! this reads them.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};
use kube::ResourceExt;

use larch_core::failure::{Reason, TerminationMessage};

/// Kubelet waiting reasons that no restart fixes.
const STUCK: [&str; 7] = [
    "CreateContainerConfigError",
    "CreateContainerError",
    "InvalidImageName",
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "RunContainerError",
];

/// A container restarted after a failure counts as failing until it is ready, or has run this
/// long (it may just be slow to become ready: an engine taking a large baseline).
pub const RESTART_GRACE_SECONDS: i64 = 60;

/// Longest message taken from a pod.
const MAX_MESSAGE: usize = 1024;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFailure {
    pub pod: String,
    /// The condition reason: a [`Reason`] name, or the kubelet's waiting reason.
    pub reason: String,
    /// Clears by itself (the database comes back): `Degraded`, not `Stalled`.
    pub transient: bool,
    /// What went wrong, in the pod's words (stable across restarts: no counts or times).
    pub message: String,
}

impl PodFailure {
    /// `<what> pod <name>: <message>`, for a condition.
    pub fn describe(&self, what: &str) -> String {
        format!("{what} pod {}: {}", self.pod, self.message)
    }
}

fn cut(s: &str) -> String {
    let s = s.trim();
    if s.chars().count() <= MAX_MESSAGE {
        return s.to_string();
    }
    let tail: String = s
        .chars()
        .rev()
        .take(MAX_MESSAGE)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("…{tail}")
}

/// What a terminated container says; `None` when it exited 0.
pub fn of_terminated(pod: &str, t: &ContainerStateTerminated) -> Option<PodFailure> {
    if t.exit_code == 0 {
        return None;
    }
    let text = t.message.clone().unwrap_or_default();
    if t.reason.as_deref() == Some("OOMKilled") {
        return Some(PodFailure {
            pod: pod.into(),
            reason: Reason::OutOfMemory.as_str().into(),
            transient: false,
            message: "the container was killed for exceeding its memory limit (OOMKilled): raise spec.resources.limits.memory".into(),
        });
    }
    if let Some(m) = TerminationMessage::parse(&text) {
        let reason = m.reason();
        return Some(PodFailure {
            pod: pod.into(),
            reason: reason.as_str().into(),
            transient: reason.transient(),
            message: format!("exited with status {}: {}", t.exit_code, cut(&m.error)),
        });
    }
    // No termination message (a crash, a signal): the exit status and the log's last lines
    // (FallbackToLogsOnError).
    let how = match t.reason.as_deref() {
        Some(r) if !r.is_empty() && r != "Error" => format!(" ({r})"),
        _ => String::new(),
    };
    let tail = cut(&text);
    Some(PodFailure {
        pod: pod.into(),
        reason: Reason::Failed.as_str().into(),
        transient: false,
        message: if tail.is_empty() {
            format!("exited with status {}{how}", t.exit_code)
        } else {
            format!("exited with status {}{how}: {tail}", t.exit_code)
        },
    })
}

/// Why `container` of `pod` fails, if it does: stuck before starting, exited with an error
/// (and not restarted), or restarting after one and not ready yet.
pub fn container_failure(pod: &Pod, container: &str, now: Timestamp) -> Option<PodFailure> {
    let name = pod.name_any();
    let cs = pod
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == container)?;
    let state = cs.state.as_ref()?;
    if let Some(w) = &state.waiting
        && let Some(reason) = w.reason.as_deref().filter(|r| STUCK.contains(r))
    {
        return Some(PodFailure {
            pod: name,
            reason: reason.into(),
            transient: false,
            message: format!(
                "{reason}: {}",
                cut(w.message.as_deref().unwrap_or("the container cannot start"))
            ),
        });
    }
    if let Some(t) = &state.terminated {
        return of_terminated(&name, t);
    }
    if cs.ready {
        return None;
    }
    let last = cs.last_state.as_ref()?.terminated.as_ref()?;
    let restarting = match &state.running {
        Some(r) => r
            .started_at
            .as_ref()
            .is_none_or(|s| now.duration_since(s.0).as_secs() < RESTART_GRACE_SECONDS),
        // Waiting: CrashLoopBackOff (or about to run again).
        None => true,
    };
    if restarting {
        of_terminated(&name, last)
    } else {
        None
    }
}

/// The newest (by finish time) terminated state of `container` among `pods`, with its pod's
/// name: the last run of a Job's container.
pub fn newest_terminated<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    container: &str,
) -> Option<(String, &'a ContainerStateTerminated)> {
    let mut newest: Option<(String, String, &ContainerStateTerminated)> = None;
    for pod in pods {
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref());
        for cs in statuses
            .into_iter()
            .flatten()
            .filter(|c| c.name == container)
        {
            let Some(t) = cs.state.as_ref().and_then(|s| s.terminated.as_ref()) else {
                continue;
            };
            let at = t
                .finished_at
                .as_ref()
                .map(|f| crate::time::time_string(f.0))
                .unwrap_or_default();
            if newest.as_ref().is_none_or(|(a, _, _)| at > *a) {
                newest = Some((at, pod.name_any(), t));
            }
        }
    }
    newest.map(|(_, pod, t)| (pod, t))
}

/// The failure of the first failing pod among `pods` (by name, for a stable choice).
pub fn first_failure<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    container: &str,
    now: Timestamp,
) -> Option<PodFailure> {
    let mut failures: Vec<PodFailure> = pods
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| container_failure(p, container, now))
        .collect();
    failures.sort_by(|a, b| a.pod.cmp(&b.pod));
    failures.into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "users-7c9d-x2x"},
            "status": {"containerStatuses": [status]},
        }))
        .unwrap()
    }

    fn now() -> Timestamp {
        "2027-01-15T08:10:00Z".parse().unwrap()
    }

    fn status(state: serde_json::Value, last: serde_json::Value, ready: bool) -> serde_json::Value {
        json!({"name": "larch", "image": "i", "imageID": "", "ready": ready, "restartCount": 3,
               "state": state, "lastState": last})
    }

    /// (pod status, reason, transient, message fragment) — the table of what the operator reads.
    #[test]
    fn pod_statuses_map_to_reasons() {
        let term = |code: i32, message: &str, reason: &str| {
            json!({"terminated": {"exitCode": code, "message": message, "reason": reason,
                                  "finishedAt": "2027-01-15T08:09:00Z"}})
        };
        let table_missing =
            r#"{"reason":"TableNotFound","error":"table public.nope does not exist"}"#;
        let refused = r#"{"reason":"ConnectionFailed","error":"cannot connect to PostgreSQL at db:5432/app as user u: Connection refused (os error 111)"}"#;
        let cases: Vec<(serde_json::Value, &str, bool, &str)> = vec![
            // A Job's pod that exited: the termination message.
            (
                status(term(2, table_missing, "Error"), json!({}), false),
                "TableNotFound",
                false,
                "exited with status 2: table public.nope does not exist",
            ),
            // Crash-looping: the last termination.
            (
                status(
                    json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}}),
                    term(1, refused, "Error"),
                    false,
                ),
                "ConnectionFailed",
                true,
                "Connection refused",
            ),
            // Just restarted after a failure, not ready yet.
            (
                status(
                    json!({"running": {"startedAt": "2027-01-15T08:09:50Z"}}),
                    term(
                        2,
                        r#"{"reason":"ColumnNotFound","error":"source s: index field \"x\" is not a column"}"#,
                        "Error",
                    ),
                    false,
                ),
                "ColumnNotFound",
                false,
                "index field \"x\" is not a column",
            ),
            // The kubelet's verdicts.
            (
                status(term(137, "", "OOMKilled"), json!({}), false),
                "OutOfMemory",
                false,
                "limits.memory",
            ),
            (
                status(
                    json!({"waiting": {"reason": "CreateContainerConfigError", "message": "secret \"pg\" not found"}}),
                    json!({}),
                    false,
                ),
                "CreateContainerConfigError",
                false,
                "CreateContainerConfigError: secret \"pg\" not found",
            ),
            // No termination message: the exit status and the log's tail.
            (
                status(
                    term(101, "thread 'main' panicked at src/x.rs:1", "Error"),
                    json!({}),
                    false,
                ),
                "Failed",
                false,
                "exited with status 101: thread 'main' panicked",
            ),
            (
                status(term(143, "", "Error"), json!({}), false),
                "Failed",
                false,
                "exited with status 143",
            ),
            // An unknown reason from a newer pod: Failed, the message kept.
            (
                status(
                    term(2, r#"{"reason":"SomethingNew","error":"oh no"}"#, "Error"),
                    json!({}),
                    false,
                ),
                "Failed",
                false,
                "oh no",
            ),
        ];
        for (s, reason, transient, fragment) in cases {
            let f = container_failure(&pod(s.clone()), "larch", now())
                .unwrap_or_else(|| panic!("a failure in {s}"));
            assert_eq!(f.reason, reason, "{s}");
            assert_eq!(f.transient, transient, "{s}");
            assert!(
                f.message.contains(fragment),
                "{:?} lacks {fragment:?}",
                f.message
            );
            assert_eq!(f.pod, "users-7c9d-x2x");
        }
    }

    #[test]
    fn healthy_finished_or_recovered_containers_are_not_failing() {
        let ok = status(
            json!({"terminated": {"exitCode": 0, "message": "{\"table\":\"public.a\"}"}}),
            json!({}),
            false,
        );
        assert_eq!(container_failure(&pod(ok), "larch", now()), None);
        let failed_before = json!({"terminated": {"exitCode": 1, "message": "{\"reason\":\"ConnectionFailed\",\"error\":\"x\"}"}});
        // Ready again after the database came back.
        let ready = status(
            json!({"running": {"startedAt": "2027-01-15T08:09:50Z"}}),
            failed_before.clone(),
            true,
        );
        assert_eq!(container_failure(&pod(ready), "larch", now()), None);
        // Running for longer than the grace: slow to become ready, not failing.
        let slow = status(
            json!({"running": {"startedAt": "2027-01-15T08:05:00Z"}}),
            failed_before,
            false,
        );
        assert_eq!(container_failure(&pod(slow), "larch", now()), None);
        // Another container's status is not this one's.
        let other = status(json!({"terminated": {"exitCode": 1}}), json!({}), false);
        assert_eq!(container_failure(&pod(other), "engine", now()), None);
    }

    #[test]
    fn the_first_failing_pod_by_name_is_reported() {
        let failing = |name: &str| -> Pod {
            let mut p = pod(status(
                json!({"terminated": {"exitCode": 2, "message": format!("{{\"reason\":\"InvalidConfig\",\"error\":\"{name}\"}}")}}),
                json!({}),
                false,
            ));
            p.metadata.name = Some(name.into());
            p
        };
        let pods = [failing("b-1"), failing("a-0")];
        let f = first_failure(&pods, "larch", now()).unwrap();
        assert_eq!(
            (f.pod.as_str(), f.reason.as_str()),
            ("a-0", "InvalidConfig")
        );
        assert_eq!(
            f.describe("engine"),
            "engine pod a-0: exited with status 2: a-0"
        );
    }
}
