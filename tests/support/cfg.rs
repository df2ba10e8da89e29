//! Building engine configs over test backends.

use actix_dispatch::{Config, TaskResult};

use super::Backend;

/// A config of one service `svc` over `nodes` (backend, weight,
/// max_concurrent), with `extra` service fields (JSON, without braces).
pub fn config(mode: &str, nodes: &[(&Backend, u32, u32)], extra: &str) -> Config {
    let eps: Vec<String> = nodes
        .iter()
        .map(|(b, w, m)| {
            format!(
                r#"{{"address":"{}","weight":{w},"max_concurrent":{m}}}"#,
                b.url()
            )
        })
        .collect();
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"{mode}","endpoints":[{}]{}{extra}}}]}}"#,
        eps.join(","),
        if extra.is_empty() { "" } else { "," }
    );
    Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

/// The address of the node that served a successful result.
pub fn served_by(r: &TaskResult) -> String {
    r.node()
        .unwrap_or_else(|| panic!("not a success: {:?}", r.outcome))
        .to_owned()
}

/// Submits `n` GETs to `svc` at once (paths `/{tag}/{i}`) and waits for all.
pub async fn burst(d: &actix_dispatch::Dispatcher, n: usize, tag: &str) -> Vec<TaskResult> {
    let tasks = (0..n).map(|i| d.submit(actix_dispatch::Task::get("svc", format!("/{tag}/{i}"))));
    futures::future::join_all(tasks).await
}
