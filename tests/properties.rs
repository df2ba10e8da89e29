//! Property: whatever the backends do and however the service is tuned,
//! every accepted task gets exactly one result and the counters add up.
//! Runs the whole actor pipeline under paused tokio time with a scripted
//! in-process transport (answers, 5xx, 429, 404, hangs past the timeout,
//! connect errors, resets and panics).

use std::collections::HashSet;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_dispatch::transport::{HttpReply, HttpRequest, Transport, TransportError};
use actix_dispatch::{Config, Dispatcher, ErrorKind, Method, Task};
use futures::future::LocalBoxFuture;
use proptest::prelude::*;

#[derive(Debug, Clone, Copy)]
enum Act {
    Ok,
    Status(u16),
    Hang,
    Error(ErrorKind),
    Panic,
}

struct Scripted {
    script: Arc<Vec<Act>>,
    next: Arc<AtomicUsize>,
}

impl Transport for Scripted {
    fn send(
        &self,
        _req: HttpRequest,
    ) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let act = self.script[i % self.script.len()];
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(1 + (i % 7) as u64)).await;
            let status = match act {
                Act::Ok => 200,
                Act::Status(s) => s,
                Act::Hang => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    200
                }
                Act::Error(k) => return Err(TransportError::new(k, "scripted")),
                Act::Panic => panic!("scripted panic"),
            };
            Ok(HttpReply {
                status,
                headers: {
                    let mut h = actix_dispatch::HeaderMap::new();
                    if status == 429 {
                        h.insert(
                            awc::http::header::RETRY_AFTER,
                            awc::http::header::HeaderValue::from_static("1"),
                        );
                    }
                    h
                },
                body: Default::default(),
            })
        })
    }
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        6 => Just(Act::Ok),
        1 => Just(Act::Status(500)),
        1 => Just(Act::Status(503)),
        1 => Just(Act::Status(429)),
        1 => Just(Act::Status(404)),
        1 => Just(Act::Hang),
        1 => Just(Act::Error(ErrorKind::Connect)),
        1 => Just(Act::Error(ErrorKind::Reset)),
        1 => Just(Act::Panic),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    script: Vec<Act>,
    tasks: usize,
    nodes: usize,
    max_concurrent: u32,
    max_retries: u32,
    capacity: usize,
    wait_when_full: bool,
    breaker: bool,
    rate_limit: Option<(u32, u32)>,
    reject_on_limit: bool,
    mode: &'static str,
    deadline_ms: Option<u64>,
    shutdown_after_ms: Option<u64>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        (
            prop::collection::vec(act(), 1..40),
            1usize..150,
            1usize..4,
            1u32..6,
            0u32..4,
            1usize..60,
        ),
        any::<bool>(),
        any::<bool>(),
        prop::option::of((1u32..50, 1u32..5)),
        any::<bool>(),
        prop_oneof![
            Just("round_robin"),
            Just("weighted"),
            Just("least_load"),
            Just("p2c"),
            Just("consistent_hash")
        ],
        prop::option::of(50u64..3000),
        prop::option::of(10u64..2000),
    )
        .prop_map(
            |((script, tasks, nodes, mc, mr, cap), wait, breaker, rl, rej, mode, dl, sd)| Case {
                script,
                tasks,
                nodes,
                max_concurrent: mc,
                max_retries: mr,
                capacity: cap,
                wait_when_full: wait,
                breaker,
                rate_limit: rl,
                reject_on_limit: rej,
                mode,
                deadline_ms: dl,
                shutdown_after_ms: sd,
            },
        )
}

fn config(c: &Case) -> Config {
    let eps: Vec<String> = (0..c.nodes)
        .map(|i| {
            format!(
                r#"{{"address":"http://127.0.0.{}:80/","weight":{},"max_concurrent":{}}}"#,
                i + 1,
                i + 1,
                c.max_concurrent
            )
        })
        .collect();
    let rate = match c.rate_limit {
        Some((r, b)) => format!(
            r#","rate_limit":{{"per_node":{{"rate":{r},"burst":{b}}},"on_limit":"{}"}}"#,
            if c.reject_on_limit { "reject" } else { "wait" }
        ),
        None => String::new(),
    };
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"{}","timeout":"200ms","endpoints":[{}],
            "retry":{{"max_retries":{},"backoff_base":"5ms","backoff_max":"50ms"}},
            "queue":{{"capacity":{},"on_full":"{}"}},
            "breaker":{{"enabled":{},"consecutive_failures":3,"open_for":"100ms","max_open_for":"400ms","on_all_open":"fail_fast"}},
            "balancer":{{"seed":1,"refresh_interval":"50ms"}}{}}}]}}"#,
        c.mode,
        eps.join(","),
        c.max_retries,
        c.capacity,
        if c.wait_when_full { "wait" } else { "reject" },
        c.breaker,
        rate
    );
    Config::from_json(&json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

fn run_case(c: Case) {
    actix_rt::System::new().block_on(async move {
        tokio::time::pause();
        let script = Arc::new(c.script.clone());
        let next = Arc::new(AtomicUsize::new(0));
        let factory: actix_dispatch::transport::TransportFactory = Arc::new(move |_: &str| {
            Rc::new(Scripted {
                script: script.clone(),
                next: next.clone(),
            }) as Rc<dyn Transport>
        });
        let d = Dispatcher::builder(config(&c))
            .transport(factory)
            .start()
            .unwrap();
        let handles: Vec<_> = (0..c.tasks)
            .map(|i| {
                let d = d.clone();
                let mut t = if i % 4 == 0 {
                    Task::new("svc", Method::POST, format!("/p/{i}"))
                } else {
                    Task::get("svc", format!("/g/{i}")).affinity(format!("k{}", i % 13))
                };
                if let Some(ms) = c.deadline_ms {
                    t = t.deadline_in(Duration::from_millis(ms));
                }
                actix_rt::spawn(async move { d.submit(t).await })
            })
            .collect();
        let report = if let Some(ms) = c.shutdown_after_ms {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Some(d.shutdown(Duration::from_millis(100)).await)
        } else {
            None
        };
        let mut ids = HashSet::new();
        for h in handles {
            let r = h.await.expect("submit never panics");
            assert!(ids.insert(r.id), "task {} answered twice", r.id);
        }
        assert_eq!(ids.len(), c.tasks);
        let stats = match report {
            Some(r) => r.stats,
            None => {
                let s = d.stats().await;
                d.shutdown(Duration::from_millis(10)).await;
                s
            }
        };
        let svc = &stats.services[0];
        assert!(svc.is_balanced(), "{:?}", svc.queue);
        assert_eq!(svc.queue.submitted as usize, c.tasks);
        assert_eq!((svc.queue.queued, svc.queue.in_flight), (0, 0));
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_task_gets_exactly_one_result(c in case()) {
        run_case(c);
    }
}
