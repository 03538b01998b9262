//! A pod's status as the kubelet reports it: container states, phase, conditions.

use std::net::Ipv4Addr;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

/// A container's state, as `containerStatuses[].state` says it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum State {
    Waiting {
        reason: String,
        message: String,
    },
    Running {
        started_at: String,
    },
    Terminated {
        exit_code: i32,
        signal: Option<i32>,
        reason: String,
        started_at: String,
        finished_at: String,
    },
}

impl State {
    pub fn json(&self) -> Value {
        match self {
            State::Waiting { reason, message } => {
                json!({"waiting": {"reason": reason, "message": message}})
            }
            State::Running { started_at } => json!({"running": {"startedAt": started_at}}),
            State::Terminated {
                exit_code,
                signal,
                reason,
                started_at,
                finished_at,
            } => {
                let mut t = json!({"exitCode": exit_code, "reason": reason,
                    "startedAt": started_at, "finishedAt": finished_at});
                if let Some(s) = signal {
                    t["signal"] = json!(s);
                }
                json!({ "terminated": t })
            }
        }
    }
}

/// One entry of `containerStatuses` or `initContainerStatuses`.
#[derive(Debug, Clone)]
pub(crate) struct ContainerStatus {
    pub name: String,
    pub image: String,
    pub state: State,
    pub last: Option<State>,
    pub ready: bool,
    pub started: bool,
    pub restarts: u32,
}

impl ContainerStatus {
    pub fn json(&self) -> Value {
        json!({
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restarts,
            "state": self.state.json(),
            "lastState": self.last.as_ref().map_or(json!({}), State::json),
        })
    }
}

/// An init container or a container, by index in the spec.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Which {
    Init(usize),
    Main(usize),
}

/// What the kubelet knows of a pod's containers, from which its status is made.
#[derive(Clone)]
pub(crate) struct PodState {
    pub init: Vec<ContainerStatus>,
    pub main: Vec<ContainerStatus>,
    pub initialized: bool,
    /// Set when an init container failed under `restartPolicy: Never`.
    pub failed: bool,
    /// Why the sandbox or volumes could not be made.
    pub setup_error: Option<String>,
    pub pod_ip: Option<Ipv4Addr>,
}

impl PodState {
    pub fn status(&mut self, which: Which) -> &mut ContainerStatus {
        match which {
            Which::Init(i) => &mut self.init[i],
            Which::Main(i) => &mut self.main[i],
        }
    }
}

pub(crate) fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The pod's `status`: phase (by the restart policy once initialized), conditions
/// (Ready when every container is), IPs and container statuses.
pub(crate) fn pod_status(
    st: &PodState,
    restart_policy: &str,
    host_ip: &str,
    start_time: Option<&str>,
) -> Value {
    let now = now_rfc3339();
    let all_ready = !st.main.is_empty() && st.main.iter().all(|c| c.ready);
    let condition = |kind: &str, ok: bool, reason: Option<&str>| {
        let mut c = json!({"type": kind, "status": if ok { "True" } else { "False" },
            "lastProbeTime": null, "lastTransitionTime": now});
        if let (false, Some(r)) = (ok, reason) {
            c["reason"] = json!(r);
        }
        c
    };
    let terminated = |c: &ContainerStatus| -> Option<bool> {
        match &c.state {
            State::Terminated { exit_code, .. } => Some(*exit_code == 0),
            _ => None,
        }
    };
    let all_done: Option<Vec<bool>> = st.main.iter().map(terminated).collect();
    let phase = if st.failed {
        "Failed"
    } else if !st.initialized || st.setup_error.is_some() {
        "Pending"
    } else {
        match (all_done, restart_policy) {
            (Some(done), "Never") if !done.is_empty() => {
                if done.iter().all(|ok| *ok) {
                    "Succeeded"
                } else {
                    "Failed"
                }
            }
            (Some(done), "OnFailure") if !done.is_empty() && done.iter().all(|ok| *ok) => {
                "Succeeded"
            }
            _ if st.main.iter().any(|c| c.started || c.restarts > 0) => "Running",
            _ => "Pending",
        }
    };
    let mut status = json!({
        "phase": phase,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "conditions": [
            condition("PodScheduled", true, None),
            condition("Initialized", st.initialized, Some("ContainersNotInitialized")),
            condition("ContainersReady", all_ready, Some("ContainersNotReady")),
            condition("Ready", all_ready, Some("ContainersNotReady")),
        ],
        "initContainerStatuses": st.init.iter().map(ContainerStatus::json).collect::<Vec<_>>(),
        "containerStatuses": st.main.iter().map(ContainerStatus::json).collect::<Vec<_>>(),
        "qosClass": "BestEffort",
    });
    if let Some(t) = start_time {
        status["startTime"] = json!(t);
    }
    if let Some(ip) = st.pod_ip {
        status["podIP"] = json!(ip.to_string());
        status["podIPs"] = json!([{"ip": ip.to_string()}]);
    }
    if let Some(e) = &st.setup_error {
        status["reason"] = json!("FailedCreatePodSandBox");
        status["message"] = json!(e);
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(state: State, ready: bool) -> ContainerStatus {
        ContainerStatus {
            name: "main".into(),
            image: "shell".into(),
            started: !matches!(state, State::Waiting { .. }),
            state,
            last: None,
            ready,
            restarts: 0,
        }
    }

    fn terminated(exit_code: i32) -> State {
        State::Terminated {
            exit_code,
            signal: None,
            reason: String::new(),
            started_at: String::new(),
            finished_at: String::new(),
        }
    }

    fn pod(main: Vec<ContainerStatus>, initialized: bool) -> PodState {
        PodState {
            init: Vec::new(),
            main,
            initialized,
            failed: false,
            setup_error: None,
            pod_ip: Some(Ipv4Addr::new(10, 244, 0, 2)),
        }
    }

    fn phase(st: &PodState, policy: &str) -> Value {
        pod_status(st, policy, "10.244.0.1", None)["phase"].clone()
    }

    #[test]
    fn the_phase_follows_init_containers_and_the_restart_policy() {
        let waiting = State::Waiting {
            reason: "PodInitializing".into(),
            message: String::new(),
        };
        assert_eq!(
            phase(&pod(vec![container(waiting, false)], false), "Always"),
            "Pending"
        );
        let running = State::Running {
            started_at: String::new(),
        };
        assert_eq!(
            phase(&pod(vec![container(running, true)], true), "Always"),
            "Running"
        );
        let done = pod(vec![container(terminated(0), false)], true);
        assert_eq!(phase(&done, "Never"), "Succeeded");
        assert_eq!(phase(&done, "OnFailure"), "Succeeded");
        assert_eq!(phase(&done, "Always"), "Running");
        let failed = pod(vec![container(terminated(1), false)], true);
        assert_eq!(phase(&failed, "Never"), "Failed");
        assert_eq!(phase(&failed, "OnFailure"), "Running");
    }

    #[test]
    fn ready_needs_every_container_ready() {
        let running = || State::Running {
            started_at: String::new(),
        };
        let st = pod(
            vec![container(running(), true), container(running(), false)],
            true,
        );
        let status = pod_status(&st, "Always", "10.244.0.1", Some("t"));
        let ready = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Ready")
            .cloned()
            .unwrap_or_default();
        assert_eq!(ready["status"], "False", "{status}");
        assert_eq!(ready["reason"], "ContainersNotReady", "{status}");
        assert_eq!(status["podIP"], "10.244.0.2");
        assert_eq!(status["hostIP"], "10.244.0.1");
        assert_eq!(status["startTime"], "t");
    }

    #[test]
    fn timestamps_are_rfc3339_in_utc() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T', "{t}");
    }
}
