//! Named network namespaces (`ip netns`), commands run in them, and sockets made in
//! them from a thread that joined the namespace.

use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;

use nix::sched::{setns, CloneFlags};
use tokio::net::{TcpSocket, TcpStream};

/// A name no other namespace of this process (nor of another test process) has:
/// `PREFIX-PID-N`. `ip netns` names are global to the machine.
pub(crate) fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}

/// The prefixes of what test processes make, named `PREFIX-PID-N`: the box's node
/// and pod namespaces and kubelet directories, and the single-purpose namespaces and
/// memory cgroups of other tests (`ballast-test-`).
const OWNED_PREFIXES: [&str; 4] = [
    "ballast-node-",
    "ballast-pod-",
    "ballast-kubelet-",
    "ballast-test-",
];

/// Whether `name` is `PREFIX-PID-N` (a prefix of [`OWNED_PREFIXES`]) of a process
/// that is no longer running: left by a test that died without cleaning up.
pub(crate) fn left_by_dead_test(name: &str) -> bool {
    let Some(rest) = OWNED_PREFIXES.iter().find_map(|p| name.strip_prefix(p)) else {
        return false;
    };
    let Some((pid, n)) = rest.split_once('-') else {
        return false;
    };
    pid.parse::<u32>().is_ok()
        && n.parse::<u64>().is_ok()
        && !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The names in `dir` that [`left_by_dead_test`] says a dead test left.
pub(crate) fn left_by_dead_tests(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| left_by_dead_test(n))
        .collect()
}

/// SIGKILLs every process id in `pids`, one a line (what `ip netns pids` and a
/// cgroup's `cgroup.procs` list); lines that are not ids are skipped.
pub(crate) fn kill_listed(pids: &str) {
    for pid in pids.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Removes what test processes that died without cleaning up (SIGKILLed, or stopped
/// by a timeout) left: network namespaces named `ballast-node-PID-N`,
/// `ballast-pod-PID-N` or `ballast-test-PID-N` whose PID is no longer running (their
/// processes are killed first), their `/etc/netns` directories, and kubelet
/// directories `ballast-kubelet-PID-N` in the temp dir. Once per process.
pub fn sweep_stale() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for name in left_by_dead_tests(std::path::Path::new("/var/run/netns")) {
            if let Ok(pids) = run("ip", &["netns", "pids", &name], None) {
                kill_listed(&pids);
            }
            let _ = run("ip", &["netns", "del", &name], None);
            tracing::info!(netns = %name, "testkit: removed a network namespace a dead test left");
        }
        for name in left_by_dead_tests(std::path::Path::new("/etc/netns")) {
            let _ = std::fs::remove_dir_all(std::path::Path::new("/etc/netns").join(name));
        }
        let tmp = std::env::temp_dir();
        for name in left_by_dead_tests(&tmp) {
            let _ = std::fs::remove_dir_all(tmp.join(name));
        }
    });
}

/// Runs a program to completion; its stdout, or an error naming the command and
/// carrying its stderr.
pub(crate) fn run(program: &str, args: &[&str], stdin: Option<&str>) -> io::Result<String> {
    use std::io::Write;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot run {program}: {e} (is it installed?)"),
        )
    })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // Written whole before waiting: the inputs here are a few kilobytes.
        pipe.write_all(text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(io::Error::other(format!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// A network namespace made with `ip netns add`, deleted on drop.
#[derive(Debug)]
pub(crate) struct NetNs {
    name: String,
}

impl NetNs {
    /// Creates the namespace with its loopback up.
    pub fn create(name: String) -> io::Result<NetNs> {
        run("ip", &["netns", "add", &name], None)?;
        // Owned from here: an error below deletes it.
        let ns = NetNs { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n NAME ARGS...`
    pub fn ip(&self, args: &[&str]) -> io::Result<String> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run("ip", &all, None)
    }

    /// `ip netns exec NAME PROGRAM ARGS...`
    pub fn exec(&self, program: &str, args: &[&str], stdin: Option<&str>) -> io::Result<String> {
        let mut all = vec!["netns", "exec", self.name.as_str(), program];
        all.extend_from_slice(args);
        run("ip", &all, stdin)
    }

    /// Sets sysctls (`key=value`) inside the namespace only.
    pub fn sysctl(&self, settings: &[&str]) -> io::Result<()> {
        let mut args = vec!["-qw"];
        args.extend_from_slice(settings);
        self.exec("sysctl", &args, None).map(|_| ())
    }

    /// A thread living in this namespace that makes sockets for the caller.
    pub fn socket_maker(&self) -> io::Result<SocketMaker> {
        SocketMaker::start(&self.name)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if let Err(e) = run("ip", &["netns", "del", &self.name], None) {
            tracing::warn!(netns = %self.name, error = %e, "testkit: cannot delete network namespace");
        }
    }
}

enum SocketRequest {
    Listen(SocketAddr, mpsc::Sender<io::Result<std::net::TcpListener>>),
    Socket(tokio::sync::oneshot::Sender<io::Result<TcpSocket>>),
}

/// A thread that joined a network namespace once (`setns` changes only the calling
/// thread's namespace) and makes sockets there: a socket keeps the namespace it was
/// made in, so the caller can then use it from any thread, under tokio.
/// The thread ends when this is dropped.
pub(crate) struct SocketMaker {
    requests: mpsc::Sender<SocketRequest>,
}

impl SocketMaker {
    fn start(netns: &str) -> io::Result<SocketMaker> {
        let file = File::open(format!("/var/run/netns/{netns}"))?;
        let (requests, incoming) = mpsc::channel::<SocketRequest>();
        let (ready_tx, ready_rx) = mpsc::channel::<io::Result<()>>();
        thread::Builder::new()
            .name(format!("netns-{netns}"))
            .spawn(move || {
                if let Err(e) = setns(&file, CloneFlags::CLONE_NEWNET) {
                    let _ = ready_tx.send(Err(io::Error::other(format!(
                        "setns into the network namespace failed: {e}"
                    ))));
                    return;
                }
                drop(file);
                let _ = ready_tx.send(Ok(()));
                while let Ok(request) = incoming.recv() {
                    match request {
                        SocketRequest::Listen(addr, reply) => {
                            let made = std::net::TcpListener::bind(addr).and_then(|l| {
                                l.set_nonblocking(true)?;
                                Ok(l)
                            });
                            let _ = reply.send(made);
                        }
                        SocketRequest::Socket(reply) => {
                            let _ = reply.send(TcpSocket::new_v4());
                        }
                    }
                }
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(SocketMaker { requests }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::other("the namespace thread ended at once")),
        }
    }

    /// A listening socket bound inside the namespace (register it with tokio with
    /// `tokio::net::TcpListener::from_std`).
    pub fn listen(&self, addr: SocketAddr) -> io::Result<std::net::TcpListener> {
        let (tx, rx) = mpsc::channel();
        self.requests
            .send(SocketRequest::Listen(addr, tx))
            .map_err(|_| io::Error::other("the namespace thread is gone"))?;
        rx.recv()
            .map_err(|_| io::Error::other("the namespace thread is gone"))?
    }

    /// Connects from inside the namespace.
    pub async fn connect(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.requests
            .send(SocketRequest::Socket(tx))
            .map_err(|_| io::Error::other("the namespace thread is gone"))?;
        let socket = rx
            .await
            .map_err(|_| io::Error::other("the namespace thread is gone"))??;
        socket.connect(addr).await
    }
}
