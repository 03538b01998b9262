//! One pod's life on the kubelet: sandbox and volumes, init containers in order,
//! containers in order (each after the previous one's postStart hook), probes,
//! restarts, graceful termination, and the status written back.

use std::collections::{BTreeMap, VecDeque};
use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::process::Child;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::env::{container_env, expand, PodFacts};
use super::images::Images;
use super::node::{Node, PodSandbox};
use super::pod_status::{now_rfc3339, pod_status, ContainerStatus, PodState, State, Which};
use super::probe::{http_get, port, Probe, ProbeAction};
use super::process::{ContainerLog, Joined, ProcessGroup, ProcessSpec};
use super::resources::memory_limit;
use super::volumes::{Mount, PodVolumes};
use crate::api_server::lock;
use crate::cgroup::MemoryCgroup;
use crate::ApiServer;

/// Restart back-off: doubling from 1 s, capped at 10 s (Kubernetes: 10 s to 5 min;
/// shorter so tests are fast). It starts again from 1 s after a container ran 10 s.
const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_CAP: Duration = Duration::from_secs(10);
/// How often the status is compared with what was last written when nothing woke the
/// writer (a backstop: container changes wake it at once).
const STATUS_INTERVAL: Duration = Duration::from_millis(100);
/// Logs kept for containers, live and gone (oldest dropped first).
const MAX_LOGS: usize = 256;

/// What the kubelet's tasks share.
pub(crate) struct KubeletShared {
    pub api: Arc<ApiServer>,
    pub node: Arc<Node>,
    pub images: Images,
    pub dir: PathBuf,
    /// What each pod holds on the machine, by pod uid; dropping an entry frees it.
    pub pods: Mutex<BTreeMap<String, PodResources>>,
    pub logs: Mutex<LogIndex>,
    /// Set when the kubelet is dropped: nothing new is started after it.
    pub closed: AtomicBool,
}

#[derive(Default)]
pub(crate) struct LogIndex {
    by_container: BTreeMap<(String, String, String), Arc<ContainerLog>>,
    order: VecDeque<(String, String, String)>,
}

impl LogIndex {
    pub fn get(&self, ns: &str, pod: &str, container: &str) -> Option<Arc<ContainerLog>> {
        self.by_container
            .get(&(ns.to_string(), pod.to_string(), container.to_string()))
            .cloned()
    }

    fn insert(&mut self, key: (String, String, String), log: Arc<ContainerLog>) {
        if self.by_container.insert(key.clone(), log).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > MAX_LOGS {
            if let Some(old) = self.order.pop_front() {
                self.by_container.remove(&old);
            }
        }
    }
}

/// What one pod holds on the machine: killed and removed on drop (process groups
/// first, then the sandbox, mount points and files).
pub(crate) struct PodResources {
    pub namespace: String,
    pub name: String,
    pub netns: String,
    groups: Vec<Arc<ProcessGroup>>,
    sandbox: Option<PodSandbox>,
    volumes: Option<PodVolumes>,
    dir: PathBuf,
}

impl Drop for PodResources {
    fn drop(&mut self) {
        for g in &self.groups {
            g.signal(Signal::SIGKILL);
        }
        self.volumes = None;
        self.sandbox = None;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A pod being run: its spec as first seen (pods are immutable where it matters).
struct PodRun {
    k: Arc<KubeletShared>,
    uid: String,
    namespace: String,
    name: String,
    pod: Value,
    netns: String,
    ip: Ipv4Addr,
    restart_policy: String,
    /// Mounts of init containers then containers.
    init_mounts: Vec<Vec<Mount>>,
    main_mounts: Vec<Vec<Mount>>,
    state: Mutex<PodState>,
    /// Wakes the status writer when a container's status changed.
    changed: tokio::sync::Notify,
    /// `status.startTime`: when the kubelet took the pod (none while it cannot).
    start_time: Option<String>,
}

fn containers(pod: &Value, field: &str) -> Vec<Value> {
    pod.pointer(&format!("/spec/{field}"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn str_of<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

/// The grace a deletion gives: `deletionGracePeriodSeconds`, else the spec's
/// `terminationGracePeriodSeconds`, else 30 s.
fn grace(pod: &Value) -> Duration {
    let secs = pod
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_u64)
        .or_else(|| {
            pod.pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_u64)
        })
        .unwrap_or(30);
    Duration::from_secs(secs)
}

fn uid_of(pod: &Value) -> &str {
    str_of(pod, "/metadata/uid")
}

/// Runs the pod whose latest object `updates` holds (`None`: removed from the store)
/// until it is deleted and cleaned up.
pub(crate) async fn run_pod(
    k: Arc<KubeletShared>,
    uid: String,
    mut updates: watch::Receiver<Option<Value>>,
) {
    let Some(pod) = updates.borrow().clone() else {
        return;
    };
    let namespace = str_of(&pod, "/metadata/namespace").to_string();
    let name = str_of(&pod, "/metadata/name").to_string();
    let init_specs = containers(&pod, "initContainers");
    let main_specs = containers(&pod, "containers");
    let status_of = |c: &Value| ContainerStatus {
        name: str_of(c, "/name").to_string(),
        image: str_of(c, "/image").to_string(),
        state: State::Waiting {
            reason: "PodInitializing".into(),
            message: String::new(),
        },
        last: None,
        ready: false,
        started: false,
        restarts: 0,
    };
    let state = PodState {
        init: init_specs.iter().map(status_of).collect(),
        main: main_specs.iter().map(status_of).collect(),
        initialized: init_specs.is_empty(),
        failed: false,
        setup_error: None,
        pod_ip: None,
    };
    {
        let mut logs = lock(&k.logs);
        for c in init_specs.iter().chain(&main_specs) {
            let cname = str_of(c, "/name").to_string();
            let file = k.dir.join("logs").join(format!(
                "{namespace}_{name}_{}_{cname}.log",
                uid.get(..8).unwrap_or(&uid)
            ));
            logs.insert(
                (namespace.clone(), name.clone(), cname),
                Arc::new(ContainerLog::new(file)),
            );
        }
    }

    // Retried with back-off: a ConfigMap or Secret a volume needs may come later
    // (manifests applied in any order), as the kubelet retries mounts.
    let mut attempts = 0;
    let (netns, ip, init_mounts, main_mounts) = loop {
        let setup = {
            let (k, pod, uid, namespace, name) = (
                k.clone(),
                pod.clone(),
                uid.clone(),
                namespace.clone(),
                name.clone(),
            );
            tokio::task::spawn_blocking(move || setup(&k, &pod, &uid, &namespace, &name)).await
        };
        let message = match setup {
            Ok(Ok(made)) => break made,
            Ok(Err(message)) => message,
            Err(join) => join.to_string(),
        };
        let delay = backoff(attempts);
        if !setup_failed(&k, &pod, state.clone(), message, &mut updates, delay).await {
            return;
        }
        attempts += 1;
    };
    let run = Arc::new(PodRun {
        k: k.clone(),
        uid: uid.clone(),
        namespace,
        name,
        restart_policy: match str_of(&pod, "/spec/restartPolicy") {
            "" => "Always".to_string(),
            p => p.to_string(),
        },
        pod: pod.clone(),
        netns,
        ip,
        init_mounts,
        main_mounts,
        state: Mutex::new(PodState {
            pod_ip: Some(ip),
            ..state
        }),
        changed: tokio::sync::Notify::new(),
        start_time: Some(now_rfc3339()),
    });

    let (stop_tx, stop_rx) = watch::channel(None::<Instant>);
    let mut lifecycle = JoinSet::new();
    lifecycle.spawn(run_containers(run.clone(), stop_rx));
    let mut last_seen = pod;
    loop {
        run.write_status().await;
        let changed = tokio::select! {
            changed = updates.changed() => changed.is_ok(),
            _ = run.changed.notified() => true,
            _ = tokio::time::sleep(STATUS_INTERVAL) => true,
        };
        if !changed {
            // The kubelet is gone; its drop cleans up.
            return;
        }
        let latest = updates.borrow().clone();
        match latest {
            Some(p) if uid_of(&p) == uid && p.pointer("/metadata/deletionTimestamp").is_none() => {
                last_seen = p;
            }
            Some(p) if uid_of(&p) == uid => {
                last_seen = p;
                break;
            }
            _ => break,
        }
    }

    // Graceful termination: SIGTERM now, SIGKILL at the deadline (every container).
    let deadline = Instant::now() + grace(&last_seen);
    let _ = stop_tx.send(Some(deadline));
    let all_stopped = async { while lifecycle.join_next().await.is_some() {} };
    let _ = tokio::time::timeout_at(deadline + Duration::from_secs(5), all_stopped).await;
    {
        let mut guard = lock(&run.state);
        let st = &mut *guard;
        for c in st.main.iter_mut().chain(st.init.iter_mut()) {
            c.ready = false;
        }
    }
    if let Some(stored) = k.api.get("pods", &run.namespace, &run.name) {
        if uid_of(&stored) == uid {
            k.api.delete_now("pods", &run.namespace, &run.name);
        }
    }
    let resources = lock(&k.pods).remove(&uid);
    // Its drop runs `ip netns del` and friends: off the async workers.
    let _ = tokio::task::spawn_blocking(move || drop(resources)).await;
}

type Setup = (String, Ipv4Addr, Vec<Vec<Mount>>, Vec<Vec<Mount>>);

/// Makes the sandbox and the volumes, and registers them (so the kubelet's drop
/// frees them whatever happens next).
fn setup(k: &KubeletShared, pod: &Value, uid: &str, ns: &str, name: &str) -> Result<Setup, String> {
    let dir = k.dir.join("pods").join(uid);
    std::fs::create_dir_all(&dir).map_err(|e| format!("pod directory {}: {e}", dir.display()))?;
    let sandbox = k
        .node
        .create_pod_sandbox(ns, name)
        .map_err(|e| format!("pod sandbox: {e}"));
    let sandbox = match sandbox {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    let ip = sandbox.ip();
    let netns = sandbox.netns().to_string();
    let mut resources = PodResources {
        namespace: ns.to_string(),
        name: name.to_string(),
        netns: netns.clone(),
        groups: Vec::new(),
        sandbox: Some(sandbox),
        volumes: None,
        dir: dir.clone(),
    };
    let facts = PodFacts {
        pod,
        pod_ip: ip.to_string(),
        host_ip: k.node.ip().to_string(),
        node_name: k.node.name(),
    };
    // On an error, `resources` drops here and removes what was made.
    let mut volumes =
        PodVolumes::materialize(&k.api, &facts, k.node.ca_pem(), &dir.join("volumes"))?;
    let mut mounts = |field: &str| -> Result<Vec<Vec<Mount>>, String> {
        containers(pod, field)
            .iter()
            .map(|c| volumes.mounts(c))
            .collect()
    };
    let init = mounts("initContainers")?;
    let main = mounts("containers")?;
    resources.volumes = Some(volumes);
    // Checked under the lock the kubelet's drop takes after setting `closed`: what is
    // registered here is freed by that drop, and what comes after is freed here.
    let mut pods = lock(&k.pods);
    if k.closed.load(Ordering::SeqCst) {
        drop(pods);
        return Err("the kubelet is stopped".to_string());
    }
    pods.insert(uid.to_string(), resources);
    Ok((netns, ip, init, main))
}

/// The sandbox or volumes could not be made: says so in the status and waits `delay`
/// before the next try (true), unless the pod is deleted first (false; the deletion
/// is completed).
async fn setup_failed(
    k: &Arc<KubeletShared>,
    pod: &Value,
    state: PodState,
    message: String,
    updates: &mut watch::Receiver<Option<Value>>,
    delay: Duration,
) -> bool {
    let uid = uid_of(pod).to_string();
    let run = PodRun {
        k: k.clone(),
        uid: uid.clone(),
        namespace: str_of(pod, "/metadata/namespace").to_string(),
        name: str_of(pod, "/metadata/name").to_string(),
        pod: pod.clone(),
        netns: String::new(),
        ip: Ipv4Addr::UNSPECIFIED,
        restart_policy: String::new(),
        init_mounts: Vec::new(),
        main_mounts: Vec::new(),
        state: Mutex::new(PodState {
            setup_error: Some(message),
            ..state
        }),
        changed: tokio::sync::Notify::new(),
        start_time: None,
    };
    run.write_status().await;
    let retry_at = Instant::now() + delay;
    loop {
        tokio::select! {
            changed = updates.changed() => {
                if changed.is_err() {
                    return false;
                }
            }
            _ = tokio::time::sleep_until(retry_at) => return true,
        }
        let gone = match &*updates.borrow() {
            Some(p) => uid_of(p) != uid || p.pointer("/metadata/deletionTimestamp").is_some(),
            None => true,
        };
        if gone {
            if k.api
                .get("pods", &run.namespace, &run.name)
                .is_some_and(|p| uid_of(&p) == uid)
            {
                k.api.delete_now("pods", &run.namespace, &run.name);
            }
            return false;
        }
    }
}

enum Outcome {
    /// The pod is terminating; the container was stopped (or never started).
    Stopped,
    /// It could not be started; the waiting reason is in its status.
    NotStarted,
    Exited {
        success: bool,
        ran_for: Duration,
    },
}

fn backoff(failures: u32) -> Duration {
    BACKOFF_START
        .saturating_mul(1u32 << failures.min(8))
        .min(BACKOFF_CAP)
}

/// Sleeps, unless the pod starts terminating first (then false).
async fn pause(d: Duration, stop: &mut watch::Receiver<Option<Instant>>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = stop.wait_for(Option::is_some) => false,
    }
}

/// Init containers in order to completion (a failing one retried with back-off), then
/// the containers in order, each after the previous one has started and its
/// postStart hook returned.
async fn run_containers(run: Arc<PodRun>, mut stop: watch::Receiver<Option<Instant>>) {
    for i in 0..run.init_mounts.len() {
        let mut failures = 0;
        loop {
            let outcome = run.run_once(Which::Init(i), stop.clone(), &mut None).await;
            match outcome {
                Outcome::Stopped => return,
                Outcome::Exited { success: true, .. } => break,
                Outcome::Exited { success: false, .. } if run.restart_policy == "Never" => {
                    lock(&run.state).failed = true;
                    run.changed.notify_one();
                    return;
                }
                Outcome::Exited { .. } => run.set(Which::Init(i), |c| {
                    c.last = Some(c.state.clone());
                    c.state = State::Waiting {
                        reason: "CrashLoopBackOff".into(),
                        message: format!(
                            "back-off {:?} restarting failed container",
                            backoff(failures)
                        ),
                    };
                }),
                Outcome::NotStarted => {}
            }
            if !pause(backoff(failures), &mut stop).await {
                return;
            }
            failures += 1;
            if matches!(outcome, Outcome::Exited { .. }) {
                run.set(Which::Init(i), |c| c.restarts += 1);
            }
        }
    }
    lock(&run.state).initialized = true;
    run.changed.notify_one();
    let mut runners = JoinSet::new();
    for i in 0..run.main_mounts.len() {
        let (started_tx, started_rx) = oneshot::channel();
        runners.spawn(run.clone().run_main(i, stop.clone(), started_tx));
        tokio::select! {
            _ = started_rx => {}
            _ = stop.wait_for(Option::is_some) => break,
        }
    }
    while runners.join_next().await.is_some() {}
}

impl PodRun {
    fn spec(&self, which: Which) -> &Value {
        let (field, i) = match which {
            Which::Init(i) => ("initContainers", i),
            Which::Main(i) => ("containers", i),
        };
        self.pod
            .pointer(&format!("/spec/{field}/{i}"))
            .unwrap_or(&Value::Null)
    }

    fn log(&self, which: Which) -> Option<Arc<ContainerLog>> {
        let name = str_of(self.spec(which), "/name");
        lock(&self.k.logs).get(&self.namespace, &self.name, name)
    }

    fn set(&self, which: Which, f: impl FnOnce(&mut ContainerStatus)) {
        f(lock(&self.state).status(which));
        self.changed.notify_one();
    }

    async fn run_main(
        self: Arc<Self>,
        i: usize,
        mut stop: watch::Receiver<Option<Instant>>,
        started: oneshot::Sender<()>,
    ) {
        let mut started = Some(started);
        let mut failures = 0;
        loop {
            let outcome = self
                .run_once(Which::Main(i), stop.clone(), &mut started)
                .await;
            if let Some(tx) = started.take() {
                let _ = tx.send(());
            }
            match outcome {
                Outcome::Stopped => return,
                Outcome::NotStarted => {}
                Outcome::Exited { success, ran_for } => {
                    let again = match self.restart_policy.as_str() {
                        "Never" => false,
                        "OnFailure" => !success,
                        _ => true,
                    };
                    if !again {
                        return;
                    }
                    if ran_for >= BACKOFF_CAP {
                        failures = 0;
                    }
                    self.set(Which::Main(i), |c| {
                        c.last = Some(c.state.clone());
                        c.state = State::Waiting {
                            reason: "CrashLoopBackOff".into(),
                            message: format!(
                                "back-off {:?} restarting failed container",
                                backoff(failures)
                            ),
                        };
                    });
                }
            }
            if !pause(backoff(failures), &mut stop).await {
                return;
            }
            failures += 1;
            if matches!(outcome, Outcome::Exited { .. }) {
                self.set(Which::Main(i), |c| c.restarts += 1);
            }
        }
    }

    /// The process spec and argv of a container, or its waiting reason.
    fn prepare(&self, which: Which) -> Result<(ProcessSpec, Vec<String>), (String, String)> {
        let c = self.spec(which);
        let facts = PodFacts {
            pod: &self.pod,
            pod_ip: self.ip.to_string(),
            host_ip: self.k.node.ip().to_string(),
            node_name: self.k.node.name(),
        };
        let env = container_env(&self.k.api, &facts, c)
            .map_err(|e| ("CreateContainerConfigError".to_string(), e))?;
        let words = |field: &str| -> Vec<String> {
            c.get(field)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(|w| expand(w, &env))
                .collect()
        };
        let argv = self
            .k
            .images
            .argv(str_of(c, "/image"), &words("command"), &words("args"))
            .map_err(|(r, m)| (r.to_string(), m))?;
        let id = |field: &str| {
            c.pointer(&format!("/securityContext/{field}"))
                .or_else(|| self.pod.pointer(&format!("/spec/securityContext/{field}")))
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
        };
        let user = match (id("runAsUser"), id("runAsGroup")) {
            (None, None) => None,
            (u, g) => Some((u.unwrap_or(0), g.unwrap_or(0))),
        };
        let mounts = match which {
            Which::Init(i) => self.init_mounts.get(i),
            Which::Main(i) => self.main_mounts.get(i),
        };
        Ok((
            ProcessSpec {
                netns: self.netns.clone(),
                hostname: match str_of(&self.pod, "/spec/hostname") {
                    "" => self.name.clone(),
                    h => h.to_string(),
                },
                mounts: mounts.cloned().unwrap_or_default(),
                user,
                working_dir: c
                    .get("workingDir")
                    .and_then(Value::as_str)
                    .map(String::from),
                env,
                cgroup: None,
            },
            argv,
        ))
    }

    /// A hook's or exec probe's argv: its first word from the image when it has it.
    fn exec_argv(&self, which: Which, command: &[String]) -> Vec<String> {
        self.k
            .images
            .argv(str_of(self.spec(which), "/image"), command, &[])
            .unwrap_or_else(|_| command.to_vec())
    }

    /// Starts a process, registered with the pod's resources so that the kubelet's
    /// drop kills it. Its output goes to the container's log, or nowhere for hooks
    /// (as `kubectl logs` shows only the container's own).
    fn start(
        &self,
        spec: &ProcessSpec,
        argv: &[String],
        which: Which,
        logged: bool,
    ) -> std::io::Result<(Child, Arc<ProcessGroup>)> {
        if self.k.closed.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("the kubelet is stopped"));
        }
        let (mut child, group) = spec.spawn(argv)?;
        match lock(&self.k.pods).get_mut(&self.uid) {
            Some(r) => r.groups.push(group.clone()),
            None => return Err(std::io::Error::other("the pod is gone")),
        }
        let (out, err) = (child.stdout.take(), child.stderr.take());
        match self.log(which) {
            Some(log) if logged => {
                if let Some(out) = out {
                    tokio::spawn(log.clone().pump(out));
                }
                if let Some(err) = err {
                    tokio::spawn(log.pump(err));
                }
            }
            // Drained, so that a chatty hook never blocks on a full pipe.
            _ => {
                if let Some(mut out) = out {
                    tokio::spawn(
                        async move { tokio::io::copy(&mut out, &mut tokio::io::sink()).await },
                    );
                }
                if let Some(mut err) = err {
                    tokio::spawn(
                        async move { tokio::io::copy(&mut err, &mut tokio::io::sink()).await },
                    );
                }
            }
        }
        Ok((child, group))
    }

    fn forget(&self, group: &Arc<ProcessGroup>) {
        group.finish();
        if let Some(r) = lock(&self.k.pods).get_mut(&self.uid) {
            r.groups.retain(|g| !Arc::ptr_eq(g, group));
        }
    }

    /// Runs an exec (hook or probe) in the container's namespaces, as its user.
    async fn exec(
        &self,
        which: Which,
        spec: &ProcessSpec,
        command: &[String],
    ) -> Result<(), String> {
        let argv = self.exec_argv(which, command);
        let (mut child, group) = self
            .start(spec, &argv, which, false)
            .map_err(|e| e.to_string())?;
        let status = child.wait().await;
        self.forget(&group);
        match status {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("{command:?} exited with {s}")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// A `lifecycle` handler (`postStart`, `preStop`): `exec` in the container,
    /// `httpGet` from the node to the pod IP, or `sleep`. `None` when there is none.
    async fn run_hook(
        &self,
        which: Which,
        spec: &ProcessSpec,
        name: &str,
    ) -> Option<Result<(), String>> {
        let container = self.spec(which);
        let hook = container.pointer(&format!("/lifecycle/{name}"))?;
        if let Some(command) = hook.pointer("/exec/command").and_then(Value::as_array) {
            let command: Vec<String> = command
                .iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect();
            return Some(self.exec(which, spec, &command).await);
        }
        if let Some(get) = hook.get("httpGet") {
            let Some(port) = port(get.get("port"), container) else {
                return Some(Err(format!("{name}: httpGet port not found")));
            };
            let path = get.get("path").and_then(Value::as_str).unwrap_or("/");
            return Some(http_get(&self.k.node, self.ip, port, path).await);
        }
        if let Some(secs) = hook.pointer("/sleep/seconds").and_then(Value::as_u64) {
            tokio::time::sleep(Duration::from_secs(secs)).await;
            return Some(Ok(()));
        }
        Some(Err(format!("{name}: no exec, httpGet or sleep")))
    }

    /// As the kubelet stops a container: its `preStop` hook (within the grace),
    /// then SIGTERM, then SIGKILL at the deadline.
    async fn terminate(
        &self,
        which: Which,
        spec: &ProcessSpec,
        child: &mut Child,
        group: &ProcessGroup,
        deadline: Instant,
    ) -> std::io::Result<ExitStatus> {
        let hook = self.run_hook(which, spec, "preStop");
        if let Some(ran) = tokio::time::timeout_at(deadline, hook).await.ok().flatten() {
            if let (Err(e), Some(log)) = (ran, self.log(which)) {
                log.note(&format!("FailedPreStopHook: {e}"));
            }
        } else if let Some(log) = self.log(which) {
            if self.spec(which).pointer("/lifecycle/preStop").is_some() {
                log.note("FailedPreStopHook: still running at the end of the grace");
            }
        }
        group.signal(Signal::SIGTERM);
        match tokio::time::timeout_at(deadline, child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                group.signal(Signal::SIGKILL);
                child.wait().await
            }
        }
    }

    /// One run of one container: start, postStart, probes, until it exits or the pod
    /// terminates.
    async fn run_once(
        &self,
        which: Which,
        mut stop: watch::Receiver<Option<Instant>>,
        started: &mut Option<oneshot::Sender<()>>,
    ) -> Outcome {
        if stop.borrow().is_some() {
            return Outcome::Stopped;
        }
        let prepared = self.prepare(which).and_then(|(spec, argv)| {
            let limit = memory_limit(self.spec(which))
                .map_err(|e| ("CreateContainerConfigError".to_string(), e))?;
            Ok((spec, argv, limit))
        });
        let (mut spec, argv, limit) = match prepared {
            Ok(p) => p,
            Err((reason, message)) => {
                if let Some(log) = self.log(which) {
                    log.note(&format!("{reason}: {message}"));
                }
                self.set(which, |c| c.state = State::Waiting { reason, message });
                return Outcome::NotStarted;
            }
        };
        // A fresh cgroup each run, so its OOM count is this run's.
        let cgroup = limit.and_then(|bytes| match MemoryCgroup::create(bytes) {
            Ok(cgroup) => Some(cgroup),
            Err(e) => {
                if let Some(log) = self.log(which) {
                    log.note(&format!("memory limit not applied: {e}"));
                }
                None
            }
        });
        spec.cgroup = cgroup.as_ref().map(|c| Joined {
            procs: c.procs(),
            name: c.name(),
            v2: c.is_v2(),
        });
        let (mut child, group) = match self.start(&spec, &argv, which, true) {
            Ok(started) => started,
            Err(e) => {
                self.set(which, |c| {
                    c.state = State::Waiting {
                        reason: "RunContainerError".into(),
                        message: e.to_string(),
                    }
                });
                return Outcome::NotStarted;
            }
        };
        let started_at = now_rfc3339();
        let began = Instant::now();
        self.set(which, |c| {
            c.state = State::Running {
                started_at: started_at.clone(),
            };
            c.started = true;
            c.ready = false;
        });
        let c = self.spec(which).clone();
        let log = self.log(which);
        let note = |line: &str| {
            if let Some(log) = &log {
                log.note(line);
            }
        };

        let mut exited: Option<std::io::Result<ExitStatus>> = None;
        let mut stopped = false;
        let result = tokio::select! {
            r = self.run_hook(which, &spec, "postStart") => r,
            _ = stop.wait_for(Option::is_some) => None,
        };
        if let Some(Err(e)) = result {
            // As the kubelet: a failed postStart hook kills the container.
            note(&format!("FailedPostStartHook: {e}"));
            group.signal(Signal::SIGKILL);
        }
        if let Some(tx) = started.take() {
            let _ = tx.send(());
        }

        let probes = match which {
            Which::Main(_) => (
                Probe::parse(&c, "readinessProbe"),
                Probe::parse(&c, "livenessProbe"),
            ),
            Which::Init(_) => (Ok(None), Ok(None)),
        };
        let (readiness, liveness) = match probes {
            (Ok(r), Ok(l)) => (r, l),
            (Err(e), _) | (_, Err(e)) => {
                note(&format!("probe not run: {e}"));
                (None, None)
            }
        };
        let exec_spec = spec.clone();
        let probe_exec = |p: &Probe| -> Probe {
            let mut p = p.clone();
            if let ProbeAction::Exec { command } = &p.action {
                p.action = ProbeAction::Exec {
                    command: self.exec_argv(which, command),
                };
            }
            p
        };
        let readiness = readiness.as_ref().map(probe_exec);
        let liveness = liveness.as_ref().map(probe_exec);
        if readiness.is_none() && matches!(which, Which::Main(_)) {
            self.set(which, |c| c.ready = true);
        }
        let far = began + Duration::from_secs(365 * 86_400);
        let mut next_ready = readiness.as_ref().map_or(far, |p| began + p.initial_delay);
        let mut next_live = liveness.as_ref().map_or(far, |p| began + p.initial_delay);
        let (mut ready_ok, mut ready_fail, mut live_fail) = (0u32, 0u32, 0u32);
        let pod_grace = grace(&self.pod);
        let mut stop_wait = stop.clone();
        while exited.is_none() {
            tokio::select! {
                status = child.wait() => exited = Some(status),
                // The guard wait_for returns is dropped inside: it is not Send.
                _ = async { drop(stop_wait.wait_for(Option::is_some).await) } => {
                    let deadline = stop.borrow().unwrap_or_else(Instant::now);
                    exited = Some(self.terminate(which, &spec, &mut child, &group, deadline).await);
                    stopped = true;
                }
                _ = tokio::time::sleep_until(next_ready) => {
                    if let Some(p) = &readiness {
                        next_ready += p.period;
                        match p.run(&self.k.node, self.ip, &exec_spec).await {
                            Ok(()) => { ready_ok += 1; ready_fail = 0; }
                            Err(e) => {
                                ready_ok = 0;
                                ready_fail += 1;
                                note(&format!("Readiness probe failed: {e}"));
                            }
                        }
                        if ready_ok >= p.success_threshold {
                            self.set(which, |c| c.ready = true);
                        } else if ready_fail >= p.failure_threshold {
                            self.set(which, |c| c.ready = false);
                        }
                    }
                }
                _ = tokio::time::sleep_until(next_live) => {
                    if let Some(p) = &liveness {
                        next_live += p.period;
                        match p.run(&self.k.node, self.ip, &exec_spec).await {
                            Ok(()) => live_fail = 0,
                            Err(e) => {
                                live_fail += 1;
                                note(&format!("Liveness probe failed: {e}"));
                            }
                        }
                        if live_fail >= p.failure_threshold {
                            note("Container failed liveness probe, will be restarted");
                            self.set(which, |c| c.ready = false);
                            let deadline = Instant::now() + pod_grace;
                            exited = Some(self.terminate(which, &spec, &mut child, &group, deadline).await);
                        }
                    }
                }
            }
        }
        self.forget(&group);
        let status = exited.and_then(Result::ok);
        let (exit_code, signal) = match &status {
            Some(s) => match (s.code(), s.signal()) {
                (Some(code), _) => (code, None),
                (None, Some(sig)) => (128 + sig, Some(sig)),
                (None, None) => (-1, None),
            },
            None => (-1, None),
        };
        let success = exit_code == 0;
        let oom_killed = cgroup.as_ref().is_some_and(|c| c.oom_kills() > 0);
        // Its removal waits for the group's last process to be reaped.
        if let Some(cgroup) = cgroup {
            tokio::task::spawn_blocking(move || drop(cgroup));
        }
        let reason = match (success, oom_killed) {
            (true, _) => "Completed",
            (false, true) => "OOMKilled",
            (false, false) => "Error",
        };
        self.set(which, |c| {
            c.ready = false;
            c.state = State::Terminated {
                exit_code,
                signal,
                reason: reason.to_string(),
                started_at,
                finished_at: now_rfc3339(),
            };
        });
        if stopped {
            Outcome::Stopped
        } else {
            Outcome::Exited {
                success,
                ran_for: began.elapsed(),
            }
        }
    }

    fn status_json(&self) -> Value {
        let host_ip = self.k.node.ip().to_string();
        pod_status(
            &lock(&self.state),
            &self.restart_policy,
            &host_ip,
            self.start_time.as_deref(),
        )
    }

    /// Writes the status (through the status subresource, at the stored
    /// resourceVersion: a conflict is retried at the next tick) when the stored one
    /// differs, so a status lost to a client's replace of the pod is written again. A
    /// condition keeps its stored `lastTransitionTime` while its status stays the same.
    async fn write_status(&self) {
        let mut status = self.status_json();
        let Some(mut stored) = self.k.api.get("pods", &self.namespace, &self.name) else {
            return;
        };
        if uid_of(&stored) != self.uid {
            return;
        }
        let before = stored
            .pointer("/status/conditions")
            .and_then(Value::as_array);
        if let Some(conds) = status.get_mut("conditions").and_then(Value::as_array_mut) {
            for c in conds {
                let same = before
                    .into_iter()
                    .flatten()
                    .find(|b| b.get("type") == c.get("type") && b.get("status") == c.get("status"));
                if let Some(t) = same.and_then(|b| b.get("lastTransitionTime")) {
                    c["lastTransitionTime"] = t.clone();
                }
            }
        }
        if stored.get("status") == Some(&status) {
            return;
        }
        stored["status"] = status;
        if let Err(e) = self.k.api.update_status(stored).await {
            // Written again at the next tick (STATUS_INTERVAL).
            tracing::debug!(pod = %self.name, error = ?e, "testkit kubelet: status not written");
        }
    }
}
