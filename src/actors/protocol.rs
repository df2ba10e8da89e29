//! Every message between the pipeline's actors, one form each.
//!
//! ```text
//!  submit ─inbox─► QueueActor ─QueueTurn─► BalancerActor ─Dispatches─► NodeActor ──► backend
//!                      ▲ ◄──BalancerTurn──┘      ▲ ◄──inbox: NodeReport──┘
//!                                                └──GetLoad (every refresh)──► NodeActor
//! ```
//!
//! Each actor keeps one outbox per destination and sends it as one
//! message when its turn ends, so the order between kinds of news is a
//! property of the message type, not of call sites:
//! - [`QueueTurn`]: the attempts the watchdog gave up on, the tasks answered
//!   with attempts still out (cancel them), then the routes, in that order
//!   (a lost attempt's slot is free before the routes look for room);
//! - [`BalancerTurn`]: what happened to the queue's tasks, credit and the
//!   gate, in the order they happened (a bounced task is back at the
//!   queue's front before the credit granted after it is spent);
//! - [`Dispatches`]: the attempts a node got in one balancer turn, in order;
//! - [`NodeReport`]: what ended at a node in one of its turns, with one load
//!   report after the last of it, through the balancer's
//!   [`inbox`](super::inbox) (nodes that finish in the same turn wake the
//!   balancer with one message between them).
//!
//! `Dispatcher::submit` pushes a [`Submit`] onto the queue's inbox. A
//! `Task` sent straight to the queue's address is handled at once, as any
//! message.
//!
//! Between pipeline actors the work flows one way (`do_send`): replies
//! travel as messages, so no actor ever awaits another and no cycle can
//! deadlock. Two asks of the balancer to its nodes are request-reply:
//! [`GetLoad`] (each refresh) and [`HealthProbe`] (each health check); the
//! balancer never waits for them inside a handler: each answer comes back as
//! a future spawned on its context, handled in a later turn. The
//! dispatcher's asks ([`GetQueueStats`], [`GetNodeStats`], [`Abort`],
//! [`PoolChange`]) are request-reply too; it awaits them, no actor does.
//!
//! The other messages: a lease's news to its node (`LeaseNews`), an
//! inbox's wake-up ([`InboxReady`]), the fault drill ([`PanicDrill`]), and
//! the shared store's answers to the balancer ([`Granted`],
//! [`NodesGranted`], [`SharedBreakers`], [`ProbeClaimed`]; the store itself
//! arrives in [`UseShared`]).

use std::sync::Arc;
use std::time::Duration;

use actix::Message;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::algo::breaker::BreakerState;
use crate::outcome::{AttemptOutcome, BodyStream};
use crate::stats::{NodeStats, QueueStats};
use crate::task::Job;
use crate::transport::HttpReply;
use crate::Rejection;

/// One dispatch round of one task inside a service's queue: the task's
/// number and the round, bumped each time the queue sends the task out. Every
/// message about an attempt carries it, so a late answer from an earlier
/// round (an attempt the watchdog already gave up on) is told apart from
/// the current one's; a hedge shares its round with the attempt it races.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Seq {
    /// The task's number in its queue.
    pub task: u64,
    /// The dispatch round.
    pub round: u32,
}

/// Stable identity of a node inside its service (survives pool changes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

/// A node's load and breaker as the node itself sees them.
#[derive(Debug, Clone)]
#[expect(
    dead_code,
    reason = "`in_flight` travels in each report; the balancer keeps its own"
)]
pub struct LoadReport {
    /// The report's number: the node bumps it on every report (and keeps
    /// counting across restarts), so the balancer never lets an older report
    /// override a newer one that overtook it.
    pub version: u64,
    /// Requests in flight at the node.
    pub in_flight: u32,
    /// Attempts finished.
    pub total: u64,
    /// Attempts that counted as node failures.
    pub errors: u64,
    /// Classic EWMA of latency, seconds.
    pub latency_ewma: f64,
    /// Latency of the last attempt.
    pub last_latency: Duration,
    /// Recent failure ratio (EWMA of 0/1).
    pub error_rate: f64,
    /// Peak-EWMA RTT, seconds (p2c cost), as of `rtt_at`.
    pub rtt: f64,
    /// When the RTT estimate last took a sample.
    pub rtt_at: tokio::time::Instant,
    /// Breaker state.
    pub breaker: BreakerState,
    /// Breaker trips so far.
    pub trips: u64,
    /// Times the actor was restarted by its supervisor.
    pub restarts: u32,
    /// The node's concurrency limit now: `max_concurrent`, or the learned
    /// limit under it (`max_concurrent: "auto"`).
    pub limit: u32,
    /// Of `limit`, what the backend serves without queueing (the learned
    /// estimate; `limit` itself when fixed): the rest is headroom for the
    /// top class (`algo::headroom`).
    pub free_limit: u32,
    /// The learned latency with nothing queued (zero when not learned).
    pub base_rtt: Duration,
    /// The last attempt that counted against the node, in words (its
    /// transport error, or its 5xx status): why its breaker opened.
    pub last_error: Option<Arc<str>>,
}

/// The queue's hold on a task: its job, and the duty to answer it once,
/// into the slot of the job's own allocation (no channel per task; see
/// `task/reply.rs`). Dropped unanswered, it closes the slot.
pub(crate) type ReplyTx = crate::task::ReplyTx;

/// A new task for the queue (from `Dispatcher::submit`, through the inbox).
pub(crate) struct Submit {
    pub task: ReplyTx,
    /// Wait for room instead of rejecting when full.
    pub wait: bool,
}

/// Whether the queue may hand out tasks, or must refuse them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Gate {
    Open,
    /// Refuse every task with this rejection, as it is.
    Reject(Rejection),
    /// Refuse every task with this rejection, its `retry_after` the time
    /// left until the instant: each refusal is worded at its own `now`, not
    /// when the gate closed (see [`Gate::until`]).
    RejectUntil(Rejection, Instant),
}

impl Gate {
    /// A gate refusing with `why` until `at`. The `retry_after` in `why` is
    /// set by [`Gate::rejection`]; it is zeroed here so that two gates
    /// closed until the same instant are equal.
    pub fn until(why: Rejection, at: Instant) -> Gate {
        Gate::RejectUntil(with_retry_after(why, Duration::ZERO), at)
    }

    /// The rejection for a task refused at `now`, if the gate is closed.
    pub fn rejection(&self, now: Instant) -> Option<Rejection> {
        match self {
            Gate::Open => None,
            Gate::Reject(r) => Some(r.clone()),
            Gate::RejectUntil(r, at) => Some(with_retry_after(
                r.clone(),
                at.saturating_duration_since(now),
            )),
        }
    }
}

/// `why` with its `retry_after` (if it has one) set to `d`.
fn with_retry_after(mut why: Rejection, d: Duration) -> Rejection {
    match &mut why {
        Rejection::CircuitOpen { retry_after, .. }
        | Rejection::RateLimited { retry_after }
        | Rejection::Overloaded { retry_after } => *retry_after = d,
        _ => {}
    }
    why
}

/// One task for the balancer to place.
pub(crate) struct Route {
    pub seq: Seq,
    pub job: Arc<Job>,
    /// Nodes that already failed this task: used only if nothing else can take it.
    pub avoid: Vec<NodeId>,
    /// Nodes whose TLS handshake this task failed (also in `avoid`): never
    /// used again; when only they can take it, the route is refused.
    pub exclude: Vec<NodeId>,
    pub hedge: bool,
    /// The task is of the top class: it may take a node's headroom.
    pub headroom: bool,
    /// When the queue sent it: the time the balancer and node decide at.
    pub at: Instant,
    /// When the task is due, if the user stated it (a deadline or the
    /// service's SLO) and it may be shed for time: the balancer places it
    /// on a node expected to end it by then, if one with room is.
    pub due: Option<Instant>,
}

#[cfg(test)]
impl Route {
    /// A first-round route of task `task` (`GET /x` of service `svc`), sent
    /// at `at`: the tests' stand-in for what the queue sends.
    pub(crate) fn first(task: u64, at: Instant) -> Route {
        let job = crate::Task::get("svc", "/x").prepare(task, at).unwrap();
        Route {
            seq: Seq { task, round: 1 },
            job: Arc::new(job),
            avoid: Vec::new(),
            exclude: Vec::new(),
            hedge: false,
            headroom: true,
            at,
            due: None,
        }
    }
}

/// Queue to balancer: one turn of the queue, applied in field order.
#[derive(Message, Default)]
#[rtype(result = "()")]
pub(crate) struct QueueTurn {
    /// Attempts the watchdog answered `Lost` (their node died with them in
    /// flight): free the slots they held in the view.
    pub lost: Vec<Seq>,
    /// Tasks answered while an attempt was still out (a hedge's twin):
    /// cancel it at its node.
    pub cancels: Vec<Seq>,
    /// Tasks to place, in order, against the credit granted.
    pub routes: Vec<Route>,
}

impl QueueTurn {
    pub(crate) fn is_empty(&self) -> bool {
        self.lost.is_empty() && self.cancels.is_empty() && self.routes.is_empty()
    }
}

/// One attempt of one task on one node.
pub(crate) struct Dispatch {
    pub seq: Seq,
    pub job: Arc<Job>,
    /// Send even though the breaker is open (max_ejected_percent override).
    pub bypass_breaker: bool,
    pub hedge: bool,
    /// The balancer's decision time (its bucket mirror used it too).
    pub at: Instant,
}

/// Balancer to node: the attempts placed there in one turn of the
/// balancer, in order (one message however many).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Dispatches(pub Batch<Dispatch>);

/// The items of one message, in order: one held inline, or several in a
/// list. In a large pool most turns place one task per node, and a batch of
/// one then costs no allocation (the sender's list keeps its room).
pub(crate) enum Batch<T> {
    One(T),
    Many(Vec<T>),
}

impl<T> Batch<T> {
    /// Takes every item of `list` (which keeps its room when it held one).
    pub(crate) fn take(list: &mut Vec<T>) -> Batch<T> {
        if list.len() == 1 {
            if let Some(one) = list.pop() {
                return Batch::One(one);
            }
        }
        Batch::Many(std::mem::take(list))
    }
}

impl<T> From<Vec<T>> for Batch<T> {
    fn from(list: Vec<T>) -> Self {
        Batch::Many(list)
    }
}

impl<T> IntoIterator for Batch<T> {
    type Item = T;
    type IntoIter = BatchIter<T>;

    fn into_iter(self) -> BatchIter<T> {
        match self {
            Batch::One(one) => BatchIter::One(Some(one)),
            Batch::Many(list) => BatchIter::Many(list.into_iter()),
        }
    }
}

/// The items of a [`Batch`], in order.
pub(crate) enum BatchIter<T> {
    One(Option<T>),
    Many(std::vec::IntoIter<T>),
}

impl<T> Iterator for BatchIter<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        match self {
            BatchIter::One(one) => one.take(),
            BatchIter::Many(list) => list.next(),
        }
    }
}

/// Balancer to node: everything but attempts and load questions.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) enum NodeControl {
    /// Drop the attempt of task `seq` (a hedged twin answered first).
    Cancel(Seq),
    /// Stop, so that the supervisor restarts the actor (fault drills).
    Crash,
    /// Panic inside the handler, as a bug in the node would (a fault drill):
    /// the panic is caught and the supervisor restarts the node.
    Panic,
    /// The endpoint's `max_concurrent` changed.
    SetMaxConcurrent(u32),
    /// The shared breaker (several instances) holds the node open until
    /// then: the more severe of this and the local breaker admits.
    SharedOpen(Option<Instant>),
}

/// What one attempt gave, as the queue needs it.
pub(crate) struct AttemptReport {
    pub outcome: AttemptOutcome,
    pub latency: Duration,
    pub reply: Option<HttpReply>,
    pub retry_after: Option<Duration>,
    /// A failed attempt's error in words (the transport's detail).
    pub detail: Option<Arc<str>>,
    /// A streamed answer's body ([`crate::Task::stream`]): the attempt still
    /// holds its node's slot until the body ends
    /// ([`NodeReport::streams_ended`]).
    pub stream: Option<BodyStream>,
}

/// One attempt that ended.
pub(crate) struct AttemptEnded {
    pub seq: Seq,
    pub hedge: bool,
    pub report: AttemptReport,
}

/// Node to balancer (through the balancer's inbox): what ended at the node
/// in one of its turns, with one load report after the last of it.
pub(crate) struct NodeReport {
    pub node: NodeId,
    /// Attempts that ended (a streamed answer's head too: its slot stays
    /// taken until its body ends).
    pub done: Vec<AttemptEnded>,
    /// Dispatches the node refused (the balancer's view was stale): no
    /// attempt was made, the tasks go back to the queue's front.
    pub refused: Vec<(Seq, bool)>,
    /// Of `done`, the leases handed out ([`crate::Dispatcher::lease`]):
    /// their tasks are answered, their slots stay taken until the leases
    /// are returned (counted in `streams_ended` then).
    pub leased: u32,
    /// Of `done`, the attempts cut (their task's deadline, a hedged twin's
    /// answer) while their backend still works: their
    /// slots stay taken until it answers (counted in `streams_ended` then).
    pub held: u32,
    /// Streamed bodies that ended (read whole, broken, over the limit, or
    /// dropped by their reader), leases returned and cut attempts' backends
    /// done: the slots they held are free.
    pub streams_ended: u32,
    pub load: LoadReport,
    /// When it ended (the node reads the clock once per turn).
    pub at: Instant,
}

/// Balancer to queue: one turn of the balancer, in the order it happened.
#[derive(Message, Default)]
#[rtype(result = "()")]
pub(crate) struct BalancerTurn(pub Vec<ToQueue>);

/// One piece of news of a [`BalancerTurn`].
pub(crate) enum ToQueue {
    /// Attempts of one node ended, passed on as the node reported them
    /// (the list is not copied on the way).
    Ended(NodeAnswers),
    /// No attempt was made; the task goes back to the queue's front, or,
    /// when `refused` (only nodes in the route's `exclude` could take it),
    /// fails with its last failure instead of waiting.
    Bounce {
        seq: Seq,
        hedge: bool,
        refused: bool,
    },
    /// A hedge was placed: the nodes now working on the task (sent for
    /// hedges only, so that the attempt that loses the race can still be
    /// listed in the task's result).
    Placed(Placed),
    /// What the queue may send now.
    Room(Room),
}

/// Balancer to queue: what the queue may send now, in one type: `credit`
/// more tasks (the nodes' room, capped by the service's tokens), how much
/// of the room is headroom, then the service's gate when it changed (the
/// balancer judges all at once; the queue takes the credit and reserve,
/// then the gate, then pumps once for the turn).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Room {
    pub credit: usize,
    /// Of the room the nodes have now, the headroom: only top-class tasks
    /// may take it (`algo::headroom`). A level, not an increment.
    pub reserve: usize,
    pub gate: Option<Gate>,
    /// What an attempt is expected to take on the quickest node with room
    /// ([`NodeSet::room_latency`](crate::actors::nodeset::NodeSet::room_latency));
    /// `None` when a node with room is idle or it is not known. A task with
    /// less time left waits for a quicker room.
    pub room_latency: Option<Duration>,
}

#[cfg(test)]
impl Room {
    /// Credit alone.
    pub(crate) fn credit(n: usize) -> ToQueue {
        ToQueue::Room(Room {
            credit: n,
            reserve: 0,
            gate: None,
            room_latency: None,
        })
    }
}

/// The attempts of one node that ended in one of its turns.
pub(crate) struct NodeAnswers {
    pub node: NodeId,
    pub address: Arc<str>,
    /// When they ended.
    pub at: Instant,
    pub done: Vec<AttemptEnded>,
}

/// Balancer to queue: where the attempts of a hedged round went.
pub(crate) struct Placed {
    pub seq: Seq,
    /// The first attempt's node.
    pub first: Arc<str>,
    /// The hedge's node.
    pub hedge: Arc<str>,
}

/// Request-reply, balancer to node: its load report.
#[derive(Message)]
#[rtype(result = "LoadReport")]
pub(crate) struct GetLoad;

/// Request-reply, dispatcher to queue: its counters.
#[derive(Message)]
#[rtype(result = "QueueStats")]
pub(crate) struct GetQueueStats;

/// Request-reply, dispatcher to balancer: its view of every node.
#[derive(Message)]
#[rtype(result = "Vec<NodeStats>")]
pub(crate) struct GetNodeStats;

/// Resolve `reply` once the queue holds no task and none is in flight.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Drain {
    pub reply: oneshot::Sender<()>,
}

/// Stop taking tasks: every later submit is rejected `ShuttingDown`.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct CloseIntake;

/// Request-reply, dispatcher to queue: answer every remaining task
/// `ShuttingDown` and return them.
#[derive(Message)]
#[rtype(result = "Vec<crate::task::Unfinished>")]
pub(crate) struct Abort;

/// Stop the actor (and, for the queue and balancer, what they own).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Stop;

/// The dispatcher found the service's pipeline dead (its balancer or queue
/// stopped): answer every task with this reason and stop.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct PipelineDown(pub &'static str);

/// Request-reply, dispatcher to balancer: a change to the pool of
/// endpoints. Answers what a reload changed (empty for the other changes).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<crate::pool::ReloadSummary, crate::pool::PoolError>")]
pub(crate) enum PoolChange {
    /// Adds an endpoint (it starts with slow start, if configured).
    Add(crate::config::EndpointConfig),
    /// Removes an endpoint: it drains, then leaves.
    Remove(String),
    /// Changes an endpoint's weight (clamped to 1..=100).
    SetWeight { address: String, weight: i64 },
    /// Marks an endpoint active (takes traffic) or inactive.
    SetActive { address: String, active: bool },
    /// Replaces the endpoint list, diffed by address.
    Reload(Vec<crate::config::EndpointConfig>),
    /// Stops one node's actor as a fault drill (its supervisor restarts it).
    CrashNode(String),
    /// Makes one node's actor panic as a fault drill (it is restarted).
    PanicNode(String),
}

/// Request-reply, balancer to node: GET `path` under `timeout`; answers
/// whether it gave 2xx/3xx.
#[derive(Message)]
#[rtype(result = "bool")]
pub(crate) struct HealthProbe {
    pub path: String,
    pub timeout: Duration,
}

/// A lease to the node that lent it: an outcome, or the lease returned.
/// The type is the lease's (`crate::lease`), so that the lease names no
/// actor; its message form is here.
impl Message for crate::lease::LeaseNews {
    type Result = ();
}

/// The actor has items in its [`inbox`](super::inbox).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct InboxReady;

/// Dispatcher to queue or balancer: panic inside the handler (a fault
/// drill, see [`super::drill`]).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct PanicDrill;

/// Tokens taken from shared buckets for one ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// Tokens granted (`0..=want`).
    pub granted: u32,
    /// How long until the asked-for tokens are there again (zero: now);
    /// asking before then gets less.
    pub due: Duration,
}

/// The shared state of one node's breaker, as read at a refresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
// Only a store builds it, and the one store is behind the feature.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) enum SharedState {
    Closed,
    /// Open for this much longer.
    Open(Duration),
    /// Open time over, no probe has succeeded yet.
    HalfOpen,
}

/// Store to balancer: tokens taken for its service (or the store down).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub(crate) struct Granted {
    /// `None`: the store did not answer within its timeout.
    pub taken: Option<Grant>,
    /// When the call was sent.
    pub asked: Instant,
}

/// Store to balancer: tokens taken for its nodes (each with the service's,
/// when that is shared too), or the store down.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub(crate) struct NodesGranted {
    /// The nodes asked for, with the tokens wanted, in the call's order.
    pub asks: Vec<(Arc<str>, u32)>,
    /// `None`: the store did not answer within its timeout.
    pub got: Option<Vec<Grant>>,
    /// When the call was sent.
    pub asked: Instant,
}

/// Store to balancer: the shared breakers of its nodes.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub(crate) struct SharedBreakers(pub Vec<(Arc<str>, SharedState)>);

/// Store to balancer: whether it holds the probe claim of `node`.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub(crate) struct ProbeClaimed {
    pub node: Arc<str>,
    pub won: bool,
}

/// Dispatcher to balancer: the instance's shared store (any type that is
/// one: the store's traits live with the store, in `share`).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct UseShared<S>(pub Arc<S>);

/// Store to queue: tokens of one tenant's shared bucket (or the store
/// down).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub(crate) struct TenantGranted {
    /// The tenant and its flow when asked (a flow handed to another tenant
    /// since drops the answer).
    pub tenant: Arc<str>,
    pub flow: u16,
    /// Tokens granted and when the next are due; `None`: the store did not
    /// answer within its timeout.
    pub got: Option<(u32, Duration)>,
    /// Live instances, as the store last counted them.
    pub live: u64,
    /// When the call was sent.
    pub asked: Instant,
}

/// Dispatcher to queue: the store its tenants' rates are shared through
/// (a `dyn TenantStore`: the trait lives with the store, in `share`).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct UseTenantStore<S: ?Sized>(pub Arc<S>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_keeps_its_order_and_a_batch_of_one_leaves_the_list_its_room() {
        let mut list = Vec::with_capacity(8);
        list.push(1);
        let one = Batch::take(&mut list);
        assert!(matches!(one, Batch::One(1)));
        assert_eq!(one.into_iter().collect::<Vec<_>>(), vec![1]);
        assert!(list.is_empty());
        assert_eq!(list.capacity(), 8);

        list.extend([1, 2, 3]);
        let many = Batch::take(&mut list);
        assert_eq!(many.into_iter().collect::<Vec<_>>(), vec![1, 2, 3]);
        assert!(list.is_empty());

        let none: Batch<u8> = Batch::take(&mut Vec::new());
        assert_eq!(none.into_iter().count(), 0);
        let from: Batch<u8> = vec![4, 5].into();
        assert_eq!(from.into_iter().collect::<Vec<_>>(), vec![4, 5]);
    }

    #[test]
    fn a_gate_closed_until_an_instant_words_each_refusal_at_its_own_time() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let open = Rejection::circuit_open(ms(2000), Some("status 500".into()));
        let gate = Gate::until(open, t0 + ms(2000));
        assert_eq!(
            gate.rejection(t0 + ms(1920)),
            Some(Rejection::circuit_open(ms(80), Some("status 500".into())))
        );
        assert_eq!(
            gate.rejection(t0),
            Some(Rejection::circuit_open(ms(2000), Some("status 500".into())))
        );
        assert_eq!(
            gate.rejection(t0 + ms(2500)),
            Some(Rejection::circuit_open(
                Duration::ZERO,
                Some("status 500".into())
            ))
        );
        // Closed until the same instant whenever it was worked out: equal,
        // so the balancer does not send it again.
        assert_eq!(
            gate,
            Gate::until(
                Rejection::circuit_open(ms(5), Some("status 500".into())),
                t0 + ms(2000)
            )
        );
        assert_ne!(
            gate,
            Gate::until(Rejection::circuit_open(ms(5), None), t0 + ms(2000))
        );
        assert_ne!(
            gate,
            Gate::until(
                Rejection::circuit_open(ms(5), Some("status 500".into())),
                t0 + ms(2001)
            )
        );
        let limited = Gate::until(Rejection::rate_limited(ms(50)), t0 + ms(30));
        assert_eq!(
            limited.rejection(t0 + ms(10)),
            Some(Rejection::rate_limited(ms(20)))
        );
        assert_eq!(
            Gate::Reject(Rejection::QueueFull).rejection(t0 + ms(10)),
            Some(Rejection::QueueFull)
        );
        assert_eq!(Gate::Open.rejection(t0), None);
    }
}
