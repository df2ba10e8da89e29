//! The queue alone, under paused time: a stand-in balancer records the
//! routes the queue sends, and the tests answer them in an exact order,
//! which the whole pipeline cannot be made to produce on demand.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use tokio::time::Instant;

use super::core::TaskNo;
use super::{BalancerPort, QueueActor};
use crate::actors::inbox::InboxSender;
use crate::actors::protocol::{
    AttemptEnded, AttemptReport, BalancerTurn, GetQueueStats, NodeAnswers, NodeId, QueueTurn,
    ReplyTx, Room, Seq, Stop, Submit, ToQueue,
};
use crate::algo::priority::Priority;
use crate::config::Config;
use crate::outcome::{AttemptOutcome, Outcome, Rejection, TaskResult};
use crate::task::{Job, Task};

/// What the queue told its balancer.
#[derive(Default)]
struct Seen {
    routes: Vec<(Seq, bool)>,
    /// Each route's `headroom` flag, in order.
    headroom: Vec<bool>,
    cancels: Vec<Seq>,
}

struct FakeBalancer(Arc<Mutex<Seen>>);

impl Actor for FakeBalancer {
    type Context = Context<Self>;
}

impl Handler<QueueTurn> for FakeBalancer {
    type Result = ();

    fn handle(&mut self, msg: QueueTurn, _ctx: &mut Self::Context) {
        let mut seen = self.0.lock().unwrap();
        seen.cancels.extend(msg.cancels);
        seen.routes
            .extend(msg.routes.iter().map(|r| (r.seq, r.hedge)));
        seen.headroom.extend(msg.routes.iter().map(|r| r.headroom));
    }
}

impl Handler<Stop> for FakeBalancer {
    type Result = ();

    fn handle(&mut self, _msg: Stop, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// A queue for the one service of `json`, answering to a fake balancer.
fn start(json: &str) -> (Queue, Arc<Mutex<Seen>>) {
    let cfg = Arc::new(Config::from_json(json).unwrap().services.remove(0));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let b = FakeBalancer(seen.clone()).start();
    let (addr, inbox) = QueueActor::with_port(cfg, BalancerPort::of(&b));
    (Queue { addr, inbox }, seen)
}

/// The queue under test and its intake.
struct Queue {
    addr: Addr<QueueActor>,
    inbox: InboxSender<Submit>,
}

impl Queue {
    /// Delivers one turn of the balancer's news.
    fn news(&self, news: Vec<ToQueue>) {
        self.addr.do_send(BalancerTurn(news));
    }
}

/// Submits one task; its result comes into the returned job's slot.
fn submit(queue: &Queue, task: Task, id: u64) -> Answer {
    let job = Arc::new(task.prepare(id, Instant::now()).unwrap());
    queue.inbox.send(Submit {
        task: ReplyTx::new(job.clone()),
        wait: false,
    });
    Answer(job)
}

/// Where a test's task is answered.
struct Answer(Arc<Job>);

impl Answer {
    /// The answer, if there is one yet.
    fn try_recv(&mut self) -> Result<Box<TaskResult>, ()> {
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        match self.0.reply.poll_take(&mut cx) {
            std::task::Poll::Ready(Some(r)) => Ok(r),
            _ => Err(()),
        }
    }
}

/// An attempt of `seq` ended with `status` on node `node` (and freed its
/// slot: one credit).
fn done(seq: Seq, node: u32, hedge: bool, status: u16) -> Vec<ToQueue> {
    let ended = AttemptEnded {
        seq,
        hedge,
        report: AttemptReport {
            outcome: AttemptOutcome::Status(status),
            latency: Duration::from_millis(20),
            reply: Some(crate::transport::HttpReply::new(status)),
            retry_after: None,
            detail: None,
            stream: None,
        },
    };
    let answers = NodeAnswers {
        node: NodeId(node),
        address: format!("http://127.0.0.1:9/{node}/").into(),
        at: Instant::now(),
        done: vec![ended],
    };
    vec![ToQueue::Ended(answers), Room::credit(1)]
}

/// The balancer could not place `seq`'s attempt (and gives its credit back).
fn bounce(seq: Seq, hedge: bool) -> Vec<ToQueue> {
    vec![
        ToQueue::Bounce {
            seq,
            hedge,
            refused: false,
        },
        Room::credit(1),
    ]
}

/// Lets every ready actor run (paused time does not move).
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// Regression: a hedged round whose first attempt failed
/// and whose hedge then bounced (no node could take it) left the task in
/// flight with nothing out, never answered. The failure must reach the
/// policy whichever of the two ends the round: here the bounce does, so the
/// task is retried, and the retry's success answers it.
#[actix_rt::test]
async fn a_failed_first_attempt_then_a_bounced_hedge_asks_the_policy() {
    tokio::time::pause();
    let (queue, seen) = start(
        r#"{"services":[{"name":"svc","timeout":"60s",
            "endpoints":[{"address":"http://127.0.0.1:9/"}],
            "hedge":{"after":"20ms"},
            "retry":{"max_retries":1,"backoff_base":"1ms","backoff_max":"1ms"}}]}"#,
    );
    queue.news(vec![Room::credit(2)]);
    let mut rx = submit(&queue, Task::get("svc", "/x"), 1);
    settle().await;
    let first = {
        let s = seen.lock().unwrap();
        assert_eq!(s.routes.len(), 1, "the first attempt goes out");
        assert!(!s.routes[0].1);
        s.routes[0].0
    };
    // The hedge timer fires: the hedge goes out in the same round.
    tokio::time::sleep(Duration::from_millis(25)).await;
    settle().await;
    assert_eq!(seen.lock().unwrap().routes[1], (first, true));
    // The exact interleaving: the first attempt's failure arrives, then the
    // balancer's bounce of the hedge.
    queue.news(done(first, 0, false, 503));
    queue.news(bounce(first, true));
    settle().await;
    assert!(rx.try_recv().is_err(), "max_retries 1: not answered yet");
    // The round ended failed: the policy retries after its backoff.
    tokio::time::sleep(Duration::from_millis(5)).await;
    settle().await;
    let retry = {
        let s = seen.lock().unwrap();
        assert_eq!(s.routes.len(), 3, "the task is retried: {:?}", s.routes);
        s.routes[2]
    };
    assert_eq!(
        retry,
        (
            Seq {
                task: first.task,
                round: 2
            },
            false
        )
    );
    queue.news(done(retry.0, 0, false, 200));
    settle().await;
    let r = rx.try_recv().expect("answered once the retry succeeds");
    assert!(r.is_success(), "{r:?}");
    let statuses: Vec<_> = r.attempts.iter().map(|a| a.outcome).collect();
    assert_eq!(
        statuses,
        vec![AttemptOutcome::Status(503), AttemptOutcome::Status(200)]
    );
    let stats = queue.addr.send(GetQueueStats).await.unwrap();
    assert_eq!((stats.in_flight, stats.queued), (0, 0));
    assert_eq!(stats.retried, 1);
}

/// The same race with the other order: the hedge bounces first (the first
/// attempt goes on alone), then the first attempt fails and ends the round.
/// With no retries left, the task fails with that attempt's status.
#[actix_rt::test]
async fn a_bounced_hedge_then_a_failed_first_attempt_fails_the_task() {
    tokio::time::pause();
    let (queue, seen) = start(
        r#"{"services":[{"name":"svc","timeout":"60s",
            "endpoints":[{"address":"http://127.0.0.1:9/"}],
            "hedge":{"after":"20ms"},"retry":{"max_retries":0}}]}"#,
    );
    queue.news(vec![Room::credit(2)]);
    let mut rx = submit(&queue, Task::get("svc", "/x"), 1);
    tokio::time::sleep(Duration::from_millis(25)).await;
    settle().await;
    let first = seen.lock().unwrap().routes[0].0;
    assert_eq!(seen.lock().unwrap().routes.len(), 2, "first and hedge");
    queue.news(bounce(first, true));
    settle().await;
    assert!(rx.try_recv().is_err(), "the first attempt is still out");
    queue.news(done(first, 0, false, 503));
    settle().await;
    let r = rx.try_recv().expect("answered when the round ends");
    match &r.outcome {
        Outcome::Failure(f) => assert_eq!(f.last, Some(AttemptOutcome::Status(503))),
        o => panic!("{o:?}"),
    }
    assert_eq!(seen.lock().unwrap().routes.len(), 2, "no retry");
}

/// A standing queue is shed on time by the delay control's own timer, even
/// when no news comes from the balancer (every node full, answers slow):
/// the tasks do not wait for the once-a-second sweep.
#[actix_rt::test]
async fn a_standing_queue_is_shed_without_news_from_the_balancer() {
    tokio::time::pause();
    let (queue, seen) = start(ONE_NODE_DELAY);
    // One credit: one task goes out and never answers; the rest stand.
    queue.news(vec![Room::credit(1)]);
    let mut slots: Vec<Answer> = (0..10)
        .map(|i| submit(&queue, Task::get("svc", format!("/{i}")), i))
        .collect();
    settle().await;
    assert_eq!(seen.lock().unwrap().routes.len(), 1);
    // 100 ms without draining: overloaded; then past the 5 ms target.
    tokio::time::sleep(Duration::from_millis(120)).await;
    settle().await;
    let shed = slots
        .iter_mut()
        .filter_map(|s| s.try_recv().ok())
        .filter(|r| matches!(r.outcome, Outcome::Rejected(Rejection::Overloaded { .. })))
        .count();
    assert_eq!(shed, 9, "every standing task shed, the one in flight kept");
    let stats = queue.addr.send(GetQueueStats).await.unwrap();
    assert_eq!((stats.shed, stats.queued, stats.in_flight), (9, 0, 1));
}

/// What a slot was answered with, if anything: `O` overloaded, `F` queue
/// full, `-` nothing yet, `?` anything else.
fn answered(slot: &mut Answer) -> char {
    match slot.try_recv() {
        Err(()) => '-',
        Ok(r) => match r.outcome {
            Outcome::Rejected(Rejection::Overloaded { .. }) => 'O',
            Outcome::Rejected(Rejection::QueueFull) => 'F',
            _ => '?',
        },
    }
}

/// The test service with one endpoint, its attempts never answered
/// unless the test says so.
const ONE_NODE: &str = r#"{"services":[{"name":"svc","timeout":"60s",
            "endpoints":[{"address":"http://127.0.0.1:9/"}]}]}"#;

/// One node, and the delay control (`queue.delay`, off unless given) on
/// with its defaults.
const ONE_NODE_DELAY: &str = r#"{"services":[{"name":"svc","timeout":"60s",
            "queue":{"delay":{}},
            "endpoints":[{"address":"http://127.0.0.1:9/"}]}]}"#;

/// Overloads the queue: one credit, then `n` default tasks (the first goes
/// out and is not answered), then 120 ms without a send, past an interval.
/// The slots, and what each was answered with (see [`answered`]).
async fn overload(queue: &Queue, n: u64) -> (Vec<Answer>, String) {
    queue.news(vec![Room::credit(1)]);
    let mut slots: Vec<Answer> = (0..n)
        .map(|i| submit(queue, Task::get("svc", format!("/{i}")), i))
        .collect();
    settle().await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    settle().await;
    let got = slots.iter_mut().map(answered).collect();
    (slots, got)
}

/// While overloaded, a new task finds more tasks ahead of it than the queue
/// sends within the target: it is refused at once, without waiting out the
/// target. A critical task waits only behind critical ones, so it is
/// admitted, and it is sent first.
#[actix_rt::test]
async fn under_overload_new_tasks_are_refused_at_intake_and_critical_go_first() {
    tokio::time::pause();
    let (queue, seen) = start(ONE_NODE_DELAY);
    // One sent in the first interval; the standing three are shed once
    // the queue is overloaded.
    let (_first, got) = overload(&queue, 4).await;
    assert_eq!(got, "-OOO");
    // One send per interval: one task may wait; the next is refused at
    // intake, at the same instant.
    let mut a = submit(&queue, Task::get("svc", "/a"), 10);
    let mut b = submit(&queue, Task::get("svc", "/b"), 11);
    let mut s = submit(
        &queue,
        Task::get("svc", "/s").priority(Priority::Sheddable),
        12,
    );
    let c = submit(
        &queue,
        Task::get("svc", "/c").priority(Priority::Critical),
        13,
    );
    settle().await;
    assert_eq!(
        [answered(&mut a), answered(&mut b), answered(&mut s)],
        ['-', 'O', 'O']
    );
    let stats = queue.addr.send(GetQueueStats).await.unwrap();
    assert_eq!(stats.shed, 5);
    assert_eq!(stats.shed_by_class.default, 4);
    assert_eq!(stats.shed_by_class.sheddable, 1);
    assert_eq!(stats.shed_by_class.critical, 0);
    assert_eq!(stats.shed_at_intake, 2);
    assert_eq!(stats.queued, 2, "the default and the critical task wait");
    // A slot frees: the critical task goes first.
    let out = seen.lock().unwrap().routes[0].0;
    queue.news(done(out, 0, false, 200));
    settle().await;
    let routes = seen.lock().unwrap().routes.clone();
    assert_eq!(routes.len(), 2);
    assert_eq!(routes[1].0.task, c_task(&queue, &c).await);
}

/// The table number of the task whose slot is `slot` (its job's id).
async fn c_task(queue: &Queue, slot: &Answer) -> TaskNo {
    queue
        .addr
        .send(FindTask(slot.0.id))
        .await
        .unwrap()
        .expect("the task is held")
}

/// Test-only: the table number of the task with this id.
struct FindTask(crate::task::TaskId);

impl Message for FindTask {
    type Result = Option<TaskNo>;
}

impl Handler<FindTask> for QueueActor {
    type Result = Option<TaskNo>;

    fn handle(&mut self, msg: FindTask, _ctx: &mut Self::Context) -> Self::Result {
        self.find(msg.0)
    }
}

/// A full queue makes room for a more important task by shedding the
/// oldest waiting task of the least important lower class; a task finds no
/// room among tasks at least as important as itself.
#[actix_rt::test]
async fn a_full_queue_sheds_the_least_important_for_a_more_important_task() {
    tokio::time::pause();
    let (queue, _seen) = start(
        r#"{"services":[{"name":"svc","timeout":"60s","queue":{"capacity":2},
            "endpoints":[{"address":"http://127.0.0.1:9/"}]}]}"#,
    );
    let task = |p: Priority| Task::get("svc", "/").priority(p);
    let mut s1 = submit(&queue, task(Priority::Sheddable), 1);
    let mut s2 = submit(&queue, task(Priority::Sheddable), 2);
    let mut c1 = submit(&queue, task(Priority::Critical), 3);
    let mut d1 = submit(&queue, task(Priority::Default), 4);
    let mut s3 = submit(&queue, task(Priority::Sheddable), 5);
    let mut c2 = submit(&queue, task(Priority::Critical), 6);
    let mut c3 = submit(&queue, task(Priority::Critical), 7);
    settle().await;
    let got: String = [
        &mut s1, &mut s2, &mut c1, &mut d1, &mut s3, &mut c2, &mut c3,
    ]
    .into_iter()
    .map(answered)
    .collect();
    // c1 displaces s1, d1 displaces s2, s3 finds no room, c2 displaces d1,
    // c3 finds only critical tasks.
    assert_eq!(got, "OO-OF-F");
    let stats = queue.addr.send(GetQueueStats).await.unwrap();
    assert_eq!(stats.shed, 3);
    assert_eq!(
        (stats.shed_by_class.sheddable, stats.shed_by_class.default),
        (2, 1)
    );
    assert_eq!(stats.queued, 2);
}

/// While a less important class is being shed, a critical task that waits
/// past the target is kept: its bound is the interval, so the flood of
/// sheddable tasks does not get it shed, and a pile-up is still bounded.
#[actix_rt::test]
async fn a_critical_task_is_shed_only_past_the_interval_while_sheddable_ones_go() {
    tokio::time::pause();
    let (queue, _seen) = start(ONE_NODE_DELAY);
    let (_d, got) = overload(&queue, 2).await;
    assert_eq!(got, "-O", "overloaded: the standing task is shed");
    let mut c = submit(
        &queue,
        Task::get("svc", "/c").priority(Priority::Critical),
        10,
    );
    let mut s = submit(
        &queue,
        Task::get("svc", "/s").priority(Priority::Sheddable),
        11,
    );
    settle().await;
    assert_eq!(
        answered(&mut s),
        'O',
        "refused at intake, behind the critical task"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    settle().await;
    assert_eq!(
        answered(&mut c),
        '-',
        "past the target, within the interval"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    settle().await;
    assert_eq!(answered(&mut c), 'O', "past the interval");
    let stats = queue.addr.send(GetQueueStats).await.unwrap();
    assert_eq!(
        (stats.shed_by_class.critical, stats.shed_by_class.sheddable),
        (1, 1)
    );
}

/// Under overload, a task that waits in a short queue (no more than its
/// class is sent in half a target) waits for the next send past the
/// target: it is shed only past the interval. Sends come in bursts, and
/// shedding it at the target would refuse it late, after the wait.
#[actix_rt::test]
async fn a_task_in_a_short_queue_is_shed_only_past_the_interval() {
    tokio::time::pause();
    let (queue, seen) = start(ONE_NODE_DELAY);
    let (_d, got) = overload(&queue, 3).await;
    assert_eq!(got, "-OO", "overloaded, one send per interval");
    let mut a = submit(&queue, Task::get("svc", "/a"), 10);
    settle().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    settle().await;
    assert_eq!(answered(&mut a), '-', "past the target, in a short queue");
    let out = seen.lock().unwrap().routes[0].0;
    queue.news(done(out, 0, false, 200));
    settle().await;
    assert_eq!(
        seen.lock().unwrap().routes.len(),
        2,
        "sent at the next turn"
    );
    let stats = queue.addr.send(GetQueueStats).await.unwrap();
    assert_eq!((stats.shed, stats.in_flight, stats.queued), (2, 1, 0));
}

/// A task whose caller left while it waited is never routed: it is
/// answered `Cancelled` when its turn comes, and the credit goes to the
/// next task.
#[actix_rt::test]
async fn a_task_abandoned_while_queued_is_never_routed() {
    tokio::time::pause();
    let (queue, seen) = start(ONE_NODE);
    let gone = submit(&queue, Task::get("svc", "/gone"), 1);
    let _kept = submit(&queue, Task::get("svc", "/kept"), 2);
    settle().await;
    gone.0.reply.abandon();
    queue.news(vec![Room::credit(1)]);
    settle().await;
    let routes = seen.lock().unwrap().routes.clone();
    assert_eq!(routes.len(), 1, "only the kept task goes");
    let stats = queue.addr.send(GetQueueStats).await.unwrap();
    assert_eq!((stats.cancelled, stats.in_flight, stats.queued), (1, 1, 0));
}

/// Room with `credit` more, of which the nodes' headroom is `reserve`.
fn room(credit: usize, reserve: usize) -> Vec<ToQueue> {
    vec![ToQueue::Room(Room {
        credit,
        reserve,
        gate: None,
        room_latency: None,
    })]
}

/// Headroom (`algo::headroom`): while critical tasks come, the credit that
/// is the nodes' headroom goes to them only, and only while no sheddable
/// task waits (else a critical task waits for credit below the free limits,
/// which it gets ahead of them); a sheddable task waits for credit beyond
/// it, and takes it again once critical tasks stop coming.
#[actix_rt::test]
async fn the_reserve_is_spent_on_the_top_class_only() {
    tokio::time::pause();
    let (queue, seen) =
        start(r#"{"services":[{"name":"svc","endpoints":[{"address":"http://127.0.0.1:9/"}]}]}"#);
    let task = |p: Priority| Task::get("svc", "/x").priority(p);
    let routes = || seen.lock().unwrap().routes.len();
    queue.news(room(1, 0));
    let _c1 = submit(&queue, task(Priority::Critical), 1);
    let _s1 = submit(&queue, task(Priority::Sheddable), 2);
    let _s2 = submit(&queue, task(Priority::Sheddable), 3);
    settle().await;
    assert_eq!(routes(), 1, "one credit: the critical task");
    // Three more, two of them headroom: one sheddable task goes.
    queue.news(room(3, 2));
    settle().await;
    assert_eq!(routes(), 2);
    // A critical task does not take the headroom while s2 waits...
    let _c2 = submit(&queue, task(Priority::Critical), 4);
    settle().await;
    assert_eq!(routes(), 2, "the critical task waits for a free worker");
    // ...but the next credit below the free limits is its, ahead of s2.
    queue.news(room(1, 2));
    settle().await;
    assert_eq!(routes(), 3);
    // The balancer says the headroom is gone: s2 goes.
    queue.news(room(0, 0));
    settle().await;
    assert_eq!(routes(), 4);
    // Nothing below waits: a critical task takes the headroom.
    queue.news(room(0, 1));
    let _c3 = submit(&queue, task(Priority::Critical), 5);
    settle().await;
    {
        let s = seen.lock().unwrap();
        // c2 (numbered after s2: numbers grow with arrival) went ahead.
        let no: Vec<u64> = s.routes.iter().map(|(seq, _)| seq.task).collect();
        assert!(
            no[0] < no[1] && no[1] < no[3] && no[3] < no[2] && no[2] < no[4],
            "{no:?}"
        );
        // Critical routes may take headroom, sheddable ones may not.
        assert_eq!(s.headroom, [true, false, true, false, true]);
    }
    // No critical task for the hold: the sheddable class is the top one.
    queue.news(room(1, 1));
    let _s3 = submit(&queue, task(Priority::Sheddable), 6);
    settle().await;
    assert_eq!(routes(), 5, "critical tasks came within the hold");
    tokio::time::advance(crate::algo::headroom::HOLD).await;
    let _s4 = submit(&queue, task(Priority::Sheddable), 7);
    settle().await;
    let s = seen.lock().unwrap();
    assert_eq!(
        s.routes.len(),
        6,
        "the reserve is the sheddable class's now"
    );
    assert!(s.headroom[5]);
}
