//! `gateway`: the engine as a reverse proxy, against nginx, driven by wrk.
//!
//! The same 3 backends (the backend process, answering at once) sit behind
//! two proxies, each in a process of its own:
//! - the `web` gateway: this binary again, as the hidden `gateway-serve`
//!   scenario, an actix-web server with `--gateway-workers` worker threads
//!   (default 1), each running its own engine (service `bench`, p2c) on its
//!   own arbiter, so a request never leaves the worker that took it; every
//!   path under `/bench/` is [`actix_dispatch::web::forward`]ed (the
//!   default service of the scope `/bench`);
//! - nginx: `least_conn`, `keepalive` 64 idle connections per worker,
//!   `worker_processes` = the gateway's workers.
//!
//! wrk (`bench/install-wrk.sh`) loads each in turn: `-t1 -c64` (one thread,
//! 64 keep-alive connections) for `--duration` seconds per round (default
//! 5), rounds alternating (`--rounds`, default 3), after a 1 s warm-up of
//! each. A small Lua script prints wrk's summary and latency percentiles.
//! The figures are wrk's: requests per second, p50 / p99 latency; ratios
//! gateway / nginx are medians of per-round ratios.
//!
//! Needs the `web` feature: `cargo run --release --features web --example
//! loadbench -- gateway`.

use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::json;

use crate::backend::BackendProc;
use crate::common::{self, count, median, ms, pick};
use crate::nginx::{self, Nginx};
use crate::report::{out_dir, table, Report};
use crate::Cli;

const TIMEOUT: Duration = Duration::from_secs(5);
/// wrk's connections (as the issue's measurement: `-t1 -c64`).
const CONNECTIONS: usize = 64;

/// Prints wrk's summary and latency percentiles (µs) in lines we parse.
const WRK_LUA: &str = r#"
done = function(summary, latency, requests)
  io.write(string.format("SUMMARY %d %d %d %d %d %d %d\n", summary.requests, summary.duration,
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.status,
    summary.errors.timeout))
  for _, p in ipairs({1,5,10,20,30,40,50,60,70,75,80,85,90,95,97,98,99,99.5,99.9,99.99,100}) do
    io.write(string.format("P %g %d\n", p, latency:percentile(p)))
  end
end
"#;

/// wrk's path, installing it first when allowed.
fn find_or_install_wrk(allow_install: bool) -> Result<PathBuf, String> {
    let find = || {
        ["/usr/bin/wrk", "/usr/local/bin/wrk"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
    };
    if let Some(p) = find() {
        return Ok(p);
    }
    if !allow_install {
        return Err("wrk is not installed (and --no-install-wrk was given)".into());
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/install-wrk.sh");
    eprintln!("wrk not found: running {}", script.display());
    let status = Command::new("timeout")
        .arg("600")
        .arg("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !status.success() {
        return Err(format!("{} failed ({status})", script.display()));
    }
    find().ok_or_else(|| "wrk still not found after installing it".into())
}

/// One wrk run.
struct WrkRun {
    rate: f64,
    requests: u64,
    errors: u64,
    /// (percentile, µs)
    percentiles: Vec<(f64, u64)>,
}

impl WrkRun {
    fn at(&self, p: f64) -> f64 {
        self.percentiles
            .iter()
            .find(|(q, _)| (*q - p).abs() < 1e-9)
            .map_or(0.0, |(_, us)| *us as f64 / 1000.0)
    }
}

fn wrk(bin: &Path, script: &Path, url: &str, secs: f64) -> Result<WrkRun, String> {
    let d = format!("{}s", secs.ceil().max(1.0) as u64);
    let out = Command::new("timeout")
        .arg(format!("{}", secs.ceil() as u64 + 30))
        .arg(bin)
        .args([
            "-t1",
            &format!("-c{CONNECTIONS}"),
            "-d",
            &d,
            "--timeout",
            "5s",
        ])
        .arg("-s")
        .arg(script)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run wrk: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut run = WrkRun {
        rate: 0.0,
        requests: 0,
        errors: 0,
        percentiles: Vec::new(),
    };
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["SUMMARY", req, dur, rest @ ..] => {
                let req: u64 = req.parse().map_err(|e| format!("wrk requests: {e}"))?;
                let dur: f64 = dur.parse().map_err(|e| format!("wrk duration: {e}"))?;
                run.requests = req;
                run.rate = req as f64 / (dur / 1e6).max(1e-9);
                run.errors = rest.iter().filter_map(|x| x.parse::<u64>().ok()).sum();
            }
            ["P", p, us] => {
                if let (Ok(p), Ok(us)) = (p.parse::<f64>(), us.parse::<u64>()) {
                    run.percentiles.push((p, us));
                }
            }
            _ => {}
        }
    }
    if run.requests == 0 {
        return Err(format!(
            "wrk measured nothing ({}): {}{}",
            out.status,
            text,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(run)
}

/// A histogram rebuilt from wrk's percentiles (for the latency chart): each
/// step between two printed percentiles counts at the upper one's value.
fn hist_of(runs: &[WrkRun]) -> Histogram<u64> {
    let mut h = common::hist();
    for r in runs {
        let mut prev = 0.0;
        for &(p, us) in &r.percentiles {
            let share = (p - prev).max(0.0) / 100.0;
            let n = (share * r.requests as f64).round() as u64;
            let _ = h.record_n(us.max(1), n.max(1));
            prev = p;
        }
    }
    h
}

/// The gateway process: `loadbench gateway-serve`.
struct GatewayProc {
    child: Child,
    stdin: Option<ChildStdin>,
    port: u16,
}

impl GatewayProc {
    fn spawn(urls: &[String], workers: usize, max_concurrent: u32) -> Result<GatewayProc, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut child = Command::new(exe)
            .arg("gateway-serve")
            .arg("--upstreams")
            .arg(urls.join(","))
            .arg("--gateway-workers")
            .arg(workers.to_string())
            .arg("--max-concurrent")
            .arg(max_concurrent.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start the gateway process: {e}"))?;
        let stdin = child.stdin.take();
        let mut out: BufReader<ChildStdout> =
            BufReader::new(child.stdout.take().ok_or("gateway stdout")?);
        let mut line = String::new();
        out.read_line(&mut line)
            .map_err(|e| format!("gateway stdout: {e}"))?;
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(|| format!("gateway said {line:?} instead of its port"))?;
        Ok(GatewayProc { child, stdin, port })
    }
}

impl Drop for GatewayProc {
    fn drop(&mut self) {
        if let Some(mut s) = self.stdin.take() {
            let _ = s.flush();
        }
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The gateway process's side (hidden scenario `gateway-serve`).
#[cfg(feature = "web")]
pub fn serve(cli: &Cli) -> Result<(), String> {
    use actix_dispatch::web::{forward, ForwardConfig};
    use actix_dispatch::Dispatcher;
    use actix_web::{web, App, HttpServer};

    let urls: Vec<String> = cli
        .upstreams
        .split(',')
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    let mut cfg = common::engine_config(
        &cli.mode,
        &urls,
        cli.max_concurrent,
        json!({"timeout": "5s", "balancer": {"seed": 7}}),
    )?;
    cfg.services[0].queue.capacity = cfg.services[0].queue.capacity.max(CONNECTIONS * 4);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    // End of input (the client went away) or the hard limit ends the process.
    std::thread::spawn(|| {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
        std::process::exit(0);
    });
    let max = Duration::from_secs(cli.max_secs);
    std::thread::spawn(move || {
        std::thread::sleep(max);
        std::process::exit(0);
    });
    let workers = cli.gateway_workers.max(1);
    actix_rt::System::new().block_on(async move {
        // Each worker starts its own engine on its own arbiter (the factory
        // runs on the worker's thread), so the engine shares the worker's
        // thread, as nginx's upstream code shares its worker's.
        let server = HttpServer::new(move || {
            let d = Dispatcher::start(cfg.clone()).expect("the bench config is valid");
            App::new()
                .app_data(web::Data::new(d))
                .app_data(ForwardConfig::default())
                // A scope's prefix match, not a `{tail:.*}` route's regex.
                .service(web::scope("/bench").default_service(forward("bench")))
        })
        .workers(workers)
        .backlog(4096)
        .disable_signals()
        .shutdown_timeout(1)
        .listen(listener)
        .map_err(|e| format!("listen: {e}"))?;
        println!("PORT {port}");
        let _ = std::io::stdout().flush();
        server.run().await.map_err(|e| format!("gateway: {e}"))
    })
}

#[cfg(not(feature = "web"))]
pub fn serve(_cli: &Cli) -> Result<(), String> {
    Err("the gateway needs the `web` feature (cargo run --release --features web ...)".into())
}

struct Contender {
    name: String,
    url: String,
    runs: Vec<WrkRun>,
}

pub async fn run(cli: &Cli) -> Result<Report, String> {
    if !cfg!(feature = "web") {
        return Err(
            "`gateway` needs the `web` feature: cargo run --release --features web \
                    --example loadbench -- gateway"
                .into(),
        );
    }
    let rounds = pick(cli.rounds, cli.smoke, 1, 3);
    let secs = pick(cli.duration, cli.smoke, 1.0, 5.0);
    let workers = cli.gateway_workers.max(1);
    let mut rep = Report::new(
        cli,
        "gateway",
        json!({"rounds": rounds, "seconds_per_run": secs, "wrk": format!("-t1 -c{CONNECTIONS}"),
               "backends": 3, "backend_workers": cli.backend_workers,
               "gateway": format!("actix-web, {workers} worker(s), an engine (p2c) on each"),
               "nginx": format!("least_conn, keepalive {CONNECTIONS}, {workers} worker process(es)")}),
    );
    let wrk_bin = find_or_install_wrk(!cli.no_install_wrk)?;
    let nginx_bin = nginx::find_or_install(!cli.no_install_nginx)?;
    let backend = BackendProc::spawn(3, &[0], &[], cli.backend_workers, 900)?;
    let urls = backend.urls();
    let gw = GatewayProc::spawn(&urls, workers, cli.max_concurrent)?;
    let ngx = Nginx::start_with_workers(&nginx_bin, &backend.ports, CONNECTIONS, TIMEOUT, workers)?;
    let dir = std::env::temp_dir().join(format!("actix-dispatch-bench-wrk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let script = dir.join("report.lua");
    std::fs::write(&script, WRK_LUA).map_err(|e| format!("{}: {e}", script.display()))?;

    let mut cs = vec![
        Contender {
            name: format!("gateway (web::forward, {workers} worker)"),
            url: format!("http://127.0.0.1:{}/bench/items/1", gw.port),
            runs: Vec::new(),
        },
        Contender {
            name: format!("nginx least_conn ({workers} worker)"),
            url: format!("{}bench/items/1", ngx.url()),
            runs: Vec::new(),
        },
    ];
    let result = (|| -> Result<(), String> {
        for c in &cs {
            wrk(&wrk_bin, &script, &c.url, 1.0)?;
        }
        for r in 0..rounds {
            for j in 0..cs.len() {
                let c = &mut cs[(r + j) % 2];
                let run = wrk(&wrk_bin, &script, &c.url, secs)?;
                eprintln!(
                    "round {r}: {}: {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, {} errors",
                    c.name,
                    run.rate,
                    run.at(50.0),
                    run.at(99.0),
                    run.errors
                );
                c.runs.push(run);
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    drop(ngx);
    drop(gw);
    drop(backend);
    result?;

    let rate = |c: &Contender| median(&c.runs.iter().map(|r| r.rate).collect::<Vec<_>>());
    let p99 = |c: &Contender| median(&c.runs.iter().map(|r| r.at(99.0)).collect::<Vec<_>>());
    let p50 = |c: &Contender| median(&c.runs.iter().map(|r| r.at(50.0)).collect::<Vec<_>>());
    let per_round: Vec<f64> = cs[0]
        .runs
        .iter()
        .zip(&cs[1].runs)
        .map(|(g, n)| g.rate / n.rate.max(1e-9))
        .collect();
    let ratio = median(&per_round);
    let (g99, n99) = (p99(&cs[0]), p99(&cs[1]));
    rep.target(
        "gateway req/s / nginx req/s",
        ">= 1.1",
        format!("{ratio:.3}"),
        Some(ratio >= 1.1),
    );
    rep.target(
        "gateway p99 vs nginx p99",
        "no worse",
        format!(
            "{} ms vs {} ms ({:.2} x)",
            ms(g99),
            ms(n99),
            g99 / n99.max(1e-9)
        ),
        Some(g99 <= n99),
    );

    let hists: Vec<Histogram<u64>> = cs.iter().map(|c| hist_of(&c.runs)).collect();
    let series: Vec<crate::charts::Series<'_>> = cs
        .iter()
        .zip(&hists)
        .map(|(c, h)| crate::charts::Series {
            name: &c.name,
            rate: rate(c),
            hist: h,
        })
        .collect();
    match crate::charts::write(&out_dir(cli), "gateway", &series, 1) {
        Ok(paths) => {
            let names: Vec<String> = paths
                .iter()
                .filter_map(|p| p.file_name().map(|f| format!("`{}`", f.to_string_lossy())))
                .collect();
            rep.note(format!(
                "Charts: {} (the latency CDF is rebuilt from wrk's percentiles).",
                names.join(", ")
            ));
        }
        Err(e) => rep.note(format!("Charts not written: {e}")),
    }
    let rows: Vec<Vec<String>> = cs
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                count(rate(c)),
                ms(p50(c)),
                ms(p99(c)),
                c.runs.iter().map(|r| r.errors).sum::<u64>().to_string(),
                c.runs
                    .iter()
                    .map(|r| count(r.rate))
                    .collect::<Vec<_>>()
                    .join(", "),
            ]
        })
        .collect();
    rep.body = table(
        &[
            "proxy",
            "req/s (median)",
            "p50 ms",
            "p99 ms",
            "errors",
            "runs req/s",
        ],
        rows,
    );
    rep.results = json!({
        "contenders": cs.iter().map(|c| json!({
            "name": c.name, "rate_median": rate(c), "p50_ms": p50(c), "p99_ms": p99(c),
            "rates": c.runs.iter().map(|r| r.rate).collect::<Vec<_>>(),
            "p99s_ms": c.runs.iter().map(|r| r.at(99.0)).collect::<Vec<_>>(),
            "errors": c.runs.iter().map(|r| r.errors).sum::<u64>(),
        })).collect::<Vec<_>>(),
        "gateway_over_nginx": ratio,
        "per_round": per_round,
    });
    rep.note(format!(
        "wrk -t1 -c{CONNECTIONS}, {secs} s per run, {rounds} alternating round(s) after a 1 s \
         warm-up of each; 3 backends answering at once in a separate process ({} worker \
         thread(s)). Threads: the gateway {workers} actix-web worker(s), each with its own engine \
         on its arbiter (plus actix-server's accept thread, idle under keep-alive); nginx \
         {workers} worker process(es) (plus its idle master). wrk, the proxy under test and the \
         backends share the machine's {} core(s). Ratios are medians of per-round ratios.",
        cli.backend_workers, rep.cores
    ));
    Ok(rep.finish())
}
