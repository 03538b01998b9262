//! Readiness and liveness probes, as the kubelet runs them: from the node (here, its
//! network namespace) to the pod IP for `httpGet` and `tcpSocket`, and in the
//! container for `exec`.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::node::Node;
use super::process::ProcessSpec;

#[derive(Debug, Clone)]
pub(crate) enum ProbeAction {
    /// `scheme: HTTPS` is probed as a TCP connect (no TLS client here).
    Http {
        port: u16,
        path: String,
        https: bool,
    },
    Tcp {
        port: u16,
    },
    Exec {
        command: Vec<String>,
    },
}

/// One probe of a container's spec, with Kubernetes' defaults.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    pub action: ProbeAction,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub failure_threshold: u32,
    pub success_threshold: u32,
}

/// A port by number or by the name of one of the container's ports.
pub(crate) fn port(v: Option<&Value>, container: &Value) -> Option<u16> {
    match v? {
        Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        Value::String(name) => name.parse().ok().or_else(|| {
            container
                .get("ports")?
                .as_array()?
                .iter()
                .find(|p| p.get("name").and_then(Value::as_str) == Some(name))?
                .get("containerPort")?
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
        }),
        _ => None,
    }
}

impl Probe {
    /// The probe at `container[field]` (`readinessProbe`, `livenessProbe`); `Err` when
    /// it is there but cannot be run (e.g. a port name the container does not have).
    pub fn parse(container: &Value, field: &str) -> Result<Option<Probe>, String> {
        let Some(p) = container.get(field) else {
            return Ok(None);
        };
        let secs = |k: &str, default: u64| {
            Duration::from_secs(p.get(k).and_then(Value::as_u64).unwrap_or(default))
        };
        let count = |k: &str, default: u32| {
            p.get(k)
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(default)
                .max(1)
        };
        let action = if let Some(h) = p.get("httpGet") {
            ProbeAction::Http {
                port: port(h.get("port"), container)
                    .ok_or_else(|| format!("{field}: httpGet port not found"))?,
                path: h
                    .get("path")
                    .and_then(Value::as_str)
                    .unwrap_or("/")
                    .to_string(),
                https: h.get("scheme").and_then(Value::as_str) == Some("HTTPS"),
            }
        } else if let Some(t) = p.get("tcpSocket") {
            ProbeAction::Tcp {
                port: port(t.get("port"), container)
                    .ok_or_else(|| format!("{field}: tcpSocket port not found"))?,
            }
        } else if let Some(c) = p.pointer("/exec/command").and_then(Value::as_array) {
            ProbeAction::Exec {
                command: c
                    .iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect(),
            }
        } else {
            return Err(format!("{field}: no httpGet, tcpSocket or exec"));
        };
        Ok(Some(Probe {
            action,
            initial_delay: secs("initialDelaySeconds", 0),
            period: secs("periodSeconds", 10).max(Duration::from_secs(1)),
            timeout: secs("timeoutSeconds", 1).max(Duration::from_secs(1)),
            failure_threshold: count("failureThreshold", 3),
            success_threshold: count("successThreshold", 1),
        }))
    }

    /// One try: true on success. `exec` runs `argv` resolved by the caller.
    pub async fn run(
        &self,
        node: &Node,
        pod_ip: Ipv4Addr,
        exec: &ProcessSpec,
    ) -> Result<(), String> {
        let attempt = async {
            match &self.action {
                ProbeAction::Tcp { port }
                | ProbeAction::Http {
                    port, https: true, ..
                } => node
                    .dial(SocketAddr::from((pod_ip, *port)))
                    .await
                    .map(drop)
                    .map_err(|e| format!("dial {pod_ip}:{port}: {e}")),
                ProbeAction::Http { port, path, .. } => http_get(node, pod_ip, *port, path).await,
                ProbeAction::Exec { command } => {
                    let (mut child, group) = exec
                        .spawn(command)
                        .map_err(|e| format!("exec {command:?}: {e}"))?;
                    let status = child.wait().await.map_err(|e| e.to_string())?;
                    group.finish();
                    if status.success() {
                        Ok(())
                    } else {
                        Err(format!("exec {command:?}: {status}"))
                    }
                }
            }
        };
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(result) => result,
            Err(_) => Err(format!("timed out after {:?}", self.timeout)),
        }
    }
}

/// `GET path` on a fresh connection; 200 to 399 is success, as for the kubelet.
pub(crate) async fn http_get(
    node: &Node,
    ip: Ipv4Addr,
    port: u16,
    path: &str,
) -> Result<(), String> {
    let mut conn = node
        .dial(SocketAddr::from((ip, port)))
        .await
        .map_err(|e| format!("dial {ip}:{port}: {e}"))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {ip}:{port}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    conn.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut head = Vec::with_capacity(64);
    let mut buf = [0u8; 256];
    // Only the status line matters; read until it is complete (bounded).
    while !head.contains(&b'\n') && head.len() < 4096 {
        let n = conn
            .read(&mut buf)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let code = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| {
            format!(
                "no HTTP status line: {:?}",
                line.lines().next().unwrap_or("")
            )
        })?;
    if (200..400).contains(&code) {
        Ok(())
    } else {
        Err(format!("HTTP probe failed with statuscode: {code}"))
    }
}
