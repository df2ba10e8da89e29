//! Open-loop clients shared by the real-socket overload runs
//! (`tests/overload.rs`, `tests/tenants.rs`) and their paused-clock twins
//! (`tests/overload_paused.rs`, which includes this file by path): the
//! same offered load on either clock.

use std::collections::BTreeMap;
use std::time::Duration;

use actix_dispatch::{Dispatcher, Task, TaskResult};

/// Offers `per_tick` tasks every 10 ms for `ticks` ticks, each built by
/// `task`, without waiting for answers (open loop); returns every result.
pub async fn open_loop(
    d: &Dispatcher,
    ticks: usize,
    per_tick: usize,
    task: impl Fn(usize) -> Task,
) -> Vec<TaskResult> {
    let mut pending = Vec::with_capacity(ticks * per_tick);
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    for t in 0..ticks {
        tick.tick().await;
        for i in 0..per_tick {
            pending.push(actix_rt::spawn(d.submit(task(t * per_tick + i))));
        }
    }
    let mut results = Vec::with_capacity(pending.len());
    for p in pending {
        results.push(p.await.expect("the submit task ran"));
    }
    results
}

/// A noisy tenant offering 3 tasks every 10 ms beside four quiet ones
/// offering one each every 50 ms, for `ticks` ticks, every task (of service `svc`)
/// due in `deadline`: `(offered, succeeded in time)` per tenant.
pub async fn noisy_and_quiet(
    d: &Dispatcher,
    ticks: usize,
    deadline: Duration,
) -> BTreeMap<String, (u32, u32)> {
    let mut pending = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    for t in 0..ticks {
        tick.tick().await;
        let mut send = |tenant: String| {
            let task = Task::get("svc", format!("/{tenant}/{t}"))
                .tenant(tenant.clone())
                .deadline_in(deadline);
            pending.push((tenant, actix_rt::spawn(d.submit(task))));
        };
        for _ in 0..3 {
            send("noisy".into());
        }
        if t % 5 == 0 {
            for q in 0..4 {
                send(format!("quiet{q}"));
            }
        }
    }
    let mut ok = BTreeMap::<String, (u32, u32)>::new();
    for (tenant, p) in pending {
        let r = p.await.expect("the submit task ran");
        let e = ok.entry(tenant).or_default();
        e.0 += 1;
        if r.is_success() && r.total <= deadline {
            e.1 += 1;
        }
    }
    ok
}
