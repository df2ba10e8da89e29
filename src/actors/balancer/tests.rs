//! The balancer alone, under paused time: a stand-in queue records what the
//! balancer tells it, and the tests send it routes and losses directly, so
//! each interleaving is exact.

use std::rc::Rc;
use std::sync::Mutex;
use std::time::Duration;

use futures::future::LocalBoxFuture;

use super::*;
use crate::actors::protocol::{Route, Seq, ToQueue};
use crate::config::{Config, ServiceConfig};
use crate::transport::{HttpReply, HttpRequest, Transport, TransportError};

/// What the balancer told its queue.
#[derive(Default)]
struct Seen {
    credit: usize,
    bounces: Vec<Seq>,
}

struct FakeQueue(Arc<Mutex<Seen>>);

impl Actor for FakeQueue {
    type Context = Context<Self>;
}

impl Handler<BalancerTurn> for FakeQueue {
    type Result = ();

    fn handle(&mut self, msg: BalancerTurn, _ctx: &mut Self::Context) {
        let mut seen = self.0.lock().unwrap();
        for news in msg.0 {
            match news {
                ToQueue::Room(r) => seen.credit += r.credit,
                ToQueue::Bounce { seq, .. } => seen.bounces.push(seq),
                _ => {}
            }
        }
    }
}

/// Never answers: attempts stay in flight.
struct Silent;

impl Transport for Silent {
    fn send(
        &self,
        _req: HttpRequest,
    ) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
        Box::pin(futures::future::pending())
    }
}

fn silent() -> TransportFactory {
    Arc::new(|_: &str| Rc::new(Silent) as Rc<dyn Transport>)
}

/// A balancer for the one service of `json`, answering to a fake queue.
fn start(
    json: &str,
    arbiters: Vec<actix::dev::ArbiterHandle>,
) -> (Addr<BalancerActor>, Arc<Mutex<Seen>>) {
    start_with(
        Config::from_json(json).unwrap().services.remove(0),
        arbiters,
    )
}

/// A balancer for `cfg`, answering to a fake queue.
fn start_with(
    cfg: ServiceConfig,
    arbiters: Vec<actix::dev::ArbiterHandle>,
) -> (Addr<BalancerActor>, Arc<Mutex<Seen>>) {
    let cfg = Arc::new(cfg);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let queue = FakeQueue(seen.clone()).start();
    let b = BalancerActor::create(move |ctx| {
        let metrics = Default::default();
        BalancerActor::new(cfg, queue.recipient(), silent(), arbiters, metrics, ctx)
    });
    (b, seen)
}

fn route(task: u64, at: Instant) -> Route {
    Route::first(task, at)
}

/// One turn of the queue that only routes.
fn routes(routes: Vec<Route>) -> QueueTurn {
    QueueTurn {
        routes,
        ..Default::default()
    }
}

/// Lets every ready actor run (paused time does not move).
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// Regression: a route decided before the service's next
/// token was due bounced and set no timer, so the task waited for the next
/// `GetLoad` round (here 10 s) although the token came due at once.
#[actix_rt::test]
async fn a_route_bounced_on_a_token_not_yet_due_sets_a_wake_up() {
    tokio::time::pause();
    let (b, seen) = start(
        r#"{"services":[{"name":"svc","timeout":"60s",
            "endpoints":[{"address":"http://127.0.0.1:9/","max_concurrent":10}],
            "balancer":{"refresh_interval":"10s"},
            "rate_limit":{"service":{"rate":10,"burst":1},"on_limit":"wait"}}]}"#,
        Vec::new(),
    );
    settle().await;
    assert_eq!(seen.lock().unwrap().credit, 1, "one token: one credit");
    let t0 = Instant::now();
    b.send(routes(vec![route(1, t0)])).await.unwrap();
    // The token is due at t0 + 100 ms: the timer grants it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    settle().await;
    assert_eq!(seen.lock().unwrap().credit, 2);
    // A route the queue decided at t0 + 50 ms (its clock lags the credit):
    // no token at that time, so it bounces...
    b.send(routes(vec![route(2, t0 + Duration::from_millis(50))]))
        .await
        .unwrap();
    settle().await;
    assert_eq!(
        seen.lock().unwrap().bounces,
        vec![Seq { task: 2, round: 1 }]
    );
    // ...and the credit comes back as soon as the token is due (it is),
    // not at the next refresh 10 s later.
    tokio::time::sleep(Duration::from_millis(5)).await;
    settle().await;
    assert_eq!(seen.lock().unwrap().credit, 3);
}

/// Regression: an attempt lost with its node's thread
/// stayed counted in flight, so a removed node draining it never left.
#[actix_rt::test]
async fn a_lost_attempt_frees_its_slot_and_a_drained_node_leaves() {
    tokio::time::pause();
    let threads: Vec<actix::Arbiter> = (0..2).map(|_| actix::Arbiter::new()).collect();
    let (b, seen) = start(
        r#"{"services":[{"name":"svc","mode":"round_robin","timeout":"60s",
            "endpoints":[{"address":"http://127.0.0.1:9/a/","max_concurrent":1},
                         {"address":"http://127.0.0.1:9/b/","max_concurrent":1}],
            "breaker":{"enabled":false},"balancer":{"refresh_interval":"10s"}}]}"#,
        threads.iter().map(|a| a.handle()).collect(),
    );
    settle().await;
    assert_eq!(seen.lock().unwrap().credit, 2);
    let now = Instant::now();
    b.send(routes(vec![route(1, now)])).await.unwrap();
    b.send(routes(vec![route(2, now)])).await.unwrap();
    let stats = b.send(GetNodeStats).await.unwrap();
    assert!(stats.iter().all(|n| n.in_flight == 1), "one attempt each");
    // Node 0's thread dies with its attempt.
    let mut threads = threads.into_iter();
    let dead = threads.next().unwrap();
    dead.stop();
    dead.join().unwrap();
    // It is removed: it drains, holding its lost attempt.
    b.send(PoolChange::Remove("http://127.0.0.1:9/a/".into()))
        .await
        .unwrap()
        .unwrap();
    let stats = b.send(GetNodeStats).await.unwrap();
    assert_eq!(stats.len(), 2);
    assert!(stats[0].draining);
    // The watchdog answers both tasks lost: the dead node's slot is freed
    // and it leaves; the live node keeps its attempt.
    for task in [1, 2] {
        let lost = QueueTurn {
            lost: vec![Seq { task, round: 1 }],
            ..Default::default()
        };
        b.send(lost).await.unwrap();
    }
    let stats = b.send(GetNodeStats).await.unwrap();
    assert_eq!(stats.len(), 1, "the drained node left");
    assert_eq!(stats[0].address, "http://127.0.0.1:9/b/");
    assert_eq!(
        stats[0].in_flight, 1,
        "a live node's slot is its own to free"
    );
    for t in threads {
        t.stop();
    }
}

/// The routes of one pump come in one turn: placed as the same routes
/// one by one would be (round robin spreads them, the one beyond the nodes'
/// room bounces), with the credit settled once for the batch.
#[actix_rt::test]
async fn a_batch_of_routes_is_placed_as_single_routes_would_be() {
    tokio::time::pause();
    let (b, seen) = start(
        r#"{"services":[{"name":"svc","mode":"round_robin","timeout":"60s",
            "endpoints":[{"address":"http://127.0.0.1:9/a/","max_concurrent":1},
                         {"address":"http://127.0.0.1:9/b/","max_concurrent":1}],
            "breaker":{"enabled":false},"balancer":{"refresh_interval":"10s"}}]}"#,
        Vec::new(),
    );
    settle().await;
    assert_eq!(seen.lock().unwrap().credit, 2);
    let now = Instant::now();
    b.send(routes(vec![route(1, now), route(2, now), route(3, now)]))
        .await
        .unwrap();
    let stats = b.send(GetNodeStats).await.unwrap();
    assert!(stats.iter().all(|n| n.in_flight == 1), "one attempt each");
    settle().await;
    let seen = seen.lock().unwrap();
    assert_eq!(seen.bounces, vec![Seq { task: 3, round: 1 }]);
    assert_eq!(seen.credit, 2, "no room left: no more credit");
}

/// Shared node buckets through a store (the in-process one): the routes
/// of a turn wait on their node for one call; the one it pays for goes to
/// the node, the others back to the queue, and the node shows the tokens
/// this instance holds of it.
#[actix_rt::test]
async fn shared_node_tokens_pay_for_the_routes_of_one_turn() {
    use crate::actors::share::local::LocalStore;
    use crate::actors::share::{Settings, UseShared};
    use crate::config::{BucketConfig, OnDown, SharedMode};
    tokio::time::pause();
    let store = LocalStore::new(Settings {
        mode: SharedMode::Exact,
        on_down: OnDown::Local,
        lease: Duration::from_millis(100),
        timeout: Duration::from_millis(50),
    });
    // Another instance took one of the node's two tokens.
    let bucket = BucketConfig {
        rate: 1.0,
        burst: 2,
    };
    let key = "svc:http://127.0.0.1:9/".to_owned();
    assert_eq!(
        store.take_at(&[(key, bucket)], 1, Instant::now()).granted,
        1
    );
    let mut cfg = Config::from_json(
        r#"{"services":[{"name":"svc","timeout":"60s",
            "endpoints":[{"address":"http://127.0.0.1:9/","max_concurrent":10}],
            "breaker":{"enabled":false},"balancer":{"refresh_interval":"10s"},
            "rate_limit":{"per_node":{"rate":1,"burst":2}}}]}"#,
    )
    .unwrap()
    .services
    .remove(0);
    cfg.rate_limit.shared = true;
    let (b, seen) = start_with(cfg, Vec::new());
    b.send(UseShared(store)).await.unwrap();
    settle().await;
    let t0 = Instant::now();
    b.send(routes(vec![route(1, t0), route(2, t0), route(3, t0)]))
        .await
        .unwrap();
    let stats = b.send(GetNodeStats).await.unwrap();
    assert_eq!(stats[0].in_flight, 3, "all three wait on the node");
    // The call goes out when the turn ends (a timer of zero).
    tokio::time::sleep(Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(
        seen.lock().unwrap().bounces,
        vec![Seq { task: 2, round: 1 }, Seq { task: 3, round: 1 }]
    );
    let stats = b.send(GetNodeStats).await.unwrap();
    assert_eq!(stats[0].in_flight, 1, "the paid route only");
    assert_eq!(stats[0].tokens, Some(0), "its one token used");
}

/// Shared breakers through a store (the in-process one): a trip another
/// instance reported keeps the node out from the next read on; once its
/// open time is over, this instance wins the one probe claim and sends
/// one task, no more.
#[actix_rt::test]
async fn a_shared_trip_keeps_the_node_out_until_this_instance_holds_the_probe() {
    use crate::actors::share::local::LocalStore;
    use crate::actors::share::{Settings, SharedBreaker, UseShared};
    use crate::config::{OnDown, SharedMode};
    tokio::time::pause();
    let store = LocalStore::new(Settings {
        mode: SharedMode::Lease,
        on_down: OnDown::Local,
        lease: Duration::from_millis(100),
        timeout: Duration::from_millis(50),
    });
    let mut cfg = Config::from_json(
        r#"{"services":[{"name":"svc","timeout":"60s",
            "endpoints":[{"address":"http://127.0.0.1:9/","max_concurrent":10}],
            "balancer":{"refresh_interval":"100ms"}}]}"#,
    )
    .unwrap()
    .services
    .remove(0);
    cfg.breaker.shared = true;
    let (b, seen) = start_with(cfg, Vec::new());
    b.send(UseShared(store.clone())).await.unwrap();
    store.trip("svc", "http://127.0.0.1:9/", Duration::from_secs(1), 1);
    // The next refresh reads it.
    tokio::time::sleep(Duration::from_millis(150)).await;
    settle().await;
    b.send(routes(vec![route(1, Instant::now())]))
        .await
        .unwrap();
    settle().await;
    assert_eq!(
        seen.lock().unwrap().bounces,
        vec![Seq { task: 1, round: 1 }]
    );
    // Half-open for the cluster: a read claims the probe for this instance.
    tokio::time::sleep(Duration::from_secs(1)).await;
    settle().await;
    let t1 = Instant::now();
    b.send(routes(vec![route(2, t1), route(3, t1)]))
        .await
        .unwrap();
    settle().await;
    assert_eq!(
        seen.lock().unwrap().bounces,
        vec![Seq { task: 1, round: 1 }, Seq { task: 3, round: 1 }],
        "one probe for the cluster"
    );
    let stats = b.send(GetNodeStats).await.unwrap();
    assert_eq!(stats[0].in_flight, 1);
}
