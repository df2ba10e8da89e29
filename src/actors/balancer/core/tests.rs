//! The placement core alone, with no actix runtime: node actors are
//! unstarted mailboxes (their addresses are only handles here), every
//! input comes with its `now`, and each test reads the core's output.

use std::cell::RefCell;
use std::rc::Rc;

use actix::{AsyncContext, Context};

use super::*;
use crate::actors::protocol::{AttemptEnded, AttemptReport, NodeReport, QueueTurn};
use crate::config::Config;
use crate::outcome::AttemptOutcome;

/// A core for the one service of `json`, and the addresses of its nodes
/// in the order they were started.
fn core(json: &str, now: Instant) -> (Placement, Vec<Addr<NodeActor>>) {
    let cfg = Arc::new(Config::from_json(json).unwrap().services.remove(0));
    let mailboxes: Rc<RefCell<Vec<Context<NodeActor>>>> = Rc::default();
    let kept = mailboxes.clone();
    let spawner: Spawner = Box::new(move |_, _, _| {
        let ctx = Context::<NodeActor>::new();
        let addr = ctx.address();
        kept.borrow_mut().push(ctx);
        addr
    });
    let core = Placement::new(cfg, spawner, Default::default(), now);
    let addrs = mailboxes.borrow().iter().map(|c| c.address()).collect();
    // The unstarted mailboxes live as long as the core's spawner.
    (core, addrs)
}

/// The output in words: the news for the queue, and each node's
/// dispatches (by the node's index and the tasks' numbers).
fn said(core: &mut Placement, nodes: &[Addr<NodeActor>]) -> Vec<String> {
    let node = |a: &Addr<NodeActor>| nodes.iter().position(|n| n == a).unwrap();
    let mut said = Vec::new();
    for e in core.take_output().effects {
        match e {
            Effect::FlushAtTurnEnd => said.push("flush at turn end".to_owned()),
            Effect::WakeAt(_) => said.push("wake".to_owned()),
            Effect::SharedTurn => said.push("shared turn".to_owned()),
            Effect::Replay(r) => said.push(format!("replay {}", r.seq.task)),
            Effect::Store(_) => said.push("store call".to_owned()),
            Effect::Control(a, _) => said.push(format!("control node {}", node(&a))),
            Effect::Dispatches(a, d) => {
                let tasks: Vec<u64> = d.0.into_iter().map(|d| d.seq.task).collect();
                said.push(format!("node {}: {tasks:?}", node(&a)));
            }
            Effect::ToQueue(turn) => {
                for news in turn.0 {
                    said.push(match news {
                        ToQueue::Room(r) => format!(
                            "room credit {} reserve {} gate {}",
                            r.credit,
                            r.reserve,
                            r.gate.is_some()
                        ),
                        ToQueue::Bounce { seq, .. } => format!("bounce {}", seq.task),
                        ToQueue::Ended(a) => format!("ended {} on node {}", a.done.len(), a.node.0),
                        ToQueue::Placed(p) => format!("placed {}", p.seq.task),
                    });
                }
            }
        }
    }
    said
}

fn routes(routes: Vec<Route>) -> QueueTurn {
    QueueTurn {
        routes,
        ..Default::default()
    }
}

fn in_flight(core: &Placement, now: Instant) -> Vec<u32> {
    core.node_stats(now).iter().map(|n| n.in_flight).collect()
}

/// Node `node`'s report: attempt `task` answered 200, nothing in flight after.
fn answered(node: u32, task: u64, at: Instant) -> NodeReport {
    NodeReport {
        node: NodeId(node),
        done: vec![AttemptEnded {
            seq: Seq { task, round: 1 },
            hedge: false,
            report: AttemptReport {
                outcome: AttemptOutcome::Status(200),
                latency: Duration::from_millis(20),
                reply: None,
                retry_after: None,
                detail: None,
                stream: None,
            },
        }],
        refused: Vec::new(),
        leased: 0,
        held: 0,
        streams_ended: 0,
        load: LoadReport {
            version: 1,
            in_flight: 0,
            total: 1,
            errors: 0,
            latency_ewma: 0.02,
            last_latency: Duration::from_millis(20),
            error_rate: 0.0,
            rtt: 0.02,
            rtt_at: at,
            breaker: crate::algo::breaker::BreakerState::Closed,
            trips: 0,
            restarts: 0,
            last_error: None,
            limit: 1,
            free_limit: 1,
            base_rtt: Duration::ZERO,
        },
        at,
    }
}

#[test]
fn a_route_goes_to_the_least_loaded_node_and_spends_its_credit() {
    let t0 = Instant::now();
    let (mut b, nodes) = core(
        r#"{"services":[{"name":"svc","mode":"least_load","endpoints":[
            {"address":"http://127.0.0.1:9/a/","max_concurrent":2},
            {"address":"http://127.0.0.1:9/b/","max_concurrent":2}]}]}"#,
        t0,
    );
    b.on_wake(t0);
    assert_eq!(
        said(&mut b, &nodes),
        vec!["flush at turn end"],
        "the credit waits for the turn's end"
    );
    b.flush();
    assert_eq!(
        said(&mut b, &nodes),
        vec!["room credit 4 reserve 0 gate false"]
    );
    assert_eq!(b.credit.in_hand(), 4, "every slot granted");

    // Node 0 takes task 1; the next route goes to node 1, now the least
    // loaded, and each spends one credit.
    b.on_queue_turn(routes(vec![Route::first(1, t0)]), t0);
    b.on_queue_turn(routes(vec![Route::first(2, t0)]), t0);
    b.flush();
    let placed = said(&mut b, &nodes);
    assert_eq!(placed[0], "flush at turn end");
    let mut placed = placed[1..].to_vec();
    placed.sort();
    assert_eq!(placed, vec!["node 0: [1]", "node 1: [2]"]);
    assert_eq!(in_flight(&b, t0), vec![1, 1]);
    assert_eq!(b.credit.in_hand(), 2, "two routes, two credits spent");
}

#[test]
fn a_completion_frees_its_slot_and_grants_its_credit_once() {
    let t0 = Instant::now();
    let (mut b, nodes) = core(
        r#"{"services":[{"name":"svc","endpoints":[
            {"address":"http://127.0.0.1:9/","max_concurrent":1}]}]}"#,
        t0,
    );
    b.on_wake(t0);
    b.flush();
    assert_eq!(
        said(&mut b, &nodes),
        vec!["flush at turn end", "room credit 1 reserve 0 gate false"]
    );
    b.on_queue_turn(routes(vec![Route::first(1, t0)]), t0);
    b.flush();
    assert_eq!(
        said(&mut b, &nodes),
        vec!["flush at turn end", "node 0: [1]"]
    );
    assert_eq!((in_flight(&b, t0), b.credit.in_hand()), (vec![1], 0));

    // The answer comes back: the slot is free, the queue hears of the
    // answer and of one credit, in one message.
    let t1 = t0 + Duration::from_millis(20);
    b.on_reports(&mut vec![answered(0, 1, t1)]);
    b.flush();
    assert_eq!(
        said(&mut b, &nodes),
        vec![
            "flush at turn end",
            "ended 1 on node 0",
            "room credit 1 reserve 0 gate false"
        ]
    );
    assert_eq!((in_flight(&b, t1), b.credit.in_hand()), (vec![0], 1));

    // Nothing more to grant: a settle with no change says nothing.
    b.on_wake(t1);
    b.flush();
    assert_eq!(said(&mut b, &nodes), Vec::<String>::new());
}

/// A route with a due time goes to a node expected to end it by then
/// (never one the task avoids), or back to the queue when no node with
/// room can.
#[test]
fn a_route_with_a_due_time_goes_where_it_ends_in_time_but_not_where_it_failed() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let (mut b, nodes) = core(
        r#"{"services":[{"name":"svc","mode":"least_load","endpoints":[
            {"address":"http://127.0.0.1:9/a/","max_concurrent":4},
            {"address":"http://127.0.0.1:9/b/","max_concurrent":4}]}]}"#,
        t0,
    );
    b.on_wake(t0);
    b.flush();
    // One attempt on each node; node 0 answers in 60 ms, node 1 in 10.
    b.on_queue_turn(routes(vec![Route::first(1, t0), Route::first(2, t0)]), t0);
    b.nodes.node_mut(0).load.latency_ewma = 0.060;
    b.nodes.node_mut(1).load.latency_ewma = 0.010;
    b.flush();
    said(&mut b, &nodes);
    let due = |task: u64, left: Duration, avoid: Vec<NodeId>| Route {
        due: Some(t0 + left),
        avoid,
        ..Route::first(task, t0)
    };
    // Due in 30 ms: node 0 (60 ms) cannot end it in time, so both go to
    // node 1, though least load alone would send the second (at least) to
    // node 0.
    for task in [3, 4] {
        b.on_queue_turn(routes(vec![due(task, ms(30), vec![])]), t0);
    }
    b.flush();
    let placed: Vec<String> = said(&mut b, &nodes)
        .into_iter()
        .filter(|s| s.starts_with("node"))
        .collect();
    assert_eq!(placed, vec!["node 1: [3, 4]"]);
    assert_eq!(in_flight(&b, t0), vec![1, 3]);
    // A retry that failed on node 1: not moved there; the pick stands.
    let id1 = b.nodes.node(1).id;
    b.on_queue_turn(routes(vec![due(5, ms(30), vec![id1])]), t0);
    b.flush();
    assert!(said(&mut b, &nodes).contains(&"node 0: [5]".to_owned()));
    // Due in 5 ms: no node with room ends it in time; back to the queue.
    b.on_queue_turn(routes(vec![due(6, ms(5), vec![])]), t0);
    b.flush();
    assert!(said(&mut b, &nodes).contains(&"bounce 6".to_owned()));
    assert_eq!(in_flight(&b, t0), vec![2, 3], "nothing placed for task 6");
}
