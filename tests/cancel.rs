//! A caller that leaves before its answer (issue 23): dropping a
//! `Submission` cancels its attempt at once, for every task (its slot
//! free once the answer's expected time has passed). The backend
//! here is a raw socket server that reads each request and never answers,
//! so only a cancel can end an attempt before its 60 s timeout; it counts
//! the connections it saw closed. A gateway client that disconnects
//! (feature `web`) is cancelled the same way, through actix-web dropping
//! its handler (with `h1_allow_half_closed(false)`, as the README says).

mod support;

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_dispatch::{BreakerStatus, Config, Dispatcher, Task};
use support::wait::{stats_until, until};

/// A backend that reads requests and never answers: `got` counts the
/// requests read, `closed` the connections the engine closed after one.
struct Hold {
    port: u16,
    got: Arc<AtomicU64>,
    closed: Arc<AtomicU64>,
}

impl Hold {
    fn start() -> Hold {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let port = listener.local_addr().expect("addr").port();
        let got = Arc::new(AtomicU64::new(0));
        let closed = Arc::new(AtomicU64::new(0));
        let (g, c) = (got.clone(), closed.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let (g, c) = (g.clone(), c.clone());
                std::thread::spawn(move || hold(conn, &g, &c));
            }
        });
        Hold { port, got, closed }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    fn got(&self) -> u64 {
        self.got.load(Ordering::SeqCst)
    }

    fn closed(&self) -> u64 {
        self.closed.load(Ordering::SeqCst)
    }
}

/// Reads one request head, counts it, then waits for the peer to close.
/// Bounded: a connection still open after 60 s is given up.
fn hold(mut conn: TcpStream, got: &AtomicU64, closed: &AtomicU64) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(60)));
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    got.fetch_add(1, Ordering::SeqCst);
    loop {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return,
            Err(_) => break,
        }
    }
    closed.fetch_add(1, Ordering::SeqCst);
}

fn config(hold: &Hold, max_concurrent: u32) -> Config {
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"round_robin","timeout":"60s",
            "endpoints":[{{"address":"{}","max_concurrent":{max_concurrent}}}],
            "breaker":{{"consecutive_failures":1}}}}]}}"#,
        hold.url()
    );
    Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

#[actix_rt::test]
async fn a_dropped_submission_cancels_its_attempt_and_frees_the_slot() {
    let b = Hold::start();
    let d = Dispatcher::start(config(&b, 10)).expect("inside a System");
    let subs: Vec<_> = (0..10)
        .map(|i| d.submit(Task::get("svc", format!("/{i}"))))
        .collect();
    assert!(until(|| b.got() == 10).await, "the backend got {}", b.got());
    let s = d.stats().await;
    assert_eq!(s.services[0].nodes[0].in_flight, 10);
    // Five more wait in the queue behind the full node: dropped too, they
    // are never sent.
    let queued: Vec<_> = (10..15)
        .map(|i| d.submit(Task::get("svc", format!("/{i}"))))
        .collect();
    drop(subs);
    drop(queued);
    assert!(
        until(|| b.closed() == 10).await,
        "connections closed: {}",
        b.closed()
    );
    // The slots stay taken for the time their answers were expected to
    // take (the node's latency estimate: 30 ms, with no answer yet), then
    // are free.
    let s = stats_until(&d, |s| {
        s.services[0].queue.cancelled == 15 && s.services[0].nodes[0].in_flight == 0
    })
    .await;
    let (q, n) = (&s.services[0].queue, &s.services[0].nodes[0]);
    assert_eq!(q.cancelled, 15, "{q:?}");
    assert_eq!(q.rejected, 15);
    assert_eq!((q.in_flight, q.queued, q.failed, q.succeeded), (0, 0, 0, 0));
    assert_eq!(n.in_flight, 0);
    // Never against the node: a breaker that trips on one failure is
    // closed, no error and no attempt counted, no latency learned.
    assert_eq!(n.breaker, BreakerStatus::Closed);
    assert_eq!((n.errors, n.total, n.trips), (0, 0, 0));
    assert_eq!(n.error_rate, 0.0);
    assert_eq!(b.got(), 10, "a dropped queued task was sent");
    // The node serves the next task.
    let next = d.submit(Task::get("svc", "/next"));
    assert!(until(|| b.got() == 11).await);
    drop(next);
    let s = stats_until(&d, |s| {
        s.services[0].queue.cancelled == 16 && s.services[0].nodes[0].in_flight == 0
    })
    .await;
    assert_eq!(s.services[0].queue.cancelled, 16);
    d.shutdown(Duration::ZERO).await;
}

/// The other way an attempt ends before its answer: its task's deadline.
/// The backend (one worker, 600 ms a request) goes on serving the cut
/// request, so the attempt keeps the node's one slot until the backend
/// answers: the next task waits in the engine's queue, not inside the
/// backend behind the cut one (freed at the cut, the slot let it in at
/// once, and under overload such requests piled up inside backends).
#[actix_rt::test]
async fn a_cut_attempt_keeps_its_slot_until_the_backend_answers() {
    use actix_dispatch::{AttemptOutcome, ErrorKind};
    let b = support::capacity::Capped::start(1, Duration::from_millis(600));
    let json = format!(
        r#"{{"services":[{{"name":"svc","timeout":"10s",
            "endpoints":[{{"address":"{}","max_concurrent":1}}]}}]}}"#,
        b.url()
    );
    let d = Dispatcher::start(Config::from_json(&json).unwrap()).expect("inside a System");
    let cut = d
        .submit(Task::get("svc", "/cut/1").deadline_in(Duration::from_millis(100)))
        .await;
    assert!(!cut.is_success(), "{cut:?}");
    assert_eq!(
        cut.attempts.iter().map(|a| a.outcome).collect::<Vec<_>>(),
        vec![AttemptOutcome::Error(ErrorKind::Deadline)]
    );
    // Answered at 100 ms; the backend answers at 600 ms: the slot is held.
    let s = d.stats().await;
    assert_eq!(s.services[0].nodes[0].in_flight, 1, "{:?}", s.services[0]);
    let next = d.submit(Task::get("svc", "/next/1")).await;
    assert!(next.is_success(), "{next:?}");
    // It found the backend's worker free: sent after the cut one ended.
    assert_eq!(b.waited("next"), 0);
    assert_eq!((b.served(), b.peak_busy()), (2, 1));
    let s = stats_until(&d, |s| s.services[0].nodes[0].in_flight == 0).await;
    let n = &s.services[0].nodes[0];
    // The cut counts as an attempt, never as the node's error.
    assert_eq!((n.errors, n.breaker), (0, BreakerStatus::Closed));
    d.shutdown(Duration::ZERO).await;
}

/// A streamed task waits for its answer's head in a task of its own: a
/// caller that leaves before the head cancels it the same way.
#[actix_rt::test]
async fn a_dropped_streamed_submission_is_cancelled_before_its_head() {
    let b = Hold::start();
    let d = Dispatcher::start(config(&b, 4)).expect("inside a System");
    let subs: Vec<_> = (0..4)
        .map(|i| d.submit(Task::get("svc", format!("/s{i}")).stream(true)))
        .collect();
    assert!(until(|| b.got() == 4).await, "the backend got {}", b.got());
    drop(subs);
    assert!(until(|| b.closed() == 4).await, "closed: {}", b.closed());
    let s = stats_until(&d, |s| s.services[0].queue.cancelled == 4).await;
    let n = &s.services[0].nodes[0];
    assert_eq!(s.services[0].queue.cancelled, 4);
    assert_eq!((n.in_flight, n.errors, n.total), (0, 0, 0));
    assert_eq!(n.breaker, BreakerStatus::Closed);
    d.shutdown(Duration::ZERO).await;
}

#[cfg(feature = "web")]
mod gateway {
    use super::*;
    use std::io::Write;

    use actix_dispatch::web::forward;
    use actix_web::{web, App, HttpServer};

    /// 50 gateway clients send a request and disconnect while the backend
    /// holds it: all 50 attempts are cancelled and their connections to
    /// the backend closed, the node's slots free again.
    #[actix_rt::test]
    async fn gateway_clients_that_disconnect_are_cancelled() {
        let b = Hold::start();
        let d = Dispatcher::start(config(&b, 50)).expect("inside a System");
        let data = web::Data::new(d.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .route("/svc/{tail:.*}", forward("svc"))
        })
        // A client's EOF ends its request (actix-web's default waits for
        // the answer, in case the client only half-closed).
        .h1_allow_half_closed(false)
        .workers(1)
        .disable_signals()
        .shutdown_timeout(0)
        .bind(("127.0.0.1", 0))
        .expect("bind 127.0.0.1");
        let port = server.addrs()[0].port();
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);

        let clients: Vec<TcpStream> = (0..50)
            .map(|i| {
                let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
                let req = format!("GET /svc/{i} HTTP/1.1\r\nHost: gw\r\n\r\n");
                c.write_all(req.as_bytes()).expect("write");
                c
            })
            .collect();
        assert!(until(|| b.got() == 50).await, "the backend got {}", b.got());
        drop(clients);
        assert!(
            until(|| b.closed() == 50).await,
            "backend connections closed: {} of 50",
            b.closed()
        );
        // Free once the answers' expected time (30 ms) has passed.
        let s = stats_until(&d, |s| {
            s.services[0].queue.cancelled == 50 && s.services[0].nodes[0].in_flight == 0
        })
        .await;
        let (q, n) = (&s.services[0].queue, &s.services[0].nodes[0]);
        assert_eq!(q.cancelled, 50, "{q:?}");
        assert_eq!(n.in_flight, 0);
        assert_eq!(n.breaker, BreakerStatus::Closed);
        assert_eq!((n.errors, n.total), (0, 0));
        d.shutdown(Duration::ZERO).await;
        handle.stop(false).await;
    }
}
