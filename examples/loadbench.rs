//! Load benchmarks of the dispatch engine.
//!
//! ```text
//! cargo run --release --example loadbench -- <scenario> [options]
//! ```
//!
//! Scenarios: `overhead`, `throughput`, `nginx`, `peers`, `slow-node`, `memory`, `soak`, `all`
//! (every one of those), `overload` (open loop past the capacity of
//! fixed-capacity backends: goodput, against tower and HAProxy; then
//! workloads with deadlines: noisy service times, servers of different
//! sizes, a capacity change, bursts), `gateway`
//! (the `web` gateway against nginx under wrk; needs `--features web`), `sim`
//! (the overload scenario matrix in the deterministic simulator of
//! `tests/sim`, beside its oracle: `sim.md`), `tenants`
//! (fair shares between tenants, beside the same load naming none), and `micro`
//! (turns the criterion estimates of
//! `cargo bench --features internals --bench algo` into a table). `--smoke`
//! shrinks everything to a few hundred tasks and a second or two. Results go
//! to `bench/results/<scenario>.json` and `bench/results/latest.md` (smoke runs
//! write next to the binary instead, so they never overwrite real numbers).
//!
//! The HTTP backends run in a separate process: this same binary started
//! again with the hidden `backend` scenario, so the client and the servers
//! never share an event loop. See `bench/README.md` for the methodology.

#[path = "loadbench/backend.rs"]
mod backend;
#[path = "loadbench/charts.rs"]
mod charts;
#[path = "loadbench/cluster.rs"]
mod cluster;
#[path = "loadbench/common.rs"]
mod common;
#[path = "loadbench/gateway.rs"]
mod gateway;
#[path = "loadbench/haproxy.rs"]
mod haproxy;
#[path = "loadbench/immediate.rs"]
mod immediate;
#[path = "loadbench/memory.rs"]
mod memory;
#[path = "loadbench/micro.rs"]
mod micro;
#[path = "loadbench/nginx.rs"]
mod nginx;
#[path = "loadbench/overhead.rs"]
mod overhead;
#[path = "loadbench/overload.rs"]
mod overload;
#[path = "loadbench/peers.rs"]
mod peers;
#[path = "loadbench/report.rs"]
mod report;
// The deterministic simulator of the tests, shared with `sim` below.
#[path = "../tests/sim/mod.rs"]
mod sim;
#[path = "loadbench/sim.rs"]
mod simulate;
#[path = "loadbench/slow_node.rs"]
mod slow_node;
#[path = "loadbench/soak.rs"]
mod soak;
#[path = "loadbench/tenants.rs"]
mod tenants;
#[path = "loadbench/throughput.rs"]
mod throughput;
#[path = "loadbench/tower_peer.rs"]
mod tower_peer;
#[path = "loadbench/workloads.rs"]
mod workloads;

use clap::{Parser, ValueEnum};

/// Which benchmark to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Engine cost per task with an in-process transport, against bare actix round trips.
    Overhead,
    /// Engine against a bare awc client, 3 backends in another process, closed loop.
    Throughput,
    /// Engine against nginx (least_conn, keepalive) in front of the same backends.
    Nginx,
    /// Engine, tower p2c (peak EWMA, hyper-util), HAProxy leastconn and nginx on the same backends.
    Peers,
    /// Open loop, 6 backends at 20 ms, one at 500 ms for the middle third: every mode and nginx.
    SlowNode,
    /// Resident memory with 100 000 queued tasks and with 1000 nodes; cost per task vs pool size.
    Memory,
    /// 1 M tasks with 1 h deadlines through hanging and failing nodes, RSS at each quarter.
    Soak,
    /// Every scenario above, in order.
    All,
    /// The `web` gateway against nginx as reverse proxies, loaded by wrk (needs `--features web`).
    Gateway,
    /// Open loop at 0.5x to 4x the capacity of fixed-capacity backends, then noisy, mixed-size,
    /// changing and bursty workloads with deadlines: goodput, vs tower and HAProxy.
    Overload,
    /// The overload scenario matrix in the deterministic simulator (paused clock), beside its oracle.
    Sim,
    /// Fair shares between tenants: a noisy tenant among ten, weights 1:2:4, with and without tenants.
    Tenants,
    /// A service limit shared through Redis (lease, exact) against a local one (feature `redis`).
    Cluster,
    /// Tabulates the criterion results of `cargo bench --features internals --bench algo` against the targets.
    Micro,
    /// (internal) The HTTP backend process.
    #[value(hide = true)]
    Backend,
    /// (internal) The gateway process of `gateway`.
    #[value(hide = true)]
    GatewayServe,
    /// (internal) The memory measurements, in a fresh process.
    #[value(hide = true)]
    MemoryProbe,
    /// (internal) The soak run, in a fresh process.
    #[value(hide = true)]
    SoakProbe,
    /// (internal) Tasks naming no tenant, one, or each its own, for callgrind.
    #[value(hide = true)]
    TenantsProbe,
}

impl Scenario {
    /// The name used for result files.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Overhead => "overhead",
            Scenario::Throughput => "throughput",
            Scenario::Nginx => "nginx",
            Scenario::Peers => "peers",
            Scenario::SlowNode => "slow-node",
            Scenario::Memory => "memory",
            Scenario::Soak => "soak",
            Scenario::All => "all",
            Scenario::Overload => "overload",
            Scenario::Sim => "sim",
            Scenario::Tenants => "tenants",
            Scenario::Gateway => "gateway",
            Scenario::GatewayServe => "gateway-serve",
            Scenario::Cluster => "cluster",
            Scenario::Micro => "micro",
            Scenario::Backend => "backend",
            Scenario::MemoryProbe => "memory-probe",
            Scenario::SoakProbe => "soak-probe",
            Scenario::TenantsProbe => "tenants-probe",
        }
    }
}

/// Command line of `loadbench`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "loadbench",
    about = "Load benchmarks of actix-dispatch",
    after_help = "Results: bench/results/<scenario>.json and bench/results/latest.md. See bench/README.md."
)]
pub struct Cli {
    /// The scenario to run.
    #[arg(value_enum)]
    pub scenario: Scenario,

    /// Shrink everything to a few hundred tasks and about a second per run.
    #[arg(long)]
    pub smoke: bool,

    /// Tasks per measured run (closed-loop scenarios; default per scenario).
    #[arg(long)]
    pub tasks: Option<usize>,

    /// Seconds per measured run: a cap for closed loops, the length of open loops.
    #[arg(long)]
    pub duration: Option<f64>,

    /// Tasks in flight in closed loops against HTTP backends.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,

    /// Tasks in flight in the in-process runs (overhead: default sweeps 64, 256 and 1024).
    #[arg(long)]
    pub window: Option<usize>,

    /// Arrival rate of the open-loop slow-node scenario, tasks per second.
    #[arg(long, default_value_t = 400.0)]
    pub rate: f64,

    /// Nodes in the pool of the `overhead` engines.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,

    /// (overhead) arbiters of their own for the engines' node actors (0: all
    /// on the caller's thread), to measure what a second core gives.
    #[arg(long, default_value_t = 0)]
    pub node_threads: usize,

    /// Balancing mode of the engine in `throughput` and `nginx`.
    #[arg(long, default_value = "p2c")]
    pub mode: String,

    /// Alternating rounds (engine, baseline) of each closed-loop comparison.
    #[arg(long)]
    pub rounds: Option<usize>,

    /// max_concurrent of every node in the HTTP scenarios.
    #[arg(long, default_value_t = 64)]
    pub max_concurrent: u32,

    /// Worker threads of the backend process.
    #[arg(long, default_value_t = 1)]
    pub backend_workers: usize,

    /// Never run bench/install-nginx.sh; skip the nginx parts when nginx is missing.
    #[arg(long)]
    pub no_install_nginx: bool,

    /// Never run bench/install-haproxy.sh; skip the HAProxy parts when haproxy is missing.
    #[arg(long)]
    pub no_install_haproxy: bool,

    /// Never run bench/install-wrk.sh; `gateway` fails when wrk is missing.
    #[arg(long)]
    pub no_install_wrk: bool,

    /// (gateway) worker threads of the gateway, and worker processes of nginx.
    #[arg(long, default_value_t = 1)]
    pub gateway_workers: usize,

    /// (overload) load levels in order, multiples of capacity or `mixed`
    /// (0.4x critical + 1.6x sheddable); default 0.5,1,2,4,mixed,0.5; `none`
    /// runs only the workloads.
    #[arg(long)]
    pub levels: Option<String>,

    /// (sim) seeds per scenario (default 3; 1 with --smoke).
    #[arg(long)]
    pub seeds: Option<u64>,

    /// (overload) the workloads with deadlines to run after the levels: exp, bimodal, sizes,
    /// change, bursts (comma separated), or none; default all.
    #[arg(long)]
    pub workloads: Option<String>,

    /// (overload) the SLO: a success counts as goodput within this many ms.
    #[arg(long, default_value_t = 250)]
    pub slo_ms: u64,

    /// (overload) one more engine config, `NAME={service fields as JSON}`
    /// (`each_endpoint` merges into every endpoint); repeatable.
    #[arg(long)]
    pub engine_config: Vec<String>,

    /// (peers, gateway, overload) run only the contenders whose name contains this
    /// (for profiling one of them: `valgrind --tool=callgrind ... peers --only engine`).
    #[arg(long)]
    pub only: Option<String>,

    /// Where to write results (default: bench/results, or next to the binary for --smoke).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,

    // --- the backend process (hidden) ---
    /// (backend) number of servers.
    #[arg(long, hide = true, default_value_t = 3)]
    pub servers: usize,
    /// (backend) fixed latency per server in ms, comma separated (the last repeats).
    #[arg(long, hide = true, default_value = "0")]
    pub latency_ms: String,
    /// (backend) `server:ms:from_ms:to_ms`: server is that slow during [from, to) after `start`.
    #[arg(long, hide = true)]
    pub slow: Vec<String>,
    /// (backend) requests each server serves at once, the rest wait inside it (0: no limit),
    /// comma separated (the last repeats).
    #[arg(long, hide = true, default_value = "0")]
    pub capacity: String,
    /// (backend) service-time distribution around the latency: fixed, exp or bimodal, comma
    /// separated (the last repeats).
    #[arg(long, hide = true, default_value = "fixed")]
    pub service: String,
    /// (backend) seed of the service-time draws.
    #[arg(long, hide = true, default_value_t = 1)]
    pub service_seed: u64,
    /// (gateway-serve) the backends' URLs, comma separated.
    #[arg(long, hide = true, default_value = "")]
    pub upstreams: String,
    /// (backend) hard time limit in seconds.
    #[arg(long, hide = true, default_value_t = 900)]
    pub max_secs: u64,
}

fn main() {
    let cli = Cli::parse();
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = env_logger::try_init();
    }
    if cli.scenario == Scenario::Backend {
        if let Err(e) = backend::serve(&cli) {
            eprintln!("backend: {e}");
            std::process::exit(1);
        }
        return;
    }
    if cli.scenario == Scenario::GatewayServe {
        if let Err(e) = gateway::serve(&cli) {
            eprintln!("gateway-serve: {e}");
            std::process::exit(1);
        }
        return;
    }
    if cli.scenario == Scenario::MemoryProbe {
        std::process::exit(memory::probe_main(&cli));
    }
    if cli.scenario == Scenario::SoakProbe {
        std::process::exit(soak::probe_main(&cli));
    }
    if cli.scenario == Scenario::TenantsProbe {
        std::process::exit(tenants::probe_main(&cli));
    }
    let code = actix_rt::System::new().block_on(run(cli));
    std::process::exit(code);
}

/// Runs the scenario(s); the exit code is non-zero only when one crashed or
/// failed to run (a missed target is reported, not an error).
async fn run(cli: Cli) -> i32 {
    let list: Vec<Scenario> = match cli.scenario {
        Scenario::All => vec![
            Scenario::Overhead,
            Scenario::Throughput,
            Scenario::Nginx,
            Scenario::Peers,
            Scenario::SlowNode,
            Scenario::Memory,
            Scenario::Soak,
        ],
        s => vec![s],
    };
    let out = report::out_dir(&cli);
    let mut failed = Vec::new();
    for s in list {
        eprintln!("=== {} ===", s.name());
        let result = match s {
            Scenario::Overhead => overhead::run(&cli).await,
            Scenario::Throughput => throughput::run_throughput(&cli).await,
            Scenario::Nginx => throughput::run_nginx(&cli).await,
            Scenario::Peers => peers::run(&cli).await,
            Scenario::SlowNode => slow_node::run(&cli).await,
            Scenario::Memory => memory::run(&cli).await,
            Scenario::Soak => soak::run(&cli).await,
            Scenario::Micro => micro::run(&cli),
            Scenario::Overload => overload::run(&cli).await,
            Scenario::Sim => simulate::run(&cli),
            Scenario::Tenants => tenants::run(&cli).await,
            Scenario::Gateway => gateway::run(&cli).await,
            Scenario::Cluster => cluster::run(&cli).await,
            Scenario::All
            | Scenario::Backend
            | Scenario::GatewayServe
            | Scenario::MemoryProbe
            | Scenario::SoakProbe
            | Scenario::TenantsProbe => {
                unreachable!("handled in main")
            }
        };
        match result {
            Ok(rep) => {
                let saved = report::save(&out, &rep).and_then(|()| match s {
                    // Their tables are read on their own too.
                    Scenario::Sim | Scenario::Overload => report::save_markdown(&out, &rep),
                    _ => Ok(()),
                });
                if let Err(e) = saved {
                    eprintln!("{}: cannot write results: {e}", s.name());
                    failed.push(s.name());
                }
                println!("{}", rep.markdown);
            }
            Err(e) => {
                eprintln!("{}: FAILED: {e}", s.name());
                failed.push(s.name());
            }
        }
    }
    match report::write_latest(&out) {
        Ok(p) => eprintln!("results: {}", p.display()),
        Err(e) => eprintln!("cannot write latest.md: {e}"),
    }
    if failed.is_empty() {
        0
    } else {
        eprintln!("failed scenarios: {}", failed.join(", "));
        1
    }
}
