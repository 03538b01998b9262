//! What rustls itself holds per mesh connection once it is idle (not a test).
//!
//! N pairs of rustls connections built from the proxy's own configs
//! (`ballast_meshtls::tls::{server_config, client_config}`: TLS 1.3, mutual,
//! ECDSA P-256, no resumption), each through a full handshake and one
//! exchange (200 bytes up, 1,200 down) in memory, then held. It reports the
//! heap jemalloc holds per connection for each side, and the connection's
//! own size (which a proxy's connection future holds inline).
//!
//! This is the floor under `mtls-bench`'s memory per idle mTLS connection:
//! no socket, no HTTP, no proxy state, only what rustls keeps between
//! records. The buffered API keeps a 4 KiB receive buffer once anything was
//! read (rustls' `READ_SIZE`); the rest is keys, key schedule, the peer's
//! certificate and the connection's state.
//!
//! It fails when the handshakes do not complete or jemalloc's statistics do
//! not grow with the connections.
//!
//! Usage: tls-floor [N (1000)]

use ballast_meshtls::{tls, IdentityName};
use rustls::{pki_types::PrivatePkcs8KeyDer, ClientConnection, ServerConnection};
use std::{
    io::{Read, Write},
    time::{Duration, SystemTime},
};
use tikv_jemalloc_ctl::thread;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const USAGE: &str = "Usage: tls-floor [N (1000)]";

/// Bytes this thread holds on the heap (jemalloc's per-thread counters,
/// in size classes: what the allocations really take, and exact, where the
/// global statistics lag behind the thread's cache).
fn allocated() -> usize {
    let held = || -> Option<u64> {
        let a = thread::allocatedp::read().ok()?.get();
        let d = thread::deallocatedp::read().ok()?.get();
        Some(a.saturating_sub(d))
    };
    held().unwrap_or(0) as usize
}

/// A leaf for `name` signed by the CA, as the identity controller issues.
fn credentials(
    name: &str,
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
) -> anyhow::Result<tls::Credentials> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let cert = rcgen::CertificateParams::new(vec![name.to_string()])?.signed_by(&key, issuer)?;
    Ok(tls::Credentials::new(
        IdentityName::parse(name)?,
        vec![cert.der().clone()],
        PrivatePkcs8KeyDer::from(key.serialize_der()),
        SystemTime::now() + Duration::from_secs(86_400),
    )?)
}

/// Moves every pending record from one side to the other.
fn pump(
    from: &mut impl std::ops::DerefMut<Target = rustls::ConnectionCommon<impl Sized>>,
    to: &mut impl std::ops::DerefMut<Target = rustls::ConnectionCommon<impl Sized>>,
) -> anyhow::Result<()> {
    let mut wire = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut wire)?;
    }
    let mut rest = &wire[..];
    while !rest.is_empty() {
        to.read_tls(&mut rest)?;
        to.process_new_packets()?;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let n: usize = match std::env::args().nth(1) {
        None => 1_000,
        Some(a) if a == "--help" || a == "-h" => {
            println!("{USAGE}");
            return Ok(());
        }
        Some(a) => a
            .parse()
            .map_err(|e| anyhow::anyhow!("N {a:?}: {e}\n{USAGE}"))?,
    };
    anyhow::ensure!(n >= 1, "nothing to measure: N must be at least 1");

    let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let roots = tls::root_store(&[ca.der().clone()])?;
    let server_name = "b.bench.serviceaccount.identity.linkerd.cluster.local";
    let server_certs = tls::CertStore::new();
    server_certs.set(credentials(server_name, &issuer)?);
    let client_certs = tls::CertStore::new();
    client_certs.set(credentials(
        "a.bench.serviceaccount.identity.linkerd.cluster.local",
        &issuer,
    )?);
    let server_config = tls::server_config(roots.clone(), server_certs, &[])?;
    let client_config = tls::client_config(roots, Some(client_certs), &[])?;
    let dialled = tls::server_name(&IdentityName::parse(server_name)?);

    let pair = || -> anyhow::Result<(ServerConnection, ClientConnection)> {
        let mut client = ClientConnection::new(client_config.clone(), dialled.clone())?;
        let mut server = ServerConnection::new(server_config.clone())?;
        for _ in 0..4 {
            pump(&mut client, &mut server)?;
            pump(&mut server, &mut client)?;
        }
        anyhow::ensure!(
            !server.is_handshaking() && !client.is_handshaking(),
            "the handshake did not complete"
        );
        client.writer().write_all(&[b'q'; 200])?;
        pump(&mut client, &mut server)?;
        let mut request = [0u8; 200];
        server.reader().read_exact(&mut request)?;
        server.writer().write_all(&[b'r'; 1_200])?;
        pump(&mut server, &mut client)?;
        let mut response = [0u8; 1_200];
        client.reader().read_exact(&mut response)?;
        Ok((server, client))
    };
    // One pair first: what rustls and ring set up once is not a connection's.
    drop(pair()?);
    let mut servers = Vec::with_capacity(n);
    let mut clients = Vec::with_capacity(n);
    let base = allocated();
    for _ in 0..n {
        let (server, client) = pair()?;
        servers.push(server);
        clients.push(client);
    }
    let both = allocated();
    drop(clients);
    let servers_only = allocated();
    anyhow::ensure!(
        both > servers_only && servers_only > base,
        "jemalloc's thread counters did not grow with the connections \
         (base {base}, both sides {both}, servers {servers_only} bytes)"
    );
    let server_heap = (servers_only - base) as f64 / n as f64;
    let client_heap = (both - servers_only) as f64 / n as f64;
    println!("{n} mutual TLS 1.3 connections, handshaken and one exchange each, held idle");
    println!("| side | heap per connection (jemalloc size classes) | inline (size_of) |");
    println!("|---|---|---|");
    println!(
        "| server (proxy B's inbound) | {server_heap:.0} B | {} B |",
        std::mem::size_of::<ServerConnection>()
    );
    println!(
        "| client (proxy A's outbound) | {client_heap:.0} B | {} B |",
        std::mem::size_of::<ClientConnection>()
    );
    println!(
        "of the server's heap, the buffered API's receive buffer: 4096 B \
         (kept once anything was read); the rest is state rustls needs while idle"
    );
    drop(servers);
    Ok(())
}
