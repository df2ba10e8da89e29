//! The oracle: what a proxy that knows the truth does with the same
//! arrivals and backends, as HAProxy is configured by an owner who knows
//! each backend's worker count: `maxconn` = the true workers (following
//! capacity changes as they happen), a central queue served critical first
//! then oldest first, `timeout queue` = the deadline less the mean service
//! time, least connections among the backends with a free worker. Each
//! task takes the service time the engine's run draws for it
//! ([`ServiceTime::of_task`](super::model::ServiceTime::of_task)). A
//! discrete-event simulation, exact and instant.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

use super::load::Arrival;
use super::model::BackendSpec;
use super::run::{own_service, Kind, Record};

/// Runs the oracle over `arrivals` (sorted by time).
pub fn run(
    specs: &[BackendSpec],
    arrivals: &[Arrival],
    deadline: Option<Duration>,
    seed: u64,
) -> Vec<Record> {
    let mean = specs.iter().map(|s| s.service.mean_secs()).sum::<f64>() / specs.len() as f64;
    let queue_timeout =
        deadline.map(|d| d.saturating_sub(Duration::from_secs_f64(mean)).max(d / 10));
    let mut busy = vec![0u32; specs.len()];
    // Completions: (time, backend, record index).
    let mut done: BinaryHeap<Reverse<(Duration, usize, usize)>> = BinaryHeap::new();
    let mut queues: [VecDeque<usize>; 2] = [VecDeque::new(), VecDeque::new()];
    let mut records: Vec<Record> = arrivals
        .iter()
        .enumerate()
        .map(|(i, a)| Record {
            at: a.at,
            done: a.at,
            kind: Kind::Refused,
            critical: a.critical,
            service: own_service(specs, seed, i),
        })
        .collect();
    let mut next = 0;
    loop {
        // The next event: an arrival or a completion (arrivals first at a tie).
        let t_arr = arrivals.get(next).map(|a| a.at);
        let t_done = done.peek().map(|Reverse((t, _, _))| *t);
        let now = match (t_arr, t_done) {
            (None, None) => break,
            (Some(a), Some(d)) if d < a => {
                let Reverse((t, b, _)) = done.pop().unwrap();
                busy[b] -= 1;
                t
            }
            (Some(a), _) => {
                queues[usize::from(!arrivals[next].critical)].push_back(next);
                next += 1;
                a
            }
            (None, Some(_)) => {
                let Reverse((t, b, _)) = done.pop().unwrap();
                busy[b] -= 1;
                t
            }
        };
        // Dispatch while a worker is free.
        loop {
            let free = (0..specs.len())
                .filter(|&b| busy[b] < specs[b].workers_at(now))
                .min_by(|&x, &y| {
                    let lx = f64::from(busy[x]) / f64::from(specs[x].workers_at(now));
                    let ly = f64::from(busy[y]) / f64::from(specs[y].workers_at(now));
                    lx.total_cmp(&ly)
                });
            let Some(b) = free else { break };
            let Some(i) = queues[0].pop_front().or_else(|| queues[1].pop_front()) else {
                break;
            };
            if queue_timeout.is_some_and(|q| now.saturating_sub(records[i].at) > q) {
                records[i].done = now;
                continue;
            }
            // The task's own service time, as the engine's run draws it.
            let s = specs[b].service.of_task(seed, &i.to_string(), 0);
            busy[b] += 1;
            records[i].done = now + s;
            records[i].kind = Kind::Success;
            done.push(Reverse((now + s, b, i)));
        }
    }
    records
}
