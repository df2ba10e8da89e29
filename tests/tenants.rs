//! Fair shares between tenants on real sockets: real fixed-capacity
//! backends (actix-web servers on loopback), open-loop load, wide margins.
//! `tests/overload_paused.rs` holds the same run exactly on the paused
//! clock (all 30 tasks of each quiet tenant in time, 117 of the noisy
//! one's 450).

mod support;

use std::time::Duration;

use actix_dispatch::{Dispatcher, Outcome, Task};
use support::capacity::Capped;
use support::init_logs;
use support::open_loop::noisy_and_quiet;

/// Three backends serving 2 requests at once for 40 ms each: 150 tasks/s,
/// each node limited to its 2 workers so that tasks wait in the queue.
fn three_capped() -> (Vec<Capped>, actix_dispatch::Config) {
    let bs: Vec<Capped> = (0..3)
        .map(|_| Capped::start(2, Duration::from_millis(40)))
        .collect();
    let eps: Vec<String> = bs
        .iter()
        .map(|b| format!(r#"{{"address":"{}","max_concurrent":2}}"#, b.url()))
        .collect();
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"p2c","endpoints":[{}]}}]}}"#,
        eps.join(",")
    );
    let cfg = actix_dispatch::Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"));
    (bs, cfg)
}

/// A noisy tenant offers twice the backends' capacity, four quiet ones
/// 20 tasks a second each (below their fifth of it), for 1.5 s; every task
/// has a 500 ms deadline. The quiet tenants are served nearly in full, the noisy
/// one is shed, and the stats count each tenant.
#[actix_rt::test]
async fn quiet_tenants_are_served_beside_a_noisy_one() {
    init_logs();
    let (bs, cfg) = three_capped();
    let d = Dispatcher::start(cfg).unwrap();
    let ok = noisy_and_quiet(&d, 150, Duration::from_millis(500)).await;
    println!("(offered, in time) per tenant: {ok:?}");
    // Real time on a machine that may be busy: wide margins. The quiet
    // tenants are served at least half (nearly all on a quiet machine),
    // and better than the noisy one by a fifth of what they offered.
    let (noisy_offered, noisy_good) = ok["noisy"];
    let noisy_share = f64::from(noisy_good) / f64::from(noisy_offered);
    assert!(noisy_share <= 0.6, "noisy: {ok:?}");
    for q in 0..4 {
        let (offered, good) = ok[&format!("quiet{q}")];
        let share = f64::from(good) / f64::from(offered);
        assert!(
            share >= 0.5 && share >= noisy_share + 0.2,
            "quiet{q}: {good} of {offered}: {ok:?}"
        );
    }
    let st = d.stats().await.services.remove(0);
    assert!(st.is_balanced());
    let rows = &st.queue.tenants;
    assert_eq!(rows.len(), 5, "{rows:?}");
    let noisy = rows
        .iter()
        .find(|r| r.tenant.as_deref() == Some("noisy"))
        .unwrap();
    assert_eq!(noisy.offered, 450);
    for r in rows.iter().filter(|r| r.tenant.as_deref() != Some("noisy")) {
        assert_eq!(r.offered, 30);
        assert!(r.shed * 5 <= noisy.shed, "{rows:?}");
    }
    d.shutdown(Duration::from_secs(1)).await;
    drop(bs);
}

/// A tenant key that is too long or not printable is refused at submit,
/// naming the tenant.
#[actix_rt::test]
async fn a_bad_tenant_key_is_refused_at_submit() {
    let (bs, cfg) = three_capped();
    let d = Dispatcher::start(cfg).unwrap();
    for bad in ["k".repeat(129), "with space".into(), String::new()] {
        let r = d.submit(Task::get("svc", "/x").tenant(bad.clone())).await;
        match r.outcome {
            Outcome::Rejected(actix_dispatch::Rejection::InvalidTask(why)) => {
                assert!(why.starts_with("tenant: "), "{bad:?}: {why}")
            }
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    let r = d
        .submit(Task::get("svc", "/x").tenant("k".repeat(128)))
        .await;
    assert!(matches!(r.outcome, Outcome::Success(_)));
    d.shutdown(Duration::from_secs(1)).await;
    drop(bs);
}

/// The gateway names a request's tenant by a header (forwarded as it
/// came) or by a function of the request; an invalid key is a 400.
#[cfg(feature = "web")]
#[actix_rt::test]
async fn the_gateway_reads_the_tenant_from_a_header_or_a_function() {
    use actix_dispatch::web::{forward, ForwardConfig};
    use actix_web::http::header::HeaderName;
    use actix_web::{web, App, HttpServer};

    let (bs, cfg) = three_capped();
    let d = Dispatcher::start(cfg).unwrap();
    let start = |fwd: ForwardConfig| {
        let data = web::Data::new(d.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(fwd.clone())
                .route("/svc/{tail:.*}", forward("svc"))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(0)
        .bind(("127.0.0.1", 0))
        .unwrap();
        let url = format!("http://127.0.0.1:{}", server.addrs()[0].port());
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        (url, handle)
    };
    let client = awc::Client::default();
    let by_header = ForwardConfig::default().tenant_header(HeaderName::from_static("x-tenant"));
    let (url, h1) = start(by_header);
    for (value, want) in [("acme", 200), ("a b", 400), ("acme", 200)] {
        let mut res = client
            .get(format!("{url}/svc/x"))
            .insert_header(("x-tenant", value))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), want, "{value}");
        if want == 400 {
            let body = res.body().await.unwrap();
            assert!(String::from_utf8_lossy(&body).contains("bad_tenant"));
        }
    }
    let by_path = ForwardConfig::default()
        .tenant_with(|req| req.path().split('/').nth(2).map(|s| format!("path-{s}")));
    let (url, h2) = start(by_path);
    let res = client
        .get(format!("{url}/svc/globex"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let rows = d.stats().await.services.remove(0).queue.tenants;
    let offered = |k: &str| {
        rows.iter()
            .find(|r| r.tenant.as_deref() == Some(k))
            .map(|r| (r.offered, r.served))
    };
    assert_eq!(offered("acme"), Some((2, 2)), "{rows:?}");
    assert_eq!(offered("path-globex"), Some((1, 1)), "{rows:?}");
    h1.stop(false).await;
    h2.stop(false).await;
    d.shutdown(Duration::from_secs(1)).await;
    drop(bs);
}

/// Answers every request at once with 200 (an in-process transport, for
/// paused time).
struct Instant200;

impl actix_dispatch::transport::Transport for Instant200 {
    fn send(
        &self,
        _req: actix_dispatch::transport::HttpRequest,
    ) -> futures::future::LocalBoxFuture<
        'static,
        Result<actix_dispatch::transport::HttpReply, actix_dispatch::transport::TransportError>,
    > {
        Box::pin(async move { Ok(actix_dispatch::transport::HttpReply::new(200)) })
    }
}

/// `tenants.rate` on paused time: a tenant over its rate (10/s, bursts of
/// 4) is refused `RateLimited` at submit with its retry-after, while
/// another tenant and the tasks naming none pass, and the refusals are
/// counted to the tenant.
#[actix_rt::test]
async fn a_tenant_over_its_rate_is_refused_and_the_others_pass() {
    use actix_dispatch::{Rejection, TaskResult};
    use std::rc::Rc;
    use std::sync::Arc;

    tokio::time::pause();
    let cfg = actix_dispatch::Config::from_json(
        r#"{"services":[{"name":"svc","endpoints":[{"address":"http://127.0.0.1:9/","max_concurrent":100}],
            "tenants":{"rate":{"rate":10,"burst":4}}}]}"#,
    )
    .unwrap();
    let factory: actix_dispatch::transport::TransportFactory =
        Arc::new(|_: &str| Rc::new(Instant200) as Rc<dyn actix_dispatch::transport::Transport>);
    let d = Dispatcher::builder(cfg).transport(factory).start().unwrap();
    let submit = |tenant: Option<&str>, n: usize| {
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let t = Task::get("svc", format!("/{i}"));
                d.submit(match tenant {
                    Some(k) => t.tenant(k),
                    None => t,
                })
            })
            .collect();
        futures::future::join_all(tasks)
    };
    let fates = |rs: &[TaskResult]| {
        let ok = rs.iter().filter(|r| r.is_success()).count();
        let limited: Vec<Duration> = rs
            .iter()
            .filter_map(|r| match &r.outcome {
                Outcome::Rejected(Rejection::RateLimited { retry_after, .. }) => Some(*retry_after),
                _ => None,
            })
            .collect();
        assert_eq!(ok + limited.len(), rs.len(), "{rs:?}");
        (ok, limited)
    };
    // Ten at once: the burst of 4 passes, 6 are refused, the next token
    // 100 ms away.
    let (ok, limited) = fates(&submit(Some("noisy"), 10).await);
    assert_eq!((ok, limited.len()), (4, 6));
    assert!(
        limited.iter().all(|r| *r == Duration::from_millis(100)),
        "{limited:?}"
    );
    // Another tenant and tasks naming none pass, all of them.
    assert_eq!(fates(&submit(Some("quiet"), 4).await), (4, vec![]));
    assert_eq!(fates(&submit(None, 50).await), (50, vec![]));
    // 250 ms later: two more tokens for the noisy tenant.
    tokio::time::advance(Duration::from_millis(250)).await;
    let (ok, limited) = fates(&submit(Some("noisy"), 5).await);
    assert_eq!((ok, limited.len()), (2, 3));
    assert!(
        limited.iter().all(|r| *r == Duration::from_millis(50)),
        "{limited:?}"
    );

    let st = d.stats().await.services.remove(0);
    let row = |k: &str| {
        st.queue
            .tenants
            .iter()
            .find(|r| r.tenant.as_deref() == Some(k))
            .map(|r| (r.offered, r.served, r.rate_limited, r.shed))
    };
    assert_eq!(row("noisy"), Some((15, 6, 9, 0)));
    assert_eq!(row("quiet"), Some((4, 4, 0, 0)));
    d.shutdown(Duration::from_secs(1)).await;
}
