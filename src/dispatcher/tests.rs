use super::*;
use crate::config::Config;
use crate::outcome::{AttemptOutcome, ErrorKind, FailReason, Outcome};
use crate::task::Task;
use crate::transport::{HttpReply, HttpRequest, Transport, TransportError};
use futures::future::LocalBoxFuture;
use std::rc::Rc;
use std::time::Duration;
use tokio::sync::oneshot;

/// Never answers: the attempt is only ever ended by its node's timeout.
struct Silent;

impl Transport for Silent {
    fn send(
        &self,
        _req: HttpRequest,
    ) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
        Box::pin(futures::future::pending())
    }
}

/// Answers every request 200 at once.
struct Ok200;

impl Transport for Ok200 {
    fn send(
        &self,
        _req: HttpRequest,
    ) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
        Box::pin(async { Ok(HttpReply::new(200)) })
    }
}

/// Regression: a service added by `reload` started on
/// the caller's arbiter, so it died with the caller (an actix-web
/// worker, say) and every later task was refused.
#[actix_rt::test]
async fn reload_starts_new_services_on_the_dispatchers_arbiter() {
    let json = |names: &[&str]| {
        let services: Vec<String> = names
            .iter()
            .map(|n| {
                format!(r#"{{"name":"{n}","endpoints":[{{"address":"http://127.0.0.1:9/"}}]}}"#)
            })
            .collect();
        Config::from_json(&format!(r#"{{"services":[{}]}}"#, services.join(","))).unwrap()
    };
    let ok: TransportFactory = Arc::new(|_: &str| Rc::new(Ok200) as Rc<dyn Transport>);
    let d = Dispatcher::builder(json(&["a"]))
        .transport(ok)
        .start()
        .unwrap();
    // A worker thread reloads, then stops.
    let worker = actix::Arbiter::new();
    let (tx, rx) = oneshot::channel();
    let d2 = d.clone();
    worker.spawn(async move {
        let _ = tx.send(d2.reload(json(&["a", "b"])).await);
    });
    let report = rx.await.unwrap().unwrap();
    assert_eq!(report.started, vec!["b".to_string()]);
    worker.stop();
    worker.join().unwrap();
    // The new service lives on.
    let r = d.submit(Task::get("b", "/x")).await;
    assert!(r.is_success(), "{:?}", r.outcome);
    d.shutdown(Duration::from_secs(1)).await;
}

/// The watchdog answers attempts whose node died with them in flight:
/// here the node thread is stopped, so not even the node's timeout can
/// end the attempt. Queue and balancer run under paused time.
#[actix_rt::test]
async fn attempts_of_a_dead_node_are_answered_by_the_watchdog() {
    tokio::time::pause();
    let config = Config::from_json(
        r#"{"services":[{"name":"svc","timeout":"1s",
            "endpoints":[{"address":"http://127.0.0.1:9/","max_concurrent":10}],
            "breaker":{"enabled":false},
            "retry":{"max_retries":1,"backoff_base":"1ms","backoff_max":"1ms"}}]}"#,
    )
    .unwrap();
    let silent: TransportFactory = Arc::new(|_: &str| Rc::new(Silent) as Rc<dyn Transport>);
    let d = Dispatcher::builder(config)
        .node_threads(1)
        .transport(silent)
        .start()
        .unwrap();
    let pending = d.submit(Task::get("svc", "/x"));
    // The node thread dies with the attempt (or its dispatch) in flight.
    for a in d.inner.node_threads.lock().expect("lock").drain(..) {
        a.stop();
    }
    let r = pending.await;
    match &r.outcome {
        Outcome::Failure(f) => {
            assert_eq!(f.reason, FailReason::RetriesExhausted);
            assert_eq!(f.last, Some(AttemptOutcome::Error(ErrorKind::Lost)));
        }
        o => panic!("{o:?}"),
    }
    assert_eq!(r.attempts.len(), 2);
    let s = d.stats().await;
    assert!(s.services[0].is_balanced());
    assert_eq!(s.services[0].queue.failed, 1);
}
