//! A container's process: `ip netns exec POD_NETNS unshare --uts /bin/sh -c SCRIPT`,
//! where the script sets the pod's hostname, bind-mounts the volumes (in the private mount namespace `ip netns exec`
//! makes for what it runs) and `exec`s the container's argv as its user
//! (`setpriv`). Each process leads its own process group, owned by a
//! [`ProcessGroup`] that kills the whole group on drop.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};

use super::volumes::Mount;
use crate::api_server::lock;

/// What a container's log keeps: the last 1 MiB (older bytes are dropped).
pub const LOG_LIMIT: usize = 1 << 20;

/// Everything needed to start one of a container's processes (its main process, a
/// hook or an exec probe).
#[derive(Debug, Clone)]
pub(crate) struct ProcessSpec {
    pub netns: String,
    /// The pod's hostname, set in a UTS namespace of the process's own.
    pub hostname: String,
    pub mounts: Vec<Mount>,
    /// `(uid, gid)` from `securityContext.runAsUser`/`runAsGroup`.
    pub user: Option<(u32, u32)>,
    pub working_dir: Option<String>,
    pub env: Vec<(String, String)>,
    /// The container's memory cgroup: the process is moved into it as it
    /// starts, and runs nothing before it is in.
    pub cgroup: Option<Joined>,
}

/// A memory cgroup a container's processes join.
#[derive(Debug, Clone)]
pub(crate) struct Joined {
    /// Its `cgroup.procs`, written from the host (`ip netns exec` mounts a
    /// sysfs of its own, without the host's cgroups).
    pub procs: PathBuf,
    /// Its directory's name, looked for in `/proc/$$/cgroup`.
    pub name: String,
    pub v2: bool,
}

/// Tries at 10 ms for the script to see itself in its cgroup (5 s).
const JOIN_TRIES: u32 = 500;

/// Single-quoted for `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

impl ProcessSpec {
    fn script(&self, argv: &[String]) -> String {
        let mut script = String::from("set -e\n");
        if let Some(cg) = &self.cgroup {
            // The container sees the cgroups mounted where a runtime mounts
            // them, its own limit included, as a process in it reads them.
            let mount = if cg.v2 {
                "mount -t cgroup2 cgroup2 /sys/fs/cgroup\n"
            } else {
                "mount -t tmpfs -o size=64k cgroup /sys/fs/cgroup\n\
                 mkdir /sys/fs/cgroup/memory\n\
                 mount -t cgroup -o memory memory /sys/fs/cgroup/memory\n"
            };
            script.push_str(&format!(
                "i=0; until grep -q {name} /proc/$$/cgroup; do i=$((i+1)); \
                 if [ $i -ge {JOIN_TRIES} ]; then echo 'not moved into its memory cgroup' >&2; \
                 exit 1; fi; sleep 0.01; done\n{mount}",
                name = quote(&format!("/{}$", cg.name)),
            ));
        }
        script.push_str(&format!(
            "echo {} > /proc/sys/kernel/hostname\n",
            quote(&self.hostname)
        ));
        // Parents before children, and each mount point made where it is
        // missing: a volume at /run (the init container's) hides the host's
        // /run/secrets/..., and a container runtime makes the nested mount
        // point inside it, in the volume, never on the host.
        let mut mounts: Vec<&Mount> = self.mounts.iter().collect();
        mounts.sort_by_key(|m| m.target.split('/').filter(|c| !c.is_empty()).count());
        for m in mounts {
            let (src, dst) = (quote(&m.source.to_string_lossy()), quote(&m.target));
            script.push_str(&format!(
                "if [ ! -e {dst} ]; then if [ -d {src} ]; then mkdir -p {dst}; \
                 else mkdir -p \"$(dirname {dst})\" && : > {dst}; fi; fi\n"
            ));
            script.push_str(&format!("mount --bind {src} {dst}\n"));
            if m.read_only {
                script.push_str(&format!("mount -o remount,bind,ro {dst}\n"));
            }
        }
        if let Some(dir) = &self.working_dir {
            script.push_str(&format!("cd {}\n", quote(dir)));
        }
        script.push_str("exec ");
        if let Some((uid, gid)) = self.user {
            script.push_str(&format!(
                "setpriv --reuid={uid} --regid={gid} --clear-groups -- "
            ));
        }
        let words: Vec<String> = argv.iter().map(|a| quote(a)).collect();
        script.push_str(&words.join(" "));
        script.push('\n');
        script
    }

    /// Starts `argv` in the pod; its stdout and stderr are piped.
    pub fn spawn(&self, argv: &[String]) -> io::Result<(Child, Arc<ProcessGroup>)> {
        if argv.is_empty() {
            return Err(io::Error::other("nothing to run"));
        }
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &self.netns,
            "unshare",
            "--uts",
            "/bin/sh",
            "-c",
        ])
        .arg(self.script(argv))
        .env_clear()
        .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
        let child = cmd.spawn()?;
        let pgid = child
            .id()
            .ok_or_else(|| io::Error::other("the process ended before it had an id"))?;
        // `ip netns exec`, `unshare` and the script exec in turn: one pid,
        // which waits in the script until it is in.
        if let Some(cg) = &self.cgroup {
            std::fs::write(&cg.procs, pgid.to_string()).map_err(|e| {
                io::Error::other(format!("cannot join {}: {e}", cg.procs.display()))
            })?;
        }
        let group = Arc::new(ProcessGroup {
            pgid: pgid as i32,
            gone: AtomicBool::new(false),
        });
        Ok((child, group))
    }
}

/// A process group the kubelet started; SIGKILLed on drop unless already reaped.
#[derive(Debug)]
pub(crate) struct ProcessGroup {
    pgid: i32,
    gone: AtomicBool,
}

impl ProcessGroup {
    pub fn signal(&self, signal: Signal) {
        if !self.gone.load(Ordering::SeqCst) {
            let _ = killpg(Pid::from_raw(self.pgid), signal);
        }
    }

    /// The leader was reaped: kills what it left in its group (a container's
    /// processes end with it), then never signals this id again (it may be reused).
    pub fn finish(&self) {
        self.signal(Signal::SIGKILL);
        self.gone.store(true, Ordering::SeqCst);
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.signal(Signal::SIGKILL);
    }
}

/// A container's output across its restarts: the last [`LOG_LIMIT`] bytes in memory
/// and in a file (rewritten from memory when it passes twice the limit).
pub(crate) struct ContainerLog {
    tail: Mutex<VecDeque<u8>>,
    file: PathBuf,
    file_len: Mutex<usize>,
}

impl ContainerLog {
    pub fn new(file: PathBuf) -> ContainerLog {
        ContainerLog {
            tail: Mutex::new(VecDeque::new()),
            file,
            file_len: Mutex::new(0),
        }
    }

    pub fn text(&self) -> String {
        let tail = lock(&self.tail);
        let (a, b) = tail.as_slices();
        let mut bytes = a.to_vec();
        bytes.extend_from_slice(b);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub fn append(&self, bytes: &[u8]) {
        let mut tail = lock(&self.tail);
        tail.extend(bytes);
        let excess = tail.len().saturating_sub(LOG_LIMIT);
        tail.drain(..excess);
        let mut len = lock(&self.file_len);
        *len += bytes.len();
        let written = if *len > 2 * LOG_LIMIT {
            *len = tail.len();
            let (a, b) = tail.as_slices();
            std::fs::File::create(&self.file).and_then(|mut f| {
                f.write_all(a)?;
                f.write_all(b)
            })
        } else {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.file)
                .and_then(|mut f| f.write_all(bytes))
        };
        if let Err(e) = written {
            tracing::debug!(file = %self.file.display(), error = %e, "testkit: cannot write a container log");
        }
    }

    /// A line from the kubelet itself (hook and probe failures), as `kubectl
    /// describe` shows events.
    pub fn note(&self, line: &str) {
        self.append(format!("[kubelet] {line}\n").as_bytes());
    }

    /// Copies a pipe into the log until it ends.
    pub async fn pump(self: Arc<Self>, mut pipe: impl AsyncRead + Unpin) {
        let mut buf = vec![0u8; 8192];
        loop {
            match pipe.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => self.append(&buf[..n]),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_joins_the_cgroup_mounts_then_becomes_the_user_and_quotes_every_word() {
        let spec = ProcessSpec {
            netns: "ns".into(),
            hostname: "web-0".into(),
            mounts: vec![Mount {
                source: "/tmp/v/config".into(),
                target: "/etc/app".into(),
                read_only: true,
            }],
            user: Some((2102, 2102)),
            working_dir: None,
            env: Vec::new(),
            cgroup: Some(Joined {
                procs: "/sys/fs/cgroup/memory/c-1/cgroup.procs".into(),
                name: "c-1".into(),
                v2: false,
            }),
        };
        let script = spec.script(&["/bin/echo".into(), "it's".into()]);
        assert_eq!(
            script,
            "set -e\ni=0; until grep -q '/c-1$' /proc/$$/cgroup; do i=$((i+1)); \
             if [ $i -ge 500 ]; then echo 'not moved into its memory cgroup' >&2; exit 1; fi; \
             sleep 0.01; done\n\
             mount -t tmpfs -o size=64k cgroup /sys/fs/cgroup\n\
             mkdir /sys/fs/cgroup/memory\n\
             mount -t cgroup -o memory memory /sys/fs/cgroup/memory\n\
             echo 'web-0' > /proc/sys/kernel/hostname\n\
             if [ ! -e '/etc/app' ]; then if [ -d '/tmp/v/config' ]; then mkdir -p '/etc/app'; \
             else mkdir -p \"$(dirname '/etc/app')\" && : > '/etc/app'; fi; fi\n\
             mount --bind '/tmp/v/config' '/etc/app'\n\
             mount -o remount,bind,ro '/etc/app'\n\
             exec setpriv --reuid=2102 --regid=2102 --clear-groups -- '/bin/echo' 'it'\\''s'\n"
        );
    }

    #[test]
    fn the_log_keeps_the_last_bytes() {
        let dir = std::env::temp_dir().join(format!("ballast-log-test-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let log = ContainerLog::new(dir.join("c.log"));
        log.append(&vec![b'a'; LOG_LIMIT]);
        log.append(b"end");
        let text = log.text();
        assert_eq!(text.len(), LOG_LIMIT);
        assert!(text.ends_with("aend"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
