//! `peers`: the engine side by side with what a user would pick instead, in
//! one run, against the same 3 loopback backends (another process), at the
//! same number of requests in flight as `throughput`.
//!
//! - tower's p2c balancer with peak-EWMA load over a hyper-util client, in
//!   process, on the same thread (`tower_peer.rs`): the Rust peer;
//! - HAProxy (`leastconn`, keep-alive both sides, `haproxy.rs`) and nginx
//!   (`least_conn`, `keepalive`, `nginx.rs`), each reached by a bare awc
//!   client: the proxies;
//! - bare awc spreading the requests round robin by hand: the floor of what
//!   any client on this thread can do, for reference.
//!
//! A proxy that is not installed (and may not be installed: `--no-install-*`)
//! is left out and its targets reported as skipped.

use std::rc::Rc;
use std::time::Duration;

use serde_json::json;

use crate::backend::BackendProc;
use crate::common::{bare_client, ms};
use crate::haproxy::{self, Haproxy};
use crate::nginx::{self, Nginx};
use crate::report::{table, Report};
use crate::throughput::{charts, compare, engine, params, ratio, rows, Contender, Entry, HEADERS};
use crate::tower_peer::TowerPeer;
use crate::Cli;

const TIMEOUT: Duration = Duration::from_secs(5);

pub async fn run(cli: &Cli) -> Result<Report, String> {
    let (n, rounds, max, conc) = params(cli);
    let mut rep = Report::new(
        cli,
        "peers",
        json!({"tasks_per_run": n, "rounds": rounds, "concurrency": conc, "mode": cli.mode,
               "max_concurrent_per_node": cli.max_concurrent, "backends": 3,
               "backend_latency_ms": 0, "backend_workers": cli.backend_workers,
               "tower": "tower 0.5 balance::p2c::Balance over load::PeakEwmaDiscover \
                         (default RTT 1 ms, decay 10 s), hyper-util legacy Client + HttpConnector",
               "haproxy": "balance leastconn, http-keep-alive, http-reuse always, nbthread 1",
               "nginx": "least_conn, keepalive = concurrency, 1 worker process"}),
    );
    let haproxy_bin = haproxy::find_or_install(!cli.no_install_haproxy);
    let nginx_bin = nginx::find_or_install(!cli.no_install_nginx);
    let backend = BackendProc::spawn(3, &[0], &[], cli.backend_workers, 900)?;
    let urls = backend.urls();

    // The proxies first: a proxy that fails to start ends the scenario
    // before any engine is running.
    let mut skipped = Vec::new();
    let ha = match &haproxy_bin {
        Ok(bin) => Some(Haproxy::start(bin, &backend.ports, TIMEOUT)?),
        Err(why) => {
            eprintln!("haproxy: skipped: {why}");
            skipped.push(format!("HAProxy SKIPPED: {why}"));
            None
        }
    };
    let ngx = match &nginx_bin {
        Ok(bin) => Some(Nginx::start(bin, &backend.ports, conc, TIMEOUT)?),
        Err(why) => {
            eprintln!("nginx: skipped: {why}");
            skipped.push(format!("nginx SKIPPED: {why}"));
            None
        }
    };

    let d = engine(cli, &cli.mode, &urls, 0)?;
    let mut entries = vec![
        Entry::new(
            "bare awc, round robin by hand",
            Contender::Bare {
                client: bare_client(TIMEOUT),
                urls: Rc::new(urls.clone()),
            },
        ),
        Entry::new(
            &format!("engine ({})", cli.mode),
            Contender::Engine(d.clone()),
        ),
        Entry::new(
            "tower p2c peak-EWMA + hyper-util",
            Contender::Tower(TowerPeer::new(&urls, TIMEOUT)),
        ),
    ];
    let (engine_i, tower_i) = (1, 2);

    let ha_i = ha.as_ref().map(|h| {
        entries.push(Entry::new(
            "bare awc -> haproxy leastconn",
            Contender::Bare {
                client: bare_client(TIMEOUT),
                urls: Rc::new(vec![h.url()]),
            },
        ));
        entries.len() - 1
    });
    let ngx_i = ngx.as_ref().map(|p| {
        entries.push(Entry::new(
            "bare awc -> nginx least_conn",
            Contender::Bare {
                client: bare_client(TIMEOUT),
                urls: Rc::new(vec![p.url()]),
            },
        ));
        entries.len() - 1
    });

    if let Some(only) = &cli.only {
        // Profiling one contender: no ratios, no charts.
        entries.retain(|e| e.name.contains(only.as_str()));
        compare(&mut entries, n, conc, max, rounds).await;
        d.shutdown(Duration::from_secs(2)).await;
        rep.body = table(&HEADERS, rows(&entries));
        rep.note(format!("Only the contenders named like `{only}`."));
        return Ok(rep.finish());
    }
    compare(&mut entries, n, conc, max, rounds).await;
    charts(cli, &mut rep, &entries, 0);
    d.shutdown(Duration::from_secs(2)).await;
    drop(ngx);
    drop(ha);
    drop(backend);

    let e = &entries[engine_i];
    let le = e.lat();
    let mut over = serde_json::Map::new();
    for (k, x) in entries.iter().enumerate() {
        if k != engine_i {
            over.insert(x.name.clone(), json!(ratio(e, x)));
        }
    }

    // The Rust peer: at least its throughput, a p99 no worse.
    let t = &entries[tower_i];
    let r = ratio(e, t);
    rep.target(
        "engine throughput / tower p2c throughput",
        ">= 1.0",
        format!("{r:.3}"),
        Some(r >= 1.0),
    );
    rep.target(
        "engine p99 vs tower p2c p99",
        "no worse",
        format!("{} ms vs {} ms", ms(le.p99_ms), ms(t.lat().p99_ms)),
        Some(le.p99_ms <= t.lat().p99_ms),
    );
    // The proxies: 1.3 x their throughput.
    for (name, idx) in [("haproxy leastconn", ha_i), ("nginx least_conn", ngx_i)] {
        match idx {
            Some(k) => {
                let r = ratio(e, &entries[k]);
                rep.target(
                    format!("engine throughput / {name} throughput"),
                    ">= 1.3",
                    format!(
                        "{r:.2} (p99 {} vs {} ms)",
                        ms(le.p99_ms),
                        ms(entries[k].lat().p99_ms)
                    ),
                    Some(r >= 1.3),
                );
            }
            None => rep.target(
                format!("engine throughput / {name} throughput"),
                ">= 1.3",
                "skipped (not installed)",
                None,
            ),
        }
    }
    let r = ratio(e, &entries[0]);
    rep.target(
        "engine throughput / bare awc throughput (reference)",
        "(see throughput)",
        format!("{r:.3}"),
        None,
    );

    rep.body = table(&HEADERS, rows(&entries));
    rep.results = json!({"contenders": entries.iter().map(Entry::json).collect::<Vec<_>>(),
                         "engine_over": over});
    for s in skipped {
        rep.note(s);
    }
    rep.note(format!(
        "Closed loop, {conc} requests in flight, {n} per run, {rounds} rotating round(s); 3 backends \
         answering at once in a separate process ({} worker thread(s)). The engine, tower and the \
         bare awc clients run on one thread; HAProxy (1 thread) and nginx (1 worker) run as child \
         processes and share the machine's {} core(s) with the backends. Ratios are medians of \
         per-round ratios.",
        cli.backend_workers, rep.cores
    ));
    Ok(rep.finish())
}
