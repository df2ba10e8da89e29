//! Leases for a client that is not HTTP: two raw TCP echo servers on
//! 127.0.0.1 behind one `round_robin` service, reached through leases.
//!
//! Each of 12 calls borrows an endpoint (`Dispatcher::lease`), opens its own
//! TCP connection to `lease.authority()`, sends a line, reads it back, and
//! reports the outcome to the node that lent the endpoint. At most two
//! leases per endpoint are out at once (`max_concurrent: 2`): the others
//! wait in the service's queue, as tasks do. The second echo server stops
//! answering halfway (it closes each connection at once): its failures,
//! reported only through leases, open its breaker, and the last calls all
//! go to the first server.
//!
//! `cargo run --example lease_echo` (exits by itself).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_dispatch::{Config, Dispatcher, ErrorKind, LeaseOptions, LeaseOutcome};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A raw TCP echo server on its own thread: echoes each connection's bytes
/// back until it closes, or closes at once while `broken`.
fn echo_server(broken: Arc<AtomicBool>) -> u16 {
    let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind 127.0.0.1");
    let port = listener.local_addr().expect("local addr").port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            if broken.load(Ordering::Relaxed) {
                continue; // dropped: the client reads nothing
            }
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 || conn.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// One call through a lease: connect, send `line`, read it back.
async fn call(authority: &str, line: &str) -> Result<(), ErrorKind> {
    let connect = actix_rt::net::TcpStream::connect(authority);
    let mut conn = tokio::time::timeout(Duration::from_secs(1), connect)
        .await
        .map_err(|_| ErrorKind::Timeout)?
        .map_err(|_| ErrorKind::Connect)?;
    conn.write_all(line.as_bytes())
        .await
        .map_err(|_| ErrorKind::Reset)?;
    let mut back = vec![0u8; line.len()];
    tokio::time::timeout(Duration::from_secs(1), conn.read_exact(&mut back))
        .await
        .map_err(|_| ErrorKind::Timeout)?
        .map_err(|_| ErrorKind::Reset)?;
    if back == line.as_bytes() {
        Ok(())
    } else {
        Err(ErrorKind::Body)
    }
}

#[actix::main]
async fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let healthy = echo_server(Arc::new(AtomicBool::new(false)));
    let breaks = Arc::new(AtomicBool::new(false));
    let flaky = echo_server(breaks.clone());
    // Leases need no HTTP: the address only names where to connect.
    let config = Config::from_json(&format!(
        r#"{{"services":[{{"name":"echo","mode":"round_robin",
            "breaker":{{"consecutive_failures":2,"open_for":"30s"}},
            "endpoints":[{{"address":"http://127.0.0.1:{healthy}/","max_concurrent":2}},
                         {{"address":"http://127.0.0.1:{flaky}/","max_concurrent":2}}]}}]}}"#
    ))
    .expect("valid config");
    let dispatcher = Dispatcher::start(config).expect("inside a System");

    for round in 0..3 {
        if round == 1 {
            breaks.store(true, Ordering::Relaxed);
            println!("-- the second echo server now drops every connection");
        }
        let calls = (0..4).map(|i| {
            let d = dispatcher.clone();
            async move {
                let lease = match d.lease("echo", LeaseOptions::new()).await {
                    Ok(lease) => lease,
                    Err(why) => return format!("call {round}.{i}: no endpoint: {why}"),
                };
                let authority = lease.authority().to_owned();
                let line = format!("hello {round}.{i}\n");
                match call(&authority, &line).await {
                    Ok(()) => {
                        lease.complete(LeaseOutcome::Success);
                        format!("call {round}.{i}: {authority}: echoed")
                    }
                    Err(kind) => {
                        lease.complete(LeaseOutcome::Failure(kind));
                        format!("call {round}.{i}: {authority}: {kind}")
                    }
                }
            }
        });
        for line in futures::future::join_all(calls).await {
            println!("{line}");
        }
    }

    let report = dispatcher.shutdown(Duration::from_secs(2)).await;
    let svc = report.stats.service("echo").expect("the service");
    println!(
        "leases: {} granted, {} succeeded, {} failed, {} still out",
        svc.leases.granted,
        svc.leases.succeeded,
        svc.leases.failed,
        report.leases_out.len()
    );
    for n in &svc.nodes {
        println!(
            "  {}: {} calls, {} errors, breaker {:?}",
            n.address, n.total, n.errors, n.breaker
        );
    }
}
