//! Applying [`Rules`] to the current network namespace: `iptables-save` to
//! read the nat table, `iptables-restore --noflush` to change it in one
//! transaction. The only part of `ballast init` that does IO.

use crate::rules::{Rules, INBOUND_CHAIN, OUTBOUND_CHAIN};
use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
};

/// CAP_NET_ADMIN's bit in /proc/self/status `CapEff`.
const CAP_NET_ADMIN: u32 = 12;

const NEEDS_PRIVILEGE: &str = "ballast init needs CAP_NET_ADMIN / root to change iptables rules \
     (in Kubernetes: runAsUser 0 with capabilities NET_ADMIN and NET_RAW); --dry-run needs neither";

/// Which iptables programs to run.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum IptablesMode {
    /// iptables-save/-restore on PATH, whatever their backend.
    Plain,
    /// iptables-legacy-save/-restore.
    Legacy,
    /// iptables-nft-save/-restore.
    Nft,
}

impl IptablesMode {
    /// The save and restore programs of this mode.
    pub fn programs(self) -> (&'static str, &'static str) {
        match self {
            IptablesMode::Plain => ("iptables-save", "iptables-restore"),
            IptablesMode::Legacy => ("iptables-legacy-save", "iptables-legacy-restore"),
            IptablesMode::Nft => ("iptables-nft-save", "iptables-nft-restore"),
        }
    }
}

/// Why the rules could not be applied; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The mode's programs are not on PATH.
    #[error(
        "iptables not found on PATH (looked for {save} and {restore}); install \
         iptables (Debian/Ubuntu: apt-get install iptables; Alpine: apk add iptables) \
         or choose another --iptables-mode"
    )]
    NotFound {
        /// The save program looked for.
        save: &'static str,
        /// The restore program looked for.
        restore: &'static str,
    },
    /// This process lacks CAP_NET_ADMIN.
    #[error("{NEEDS_PRIVILEGE}")]
    NoPrivilege,
    /// A program could not be started or fed.
    #[error("cannot run {program}: {source}")]
    Io {
        /// The program.
        program: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A program ran and failed; permission problems get the privilege hint.
    #[error("{program} failed ({status}): {stderr}{hint}")]
    Failed {
        /// The program.
        program: String,
        /// Its exit status.
        status: ExitStatus,
        /// Its stderr, trimmed.
        stderr: String,
        /// Empty, or the privilege hint on its own line.
        hint: String,
    },
}

/// Runs the iptables programs of one mode.
#[derive(Copy, Clone, Debug)]
pub struct Runner {
    /// Which programs.
    pub mode: IptablesMode,
    /// Wait for the xtables lock instead of failing when another process holds it.
    pub wait_for_lock: bool,
}

impl Runner {
    /// Writes what a first run applies (iptables-restore input), changing nothing.
    pub fn dry_run(rules: &Rules, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(
            out,
            "# ballast init --dry-run: the nat rules a first run applies \
             (iptables-restore --noflush input); nothing was changed"
        )?;
        out.write_all(rules.restore_input("").as_bytes())
    }

    /// Brings the nat table to exactly one set of `rules`.
    pub fn apply(&self, rules: &Rules) -> Result<(), RunError> {
        let (save_name, restore_name) = self.mode.programs();
        let (save, restore) = match (on_path(save_name), on_path(restore_name)) {
            (Some(s), Some(r)) => (s, r),
            _ => {
                return Err(RunError::NotFound {
                    save: save_name,
                    restore: restore_name,
                })
            }
        };
        if !has_net_admin() {
            return Err(RunError::NoPrivilege);
        }

        let current = capture(&save, &["-t", "nat"])?;
        let input = rules.restore_input(&current);
        tracing::debug!("iptables-restore input:\n{input}");
        let mut cmd = Command::new(&restore);
        cmd.arg("--noflush");
        if self.wait_for_lock {
            cmd.arg("--wait");
        }
        if let Err(e) = feed(cmd, &input) {
            tracing::error!("the rules that failed to apply:\n{input}");
            return Err(e);
        }

        let after = capture(&save, &["-t", "nat"])?;
        let ours = after
            .lines()
            .filter(|l| l.contains(INBOUND_CHAIN) || l.contains(OUTBOUND_CHAIN))
            .count();
        tracing::info!(
            inbound = rules.incoming_proxy_port,
            outbound = rules.outgoing_proxy_port,
            proxy_uid = rules.proxy_uid,
            "nat rules in place ({ours} lines in {INBOUND_CHAIN}, {OUTBOUND_CHAIN} and their jumps)"
        );
        Ok(())
    }
}

/// `program` as found on PATH.
fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether this process may change the network configuration.
fn has_net_admin() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
            u64::from_str_radix(line.split_whitespace().nth(1)?, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_NET_ADMIN) != 0)
}

/// Explains a failed iptables run; permission problems get the privilege hint.
fn failure(program: &Path, status: ExitStatus, stderr: &[u8]) -> RunError {
    let stderr = String::from_utf8_lossy(stderr).trim().to_string();
    let lower = stderr.to_lowercase();
    let hint = if lower.contains("permission denied") || lower.contains("operation not permitted") {
        format!("\n{NEEDS_PRIVILEGE}")
    } else {
        String::new()
    };
    RunError::Failed {
        program: program.display().to_string(),
        status,
        stderr,
        hint,
    }
}

fn io_error(program: &Path) -> impl FnOnce(std::io::Error) -> RunError + '_ {
    move |source| RunError::Io {
        program: program.display().to_string(),
        source,
    }
}

fn capture(program: &Path, args: &[&str]) -> Result<String, RunError> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(io_error(program))?;
    if !out.status.success() {
        return Err(failure(program, out.status, &out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn feed(mut cmd: Command, input: &str) -> Result<(), RunError> {
    let program = PathBuf::from(cmd.get_program());
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io_error(&program))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(io_error(&program))?;
    }
    let out = child.wait_with_output().map_err(io_error(&program))?;
    if !out.status.success() {
        return Err(failure(&program, out.status, &out.stderr));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_names_its_programs() {
        assert_eq!(
            IptablesMode::Nft.programs(),
            ("iptables-nft-save", "iptables-nft-restore")
        );
        assert_eq!(
            IptablesMode::Legacy.programs(),
            ("iptables-legacy-save", "iptables-legacy-restore")
        );
    }

    #[test]
    fn a_dry_run_prints_the_first_runs_input() {
        let rules = crate::Rules {
            incoming_proxy_port: 4143,
            outgoing_proxy_port: 4140,
            proxy_uid: 2102,
            proxy_gid: None,
            ports_to_redirect: Vec::new(),
            inbound_ports_to_ignore: Vec::new(),
            outbound_ports_to_ignore: Vec::new(),
            subnets_to_ignore: Vec::new(),
            outbound_subnets_to_ignore: Vec::new(),
        };
        let mut out = Vec::new();
        Runner::dry_run(&rules, &mut out).expect("writes to a Vec");
        let out = String::from_utf8(out).expect("utf-8");
        assert!(out.starts_with("# ballast init --dry-run"), "{out}");
        assert!(out.ends_with(&rules.restore_input("")), "{out}");
    }

    #[test]
    fn permission_failures_carry_the_privilege_hint() {
        use std::os::unix::process::ExitStatusExt;
        let status = ExitStatus::from_raw(256);
        let denied = failure(
            Path::new("iptables-restore"),
            status,
            b"Permission denied (you must be root)\n",
        );
        assert!(denied.to_string().contains("CAP_NET_ADMIN"), "{denied}");
        let other = failure(Path::new("iptables-restore"), status, b"line 3 failed\n");
        assert!(!other.to_string().contains("CAP_NET_ADMIN"), "{other}");
    }
}
