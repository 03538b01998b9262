//! A memory cgroup a process runs in, with a limit, removed when dropped:
//! how a container's memory limit looks to the process, and what the
//! kernel does past it (an OOM kill, counted). The tests put a controller
//! in one; the box's kubelet puts each container with a memory limit in one.

use std::path::{Path, PathBuf};

/// A child of this process's memory cgroup (v1's memory controller, or v2
/// with memory delegated). Needs root, as CI has.
pub struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    /// Creates one limited to `limit` bytes; says why when this machine
    /// cannot (not root, no memory controller).
    pub fn create(limit: u64) -> Result<MemoryCgroup, String> {
        let cgroups = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
        let name = format!("ballast-test-{}-{}", std::process::id(), unique());
        let v1 = cgroups.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/')))
        });
        let (parent, v2) = match v1 {
            Some(dir) => (dir, false),
            None => {
                let path = cgroups
                    .lines()
                    .find_map(|l| l.strip_prefix("0::"))
                    .ok_or("neither a cgroup v1 memory controller nor a cgroup v2 hierarchy")?;
                (
                    Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')),
                    true,
                )
            }
        };
        sweep_once(&parent);
        let dir = parent.join(name);
        std::fs::create_dir(&dir).map_err(|e| {
            format!(
                "cannot create the memory cgroup {} ({e}): needs root and a memory cgroup \
                 controller",
                dir.display()
            )
        })?;
        let cgroup = MemoryCgroup { dir, v2 };
        let file = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(cgroup.dir.join(file), limit.to_string())
            .map_err(|e| format!("cannot set the cgroup's {file}: {e}"))?;
        if !v2 {
            // No swap to spill into, where the host allows setting it.
            let _ = std::fs::write(
                cgroup.dir.join("memory.memsw.limit_in_bytes"),
                limit.to_string(),
            );
        }
        Ok(cgroup)
    }

    /// The file a process's id is written to, to move it in.
    pub fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Its directory's name (the last part of its path in `/proc/PID/cgroup`).
    pub fn name(&self) -> String {
        self.dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Whether it is in a cgroup v2 hierarchy (v1's memory controller if not).
    pub fn is_v2(&self) -> bool {
        self.v2
    }

    /// Processes the kernel killed in it for memory.
    pub fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        self.read(file)
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The most memory charged to it at once (bytes).
    pub fn peak(&self) -> u64 {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        self.read(file).trim().parse().unwrap_or(0)
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_else(|e| panic!("read {}: {e}", self.dir.join(file).display()))
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // The processes in it have been killed (kill_on_drop) by now, or
        // are being reaped: a few tries.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("could not remove the memory cgroup {}", self.dir.display());
    }
}

/// [`sweep`] of this process's memory cgroup, once per process.
fn sweep_once(parent: &Path) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| sweep(parent));
}

/// Removes the cgroups named `ballast-test-PID-N` under `parent` that a test
/// process left when it died without dropping them (SIGKILLed, or stopped by a
/// timeout): what still runs in one is killed first, since the kernel removes
/// only an empty cgroup. A cgroup of a running test is left alone.
fn sweep(parent: &Path) {
    for name in crate::cluster::left_by_dead_tests(parent)
        .into_iter()
        .filter(|n| n.starts_with("ballast-test-"))
    {
        let dir = parent.join(&name);
        crate::cluster::kill_listed(
            &std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default(),
        );
        // The killed are reaped by their parents (or init) shortly.
        for _ in 0..20 {
            if std::fs::remove_dir(&dir).is_ok() {
                eprintln!(
                    "removed the memory cgroup {} a dead test left",
                    dir.display()
                );
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The id of a process that has ended and been reaped.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        child.wait().expect("wait for true");
        pid
    }

    #[test]
    fn a_dead_tests_cgroup_is_removed_and_a_live_ones_kept() {
        let parent = tempfile::tempdir().expect("temp dir");
        let dead = parent.path().join(format!("ballast-test-{}-0", dead_pid()));
        let live = parent
            .path()
            .join(format!("ballast-test-{}-7", std::process::id()));
        let other = parent.path().join("ballast-test-notapid-0");
        let foreign = parent.path().join(format!("someone-{}-0", dead_pid()));
        for d in [&dead, &live, &other, &foreign] {
            std::fs::create_dir(d).expect("mkdir");
        }
        sweep(parent.path());
        assert!(!dead.exists(), "a dead test's cgroup is removed");
        assert!(live.exists(), "this process's own cgroup is kept");
        assert!(other.exists(), "a name without a pid is not ours to remove");
        assert!(foreign.exists(), "another prefix is not ours to remove");
    }
}
