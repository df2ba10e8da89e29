//! The messages between the pipeline's actors, one type each.
//!
//! ```text
//!  submit ─inbox+Intake─► QueueActor ──Route(s)──► BalancerActor ──Dispatch──► NodeActor ──► backend
//!                            ▲  ▲ ◄──Credit/Gate──┘  ▲ ◄──────Completed──────┘
//!                            │  └──Answer (+credit)──┘ ──GetLoad (every refresh)──► NodeActor
//! ```
//!
//! `Dispatcher::submit` does not send one message per task: it pushes a
//! [`Submit`] onto the queue's inbox, and only the first submit of a burst
//! sends `Intake`; the queue takes the whole
//! inbox in that turn (see `queue/inbox.rs`). A `Task` sent straight to the
//! queue's address is handled at once, as any message.
//!
//! Between pipeline actors everything is one-way (`do_send`): replies travel
//! as messages, so no actor ever awaits another and no cycle can deadlock.

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

/// A node's load, breaker and bucket as the node itself sees them.
#[derive(Debug, Clone)]
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
    /// Tokens in the node's bucket, when it has one.
    pub tokens: Option<u32>,
    /// Times the actor was restarted by its supervisor.
    pub restarts: u32,
}

/// The queue's hold on a task: its job, and the duty to answer it once,
/// into the slot of the job's own allocation (no channel per task; see
/// `task/reply.rs`). Dropped unanswered, it closes the slot.
pub(crate) type ReplyTx = crate::task::ReplyTx;

/// A new task for the queue (from `Dispatcher::submit`, through the inbox).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Submit {
    pub task: ReplyTx,
    /// Wait for room instead of rejecting when full.
    pub wait: bool,
}

/// The balancer can place `n` more tasks.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Credit(pub usize);

/// Whether the queue may hand out tasks, or must refuse them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Gate {
    Open,
    Reject(Rejection),
}

/// The balancer's verdict on the service as a whole.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct SetGate(pub Gate);

/// One task for the balancer to place.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Route {
    pub seq: Seq,
    pub job: Arc<Job>,
    /// Nodes that already failed this task: used only if nothing else can take it.
    pub avoid: Vec<NodeId>,
    pub hedge: bool,
    /// When the queue sent it: the time the balancer and node decide at.
    pub at: Instant,
}

/// The tasks one pump of the queue hands over, in order: placed as the same
/// [`Route`]s one by one would be, with one credit pass at the end (one
/// message and one mailbox pass for the batch; a single task goes as a plain
/// [`Route`]).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Routes(pub Vec<Route>);

/// The balancer could not place the task after all: back to the queue's front.
pub(crate) struct Bounce {
    pub seq: Seq,
    pub hedge: bool,
    /// Credit granted along with it.
    pub credit: usize,
}

/// One attempt of one task on one node.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Dispatch {
    pub seq: Seq,
    pub job: Arc<Job>,
    /// Send even though the breaker is open (max_ejected_percent override).
    pub bypass_breaker: bool,
    pub hedge: bool,
    /// The balancer's decision time (its bucket mirror used it too).
    pub at: Instant,
}

/// Attempts for one node, placed in one turn of the balancer (sent when
/// the turn ends: one message however many tasks it placed there).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Dispatches(pub Vec<Dispatch>);

/// What one attempt gave, as the queue needs it.
pub(crate) struct AttemptReport {
    pub outcome: AttemptOutcome,
    pub latency: Duration,
    pub reply: Option<HttpReply>,
    pub retry_after: Option<Duration>,
    /// A streamed answer's body ([`crate::Task::stream`]): the attempt still
    /// holds its node's slot, freed by a later [`StreamEnded`].
    pub stream: Option<BodyStream>,
}

/// Node to balancer: an attempt that ended alone in its node's turn, a
/// streamed attempt's head, or a refused dispatch, with a fresh load report
/// (attempts that end together come in [`Completions`]).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Completed {
    pub node: NodeId,
    pub seq: Seq,
    pub hedge: bool,
    /// `None`: the node refused the dispatch (stale view); no attempt was made.
    pub report: Option<AttemptReport>,
    pub load: LoadReport,
    /// When the attempt ended (or was refused).
    pub at: Instant,
}

/// Node to balancer: the attempts that ended in one turn of the node
/// (usually one; several when several answers came in together), with one
/// load report after the last of them. One message, one report, however
/// many attempts.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Completions {
    pub node: NodeId,
    pub done: Vec<Ended>,
    pub load: LoadReport,
    /// When they ended (the node reads the clock once per turn).
    pub at: Instant,
}

/// One attempt of [`Completions`].
pub(crate) struct Ended {
    pub seq: Seq,
    pub hedge: bool,
    pub report: AttemptReport,
}

/// Node to balancer: the body of a streamed answer ended (read whole,
/// broken, over the limit, or dropped by its reader), so the slot its
/// attempt held since its head ([`Completed`] with a stream) is free.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct StreamEnded {
    pub node: NodeId,
    pub load: LoadReport,
    pub at: Instant,
}

/// Balancer to queue: an attempt of task `seq` ended.
pub(crate) struct AttemptDone {
    pub seq: Seq,
    pub node: NodeId,
    pub address: Arc<str>,
    pub hedge: bool,
    pub report: AttemptReport,
    /// Credit granted along with it (the slot the attempt freed).
    pub credit: usize,
    /// When the attempt ended.
    pub at: Instant,
}

/// Balancer to queue: what became of a routed task, with any new credit.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) enum Answer {
    /// An attempt ended.
    Done(AttemptDone),
    /// No attempt was made; the task goes back to the queue's front.
    Bounce(Bounce),
    /// A hedge was placed: the nodes now working on the task (sent for
    /// hedges only, so that the attempt that loses the race can still be
    /// listed in the task's result).
    Placed(Placed),
    /// Attempts of one node that ended together.
    Batch(Answers),
}

/// Balancer to queue: the answers of one turn of the balancer, in order
/// (a turn with one answer sends it as a plain [`Answer`]): whatever number
/// of nodes reported in the turn, the queue gets one message and pumps once.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct AnswerList(pub Vec<Answer>);

/// The attempts of one node that ended in one turn (two or more; a single
/// one travels as [`Answer::Done`]), passed on as the node reported them:
/// the list is not copied on the way.
pub(crate) struct Answers {
    pub node: NodeId,
    pub address: Arc<str>,
    /// Credit granted along with them (the slots they freed).
    pub credit: usize,
    /// When they ended.
    pub at: Instant,
    pub done: Vec<Ended>,
}

/// Balancer to queue: where the attempts of a hedged round went.
pub(crate) struct Placed {
    pub seq: Seq,
    /// The first attempt's node.
    pub first: Arc<str>,
    /// The hedge's node.
    pub hedge: Arc<str>,
}

/// Queue to balancer: the watchdog answered the attempt of `seq` as `Lost`
/// (its node died with it in flight); free the slot it held in the view.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct AttemptLost {
    pub seq: Seq,
}

/// Ask a node for its load report.
#[derive(Message)]
#[rtype(result = "LoadReport")]
pub(crate) struct GetLoad;

/// Ask the queue for its counters.
#[derive(Message)]
#[rtype(result = "QueueStats")]
pub(crate) struct GetQueueStats;

/// Ask the balancer for its view of every node.
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

/// Answer every remaining task `ShuttingDown` and return them.
#[derive(Message)]
#[rtype(result = "Vec<crate::dispatcher::Unfinished>")]
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

/// Make a node actor stop itself so its supervisor restarts it (fault drills).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Crash;
