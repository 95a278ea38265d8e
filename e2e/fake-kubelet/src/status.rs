//! Runtime state of a pod's containers and the pure function that turns it into a `PodStatus`.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, HostIP, PodCondition, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

#[derive(Clone, Debug, PartialEq)]
pub enum CState {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: Timestamp,
    },
    Terminated {
        exit_code: i32,
        signal: Option<i32>,
        reason: String,
        message: Option<String>,
        started_at: Timestamp,
        finished_at: Timestamp,
    },
}

impl CState {
    pub fn waiting(reason: &str, message: Option<String>) -> Self {
        CState::Waiting {
            reason: reason.to_string(),
            message,
        }
    }

    fn to_api(&self, container_id: &Option<String>) -> ContainerState {
        match self {
            CState::Waiting { reason, message } => ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.clone()),
                    message: message.clone(),
                }),
                ..Default::default()
            },
            CState::Running { started_at } => ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(*started_at)),
                }),
                ..Default::default()
            },
            CState::Terminated {
                exit_code,
                signal,
                reason,
                message,
                started_at,
                finished_at,
            } => ContainerState {
                terminated: Some(ContainerStateTerminated {
                    container_id: container_id.clone(),
                    exit_code: *exit_code,
                    signal: *signal,
                    reason: Some(reason.clone()),
                    message: message.clone(),
                    started_at: Some(Time(*started_at)),
                    finished_at: Some(Time(*finished_at)),
                }),
                ..Default::default()
            },
        }
    }
}

/// One container as the fake kubelet tracks it.
#[derive(Clone, Debug, PartialEq)]
pub struct CRt {
    pub name: String,
    pub image: String,
    pub image_id: String,
    pub container_id: Option<String>,
    pub state: CState,
    pub last_state: Option<CState>,
    pub ready: bool,
    pub started: bool,
    pub restart_count: i32,
    /// It will not run again (terminated and not restarted by the restart policy, or stopped).
    pub done: bool,
    /// A restartable init container (sidecar).
    pub sidecar: bool,
}

impl CRt {
    pub fn new(name: &str, image: &str, waiting_reason: &str, sidecar: bool) -> Self {
        Self {
            name: name.to_string(),
            image: image.to_string(),
            image_id: String::new(),
            container_id: None,
            state: CState::waiting(waiting_reason, None),
            last_state: None,
            ready: false,
            started: false,
            restart_count: 0,
            done: false,
            sidecar,
        }
    }

    fn exit_code(&self) -> Option<i32> {
        match &self.state {
            CState::Terminated { exit_code, .. } => Some(*exit_code),
            _ => None,
        }
    }

    fn has_run(&self) -> bool {
        !matches!(self.state, CState::Waiting { .. }) || self.last_state.is_some()
    }

    fn to_api(&self, terminal: bool) -> ContainerStatus {
        ContainerStatus {
            name: self.name.clone(),
            image: self.image.clone(),
            image_id: self.image_id.clone(),
            container_id: self.container_id.clone(),
            ready: self.ready && !terminal,
            started: Some(
                self.started && !terminal && matches!(self.state, CState::Running { .. }),
            ),
            restart_count: self.restart_count,
            state: Some(self.state.to_api(&self.container_id)),
            last_state: self.last_state.as_ref().map(|s| s.to_api(&None)),
            ..Default::default()
        }
    }
}

/// A pod as the fake kubelet tracks it.
#[derive(Clone, Debug, PartialEq)]
pub struct PodRt {
    pub pod_ip: Option<String>,
    pub host_ip: String,
    pub start_time: Timestamp,
    pub init: Vec<CRt>,
    pub main: Vec<CRt>,
    /// All (non-sidecar) init containers completed, sidecars started.
    pub init_done: bool,
}

impl PodRt {
    /// Initial state for a pod spec: init containers waiting `PodInitializing`/`ContainerCreating`.
    pub fn new(spec: &PodSpec, host_ip: &str, now: Timestamp) -> Self {
        let init: Vec<CRt> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| {
                let sidecar = c.restart_policy.as_deref() == Some("Always");
                CRt::new(
                    &c.name,
                    c.image.as_deref().unwrap_or(""),
                    "PodInitializing",
                    sidecar,
                )
            })
            .collect();
        let waiting = if init.is_empty() {
            "ContainerCreating"
        } else {
            "PodInitializing"
        };
        Self {
            pod_ip: None,
            host_ip: host_ip.to_string(),
            start_time: now,
            init_done: init.is_empty(),
            init,
            main: spec
                .containers
                .iter()
                .map(|c| CRt::new(&c.name, c.image.as_deref().unwrap_or(""), waiting, false))
                .collect(),
        }
    }

    pub fn container_mut(&mut self, init: bool, idx: usize) -> &mut CRt {
        if init {
            &mut self.init[idx]
        } else {
            &mut self.main[idx]
        }
    }

    /// The pod phase, after the kubelet's `getPhase`.
    pub fn phase(&self) -> &'static str {
        if self
            .init
            .iter()
            .any(|c| !c.sidecar && c.done && c.exit_code().is_some_and(|e| e != 0))
        {
            return "Failed";
        }
        if !self.init_done {
            return if self.main.iter().all(|c| c.done) && !self.main.is_empty() {
                "Failed" // stopped (deleted) while initialising
            } else {
                "Pending"
            };
        }
        if !self.main.is_empty() && self.main.iter().all(|c| c.done) {
            return if self.main.iter().all(|c| c.exit_code() == Some(0)) {
                "Succeeded"
            } else {
                "Failed"
            };
        }
        if self.main.iter().any(CRt::has_run) {
            "Running"
        } else {
            "Pending"
        }
    }
}

fn condition(
    prev: &[PodCondition],
    type_: &str,
    ok: bool,
    reason: Option<String>,
    message: Option<String>,
    now: Timestamp,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    let since = prev
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    PodCondition {
        type_: type_.to_string(),
        status: status.to_string(),
        last_transition_time: Some(since),
        reason: if ok { None } else { reason },
        message: if ok { None } else { message },
        ..Default::default()
    }
}

/// Computes the pod status. `current` is the status stored in the apiserver (the scheduler's
/// `PodScheduled`, readiness gates set by others), `prev` the conditions this kubelet published
/// last (for `lastTransitionTime`).
pub fn pod_status(
    spec: &PodSpec,
    rt: &PodRt,
    current: Option<&PodStatus>,
    prev: &[PodCondition],
    now: Timestamp,
) -> PodStatus {
    let phase = rt.phase();
    let terminal = phase == "Succeeded" || phase == "Failed";
    let current_conditions: &[PodCondition] =
        current.and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
    let unready: Vec<&str> = rt
        .main
        .iter()
        .chain(rt.init.iter().filter(|c| c.sidecar))
        .filter(|c| !c.ready || terminal)
        .map(|c| c.name.as_str())
        .collect();
    let containers_ready = unready.is_empty();
    let (not_ready_reason, not_ready_message) = if terminal {
        ("PodCompleted".to_string(), None)
    } else {
        (
            "ContainersNotReady".to_string(),
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    };
    let gates_ok = spec.readiness_gates.iter().flatten().all(|g| {
        current_conditions
            .iter()
            .any(|c| c.type_ == g.condition_type && c.status == "True")
    });
    let uninitialised: Vec<&str> = rt
        .init
        .iter()
        .filter(|c| !(c.done && c.exit_code() == Some(0) || c.sidecar && c.started))
        .map(|c| c.name.as_str())
        .collect();
    let mut conditions = vec![
        condition(
            prev,
            "PodReadyToStartContainers",
            rt.pod_ip.is_some() && !terminal,
            None,
            None,
            now,
        ),
        condition(
            prev,
            "Initialized",
            rt.init_done,
            Some("ContainersNotInitialized".into()),
            Some(format!(
                "containers with incomplete status: [{}]",
                uninitialised.join(" ")
            )),
            now,
        ),
        condition(
            prev,
            "Ready",
            containers_ready && gates_ok,
            Some(if containers_ready {
                "ReadinessGatesNotReady".into()
            } else {
                not_ready_reason.clone()
            }),
            not_ready_message.clone(),
            now,
        ),
        condition(
            prev,
            "ContainersReady",
            containers_ready,
            Some(not_ready_reason),
            not_ready_message,
            now,
        ),
    ];
    // Keep what others own: PodScheduled (scheduler), readiness gates, DisruptionTarget, ...
    let ours = [
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
    ];
    let mut others: Vec<PodCondition> = current_conditions
        .iter()
        .filter(|c| !ours.contains(&c.type_.as_str()))
        .cloned()
        .collect();
    if !others.iter().any(|c| c.type_ == "PodScheduled") {
        others.insert(
            0,
            condition(&[], "PodScheduled", true, None, None, rt.start_time),
        );
    }
    others.append(&mut conditions);
    let ip = rt.pod_ip.clone();
    PodStatus {
        phase: Some(phase.to_string()),
        conditions: Some(others),
        host_ip: Some(rt.host_ip.clone()),
        host_ips: Some(vec![HostIP {
            ip: rt.host_ip.clone(),
        }]),
        pod_ip: ip.clone(),
        pod_ips: ip.map(|ip| vec![PodIP { ip }]),
        start_time: Some(Time(rt.start_time)),
        init_container_statuses: Some(rt.init.iter().map(|c| c.to_api(terminal)).collect()),
        container_statuses: Some(rt.main.iter().map(|c| c.to_api(terminal)).collect()),
        qos_class: current.and_then(|s| s.qos_class.clone()),
        observed_generation: None,
        ..Default::default()
    }
}

/// The reason of a terminated container.
pub fn exit_reason(exit_code: i32) -> &'static str {
    if exit_code == 0 { "Completed" } else { "Error" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).unwrap()
    }

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn cond<'a>(st: &'a PodStatus, ty: &str) -> &'a PodCondition {
        st.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == ty)
            .unwrap()
    }

    fn terminated(code: i32) -> CState {
        CState::Terminated {
            exit_code: code,
            signal: None,
            reason: exit_reason(code).into(),
            message: Some("bye".into()),
            started_at: t(1),
            finished_at: t(2),
        }
    }

    #[test]
    fn pending_then_running_then_ready() {
        let sp = spec(json!({"containers": [{"name": "a", "image": "larch"}]}));
        let mut rt = PodRt::new(&sp, "127.0.0.1", t(0));
        let st = pod_status(&sp, &rt, None, &[], t(0));
        assert_eq!(st.phase.as_deref(), Some("Pending"));
        let cs = &st.container_statuses.as_ref().unwrap()[0];
        assert_eq!(
            cs.state
                .as_ref()
                .unwrap()
                .waiting
                .as_ref()
                .unwrap()
                .reason
                .as_deref(),
            Some("ContainerCreating")
        );
        assert_eq!(cond(&st, "PodScheduled").status, "True");
        assert_eq!(cond(&st, "Initialized").status, "True");
        assert_eq!(cond(&st, "Ready").status, "False");

        rt.pod_ip = Some("127.1.0.1".into());
        rt.main[0].state = CState::Running { started_at: t(5) };
        rt.main[0].started = true;
        let st1 = pod_status(&sp, &rt, None, st.conditions.as_deref().unwrap(), t(5));
        assert_eq!(st1.phase.as_deref(), Some("Running"));
        assert_eq!(st1.pod_ip.as_deref(), Some("127.1.0.1"));
        assert_eq!(st1.pod_ips.as_ref().unwrap()[0].ip, "127.1.0.1");
        assert_eq!(cond(&st1, "Ready").status, "False");
        assert_eq!(
            cond(&st1, "Ready").message.as_deref(),
            Some("containers with unready status: [a]")
        );
        assert_eq!(cond(&st1, "PodReadyToStartContainers").status, "True");

        rt.main[0].ready = true;
        let st2 = pod_status(&sp, &rt, None, st1.conditions.as_deref().unwrap(), t(9));
        let ready = cond(&st2, "Ready");
        assert_eq!(ready.status, "True");
        assert_eq!(ready.last_transition_time, Some(Time(t(9))));
        assert_eq!(cond(&st2, "ContainersReady").status, "True");
        let cs = &st2.container_statuses.as_ref().unwrap()[0];
        assert!(cs.ready);
        assert_eq!(cs.started, Some(true));
        assert_eq!(
            cs.state
                .as_ref()
                .unwrap()
                .running
                .as_ref()
                .unwrap()
                .started_at,
            Some(Time(t(5)))
        );
        // unchanged condition keeps its transition time
        let st3 = pod_status(&sp, &rt, None, st2.conditions.as_deref().unwrap(), t(20));
        assert_eq!(cond(&st3, "Ready").last_transition_time, Some(Time(t(9))));
    }

    #[test]
    fn completion_and_failure() {
        let sp =
            spec(json!({"restartPolicy": "Never", "containers": [{"name": "a"}, {"name": "b"}]}));
        let mut rt = PodRt::new(&sp, "127.0.0.1", t(0));
        rt.main[0].state = terminated(0);
        rt.main[0].done = true;
        rt.main[1].state = CState::Running { started_at: t(1) };
        assert_eq!(rt.phase(), "Running");
        rt.main[1].state = terminated(0);
        rt.main[1].done = true;
        let st = pod_status(&sp, &rt, None, &[], t(3));
        assert_eq!(st.phase.as_deref(), Some("Succeeded"));
        let term = st.container_statuses.as_ref().unwrap()[0]
            .state
            .clone()
            .unwrap()
            .terminated
            .unwrap();
        assert_eq!(term.exit_code, 0);
        assert_eq!(term.reason.as_deref(), Some("Completed"));
        assert_eq!(term.message.as_deref(), Some("bye"));
        assert_eq!(cond(&st, "Ready").reason.as_deref(), Some("PodCompleted"));
        assert!(!st.container_statuses.as_ref().unwrap()[0].ready);

        rt.main[1].state = terminated(3);
        let st = pod_status(&sp, &rt, None, &[], t(3));
        assert_eq!(st.phase.as_deref(), Some("Failed"));
        let term = st.container_statuses.as_ref().unwrap()[1]
            .state
            .clone()
            .unwrap()
            .terminated
            .unwrap();
        assert_eq!((term.exit_code, term.reason.as_deref()), (3, Some("Error")));
    }

    #[test]
    fn restarting_container_keeps_pod_running() {
        let sp = spec(json!({"containers": [{"name": "a"}]}));
        let mut rt = PodRt::new(&sp, "127.0.0.1", t(0));
        rt.main[0].last_state = Some(terminated(1));
        rt.main[0].restart_count = 1;
        rt.main[0].state = CState::waiting("CrashLoopBackOff", Some("back-off 2s".into()));
        let st = pod_status(&sp, &rt, None, &[], t(3));
        assert_eq!(st.phase.as_deref(), Some("Running"));
        let cs = &st.container_statuses.as_ref().unwrap()[0];
        assert_eq!(cs.restart_count, 1);
        assert_eq!(
            cs.last_state
                .as_ref()
                .unwrap()
                .terminated
                .as_ref()
                .unwrap()
                .exit_code,
            1
        );
        assert_eq!(
            cs.state
                .as_ref()
                .unwrap()
                .waiting
                .as_ref()
                .unwrap()
                .reason
                .as_deref(),
            Some("CrashLoopBackOff")
        );
    }

    #[test]
    fn init_containers() {
        let sp = spec(
            json!({"restartPolicy": "Never", "initContainers": [{"name": "i"}], "containers": [{"name": "a"}]}),
        );
        let mut rt = PodRt::new(&sp, "127.0.0.1", t(0));
        let st = pod_status(&sp, &rt, None, &[], t(0));
        assert_eq!(st.phase.as_deref(), Some("Pending"));
        assert_eq!(cond(&st, "Initialized").status, "False");
        assert_eq!(
            cond(&st, "Initialized").message.as_deref(),
            Some("containers with incomplete status: [i]")
        );
        let w = st.container_statuses.as_ref().unwrap()[0]
            .state
            .clone()
            .unwrap()
            .waiting
            .unwrap();
        assert_eq!(w.reason.as_deref(), Some("PodInitializing"));
        // init fails with restartPolicy Never -> Failed
        rt.init[0].state = terminated(2);
        rt.init[0].done = true;
        assert_eq!(rt.phase(), "Failed");
        // init succeeded
        rt.init[0].state = terminated(0);
        rt.init_done = true;
        let st = pod_status(&sp, &rt, None, &[], t(1));
        assert_eq!(cond(&st, "Initialized").status, "True");
        assert_eq!(st.phase.as_deref(), Some("Pending"));
    }

    #[test]
    fn keeps_foreign_conditions_and_readiness_gates() {
        let sp = spec(
            json!({"readinessGates": [{"conditionType": "example.com/gate"}], "containers": [{"name": "a"}]}),
        );
        let mut rt = PodRt::new(&sp, "127.0.0.1", t(0));
        rt.main[0].state = CState::Running { started_at: t(1) };
        rt.main[0].ready = true;
        rt.main[0].started = true;
        let current: PodStatus = serde_json::from_value(json!({"conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2027-01-15T08:00:00Z"},
            {"type": "example.com/gate", "status": "False"}
        ], "qosClass": "BestEffort"})).unwrap();
        let st = pod_status(&sp, &rt, Some(&current), &[], t(2));
        assert_eq!(cond(&st, "Ready").status, "False");
        assert_eq!(
            cond(&st, "Ready").reason.as_deref(),
            Some("ReadinessGatesNotReady")
        );
        assert_eq!(cond(&st, "ContainersReady").status, "True");
        assert_eq!(
            cond(&st, "PodScheduled")
                .last_transition_time
                .as_ref()
                .unwrap()
                .0
                .to_string(),
            "2027-01-15T08:00:00Z"
        );
        assert_eq!(st.qos_class.as_deref(), Some("BestEffort"));
        let mut current = current;
        current.conditions.as_mut().unwrap()[1].status = "True".into();
        let st = pod_status(&sp, &rt, Some(&current), &[], t(2));
        assert_eq!(cond(&st, "Ready").status, "True");
    }
}
