//! The HTTP backends, in a separate process.
//!
//! `loadbench backend --servers N --latency-ms 20,20,.. --slow 2:500:5000:10000`
//! binds N actix-web servers on 127.0.0.1 ephemeral ports (one `HttpServer`
//! with N listeners; the local port of each connection tells which server it
//! is), prints `PORTS p1,p2,..` as one line on stdout, and answers every
//! request `200 ok` (header `x-backend: bK`) after server K's latency. A
//! `--slow K:MS:FROM:TO` makes server K answer after MS during [FROM, TO)
//! milliseconds after the last `start` line read on stdin (or after process
//! start). Commands on stdin, one per line: `start` (re-arms the schedule,
//! answers `STARTED`), `hits` (answers `HITS h1,h2,..`, requests per
//! server). The process exits when stdin closes, or after `--max-secs`.
//!
//! With `--capacity C` (C > 0) every server is a fixed-capacity backend, as
//! a worker pool is: it serves at most C requests at once, each for its
//! latency, and the rest wait inside the server (accepted, not yet served)
//! in arrival order. So its capacity is C / latency requests per second,
//! and a request sent past that waits longer and longer inside the backend.
//! The `peaks` command answers `PEAKS w1,w2,..`: the most requests waiting
//! at once inside each server since the last `start` (which resets them).
//! `--capacity` takes one count per server (`2,4,8`; the last repeats), and
//! the command `workers n1,n2,..` changes them while the process runs
//! (answers `WORKERS n1,n2,..`): a server grown gets its new workers at once;
//! a shrunk one loses its idle workers at once and busy ones as they finish
//! their request, so it never serves more than its new count for longer than
//! one service time.
//!
//! `--service fixed|exp|bimodal` (per server, the last repeats) draws each
//! request's service time around the server's latency as mean: fixed;
//! exponential; or bimodal, half the mean with probability 0.9 and 5.5 times
//! it otherwise (10 ms and 110 ms around 20 ms, as the simulator's bimodal
//! class). The draws come from `--service-seed` (one generator per server,
//! in the order requests arrive).
//!
//! [`BackendProc`] is the client side: it starts this binary again with the
//! hidden `backend` scenario and talks to it over the pipes.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_dispatch::Instant;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::Cli;

/// Server `server` answers after `ms` during [from_ms, to_ms) of the schedule.
#[derive(Debug, Clone, Copy)]
pub struct Slow {
    pub server: usize,
    pub ms: u64,
    pub from_ms: u64,
    pub to_ms: u64,
}

impl Slow {
    fn parse(s: &str) -> Result<Slow, String> {
        let v: Vec<u64> = s
            .split(':')
            .map(|x| x.trim().parse::<u64>())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("--slow {s:?}: {e}"))?;
        match v[..] {
            [server, ms, from_ms, to_ms] => Ok(Slow {
                server: server as usize,
                ms,
                from_ms,
                to_ms,
            }),
            _ => Err(format!("--slow {s:?}: expected server:ms:from_ms:to_ms")),
        }
    }

    fn arg(&self) -> String {
        format!(
            "{}:{}:{}:{}",
            self.server, self.ms, self.from_ms, self.to_ms
        )
    }
}

/// How a server's service time is drawn around its mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    Fixed,
    Exp,
    Bimodal,
}

impl Service {
    pub fn parse(s: &str) -> Result<Service, String> {
        match s.trim() {
            "fixed" => Ok(Service::Fixed),
            "exp" => Ok(Service::Exp),
            "bimodal" => Ok(Service::Bimodal),
            other => Err(format!(
                "--service {other:?}: expected fixed, exp or bimodal"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Service::Fixed => "fixed",
            Service::Exp => "exp",
            Service::Bimodal => "bimodal",
        }
    }

    /// One service time of mean `mean_us`, in µs, at most 50 means.
    fn draw(self, mean_us: u64, rng: &mut SmallRng) -> u64 {
        let m = mean_us as f64;
        let us = match self {
            Service::Fixed => m,
            Service::Exp => -m * (1.0 - rng.random::<f64>()).ln(),
            Service::Bimodal => {
                if rng.random::<f64>() < 0.1 {
                    5.5 * m
                } else {
                    0.5 * m
                }
            }
        };
        us.min(50.0 * m).round() as u64
    }
}

/// `a,b,c` as numbers, one per server (the last repeats; empty: `dflt`).
fn per_server<T: std::str::FromStr + Copy>(
    list: &str,
    n: usize,
    dflt: T,
    flag: &str,
) -> Result<Vec<T>, String>
where
    T::Err: std::fmt::Display,
{
    let v: Vec<T> = list
        .split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| x.trim().parse::<T>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{flag}: {e}"))?;
    Ok((0..n)
        .map(|i| v.get(i).or(v.last()).copied().unwrap_or(dflt))
        .collect())
}

struct State {
    ports: Vec<u16>,
    latency_us: Vec<u64>,
    /// Per server: how its service time is drawn, and its generator.
    service: Vec<Service>,
    rngs: Vec<Mutex<SmallRng>>,
    slow: Vec<Slow>,
    base: Instant,
    /// Nanoseconds from `base` to the last `start`.
    epoch_ns: AtomicU64,
    hits: Vec<AtomicU64>,
    names: Vec<String>,
    /// Per server, with `--capacity`: its workers, and how many requests
    /// wait for one now and at most since the last `start`.
    pools: Vec<Option<Pool>>,
}

/// The workers of a fixed-capacity server.
struct Pool {
    workers: Arc<Semaphore>,
    /// The worker count asked for (`--capacity`, then `workers`).
    target: Mutex<u64>,
    /// Busy workers still to retire after a shrink: each leaves as it ends
    /// its request instead of taking the next one.
    retire: AtomicU64,
    waiting: AtomicU64,
    peak_waiting: AtomicU64,
}

impl Pool {
    fn new(workers: usize) -> Pool {
        Pool {
            workers: Arc::new(Semaphore::new(workers)),
            target: Mutex::new(workers as u64),
            retire: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            peak_waiting: AtomicU64::new(0),
        }
    }

    /// Sets the worker count to `n` (at least 1).
    fn resize(&self, n: u64) {
        let n = n.max(1);
        let mut target = self.target.lock().unwrap_or_else(|e| e.into_inner());
        if n < *target {
            let less = *target - n;
            let idle = self.workers.forget_permits(less as usize) as u64;
            self.retire.fetch_add(less - idle, Ordering::SeqCst);
        } else if n > *target {
            let mut more = n - *target;
            // First undo retirements still pending.
            while more > 0 && self.take_retirement() {
                more -= 1;
            }
            self.workers.add_permits(more as usize);
        }
        *target = n;
    }

    /// Takes one pending retirement, if any.
    fn take_retirement(&self) -> bool {
        self.retire
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| r.checked_sub(1))
            .is_ok()
    }

    /// A worker ends its request: it retires if one is due, else frees.
    fn release(&self, permit: OwnedSemaphorePermit) {
        if self.take_retirement() {
            permit.forget();
        }
    }

    fn target(&self) -> u64 {
        *self.target.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn handle(req: HttpRequest, st: web::Data<State>) -> HttpResponse {
    let port = req.app_config().local_addr().port();
    let k = st.ports.iter().position(|&p| p == port).unwrap_or(0);
    st.hits[k].fetch_add(1, Ordering::Relaxed);
    let mut us = {
        let mut rng = st.rngs[k].lock().unwrap_or_else(|e| e.into_inner());
        st.service[k].draw(st.latency_us[k], &mut rng)
    };
    if !st.slow.is_empty() {
        let since_ms = (st.base.elapsed().as_nanos() as u64)
            .saturating_sub(st.epoch_ns.load(Ordering::Relaxed))
            / 1_000_000;
        for s in &st.slow {
            if s.server == k && (s.from_ms..s.to_ms).contains(&since_ms) {
                us = s.ms * 1000;
            }
        }
    }
    // A fixed-capacity server: wait for a worker (FIFO), hold it for the
    // whole service time.
    let worker = match &st.pools[k] {
        Some(pool) => {
            let now = pool.waiting.fetch_add(1, Ordering::Relaxed) + 1;
            pool.peak_waiting.fetch_max(now, Ordering::Relaxed);
            // Counted out however the wait ends: a request whose client
            // left is dropped while it waits, and must not count on.
            let waiting = Waiting(&pool.waiting);
            let permit = Arc::clone(&pool.workers).acquire_owned().await;
            drop(waiting);
            permit.ok().map(|p| (pool, p))
        }
        None => None,
    };
    if us > 0 {
        actix_web::rt::time::sleep(Duration::from_micros(us)).await;
    }
    if let Some((pool, permit)) = worker {
        pool.release(permit);
    }
    HttpResponse::Ok()
        .insert_header(("x-backend", st.names[k].as_str()))
        .body("ok")
}

/// One request waiting for a worker; counted out when dropped.
struct Waiting<'a>(&'a AtomicU64);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Runs the backend process (the hidden `backend` scenario).
pub fn serve(cli: &Cli) -> Result<(), String> {
    let n = cli.servers.max(1);
    let lat: Vec<u64> = cli
        .latency_ms
        .split(',')
        .map(|x| x.trim().parse::<u64>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--latency-ms: {e}"))?;
    let latency_us: Vec<u64> = (0..n)
        .map(|i| lat.get(i).or(lat.last()).copied().unwrap_or(0) * 1000)
        .collect();
    let capacity: Vec<usize> = per_server(&cli.capacity, n, 0, "--capacity")?;
    let service: Vec<Service> = cli
        .service
        .split(',')
        .map(Service::parse)
        .collect::<Result<Vec<_>, _>>()?;
    let service: Vec<Service> = (0..n)
        .map(|i| {
            service
                .get(i)
                .or(service.last())
                .copied()
                .unwrap_or(Service::Fixed)
        })
        .collect();
    let slow = cli
        .slow
        .iter()
        .map(|s| Slow::parse(s))
        .collect::<Result<Vec<_>, _>>()?;
    let mut listeners = Vec::with_capacity(n);
    let mut ports = Vec::with_capacity(n);
    for _ in 0..n {
        let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
        ports.push(l.local_addr().map_err(|e| e.to_string())?.port());
        listeners.push(l);
    }
    let state = web::Data::new(State {
        ports: ports.clone(),
        latency_us,
        service,
        rngs: (0..n)
            .map(|i| {
                Mutex::new(SmallRng::seed_from_u64(
                    cli.service_seed ^ (0x9E37 * (i as u64 + 1)),
                ))
            })
            .collect(),
        slow,
        base: Instant::now(),
        epoch_ns: AtomicU64::new(0),
        hits: (0..n).map(|_| AtomicU64::new(0)).collect(),
        names: (0..n).map(|i| format!("b{i}")).collect(),
        pools: capacity
            .iter()
            .map(|&c| (c > 0).then(|| Pool::new(c)))
            .collect(),
    });

    // Commands and end of input.
    let st = state.clone();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            match line.trim() {
                "start" => {
                    st.epoch_ns
                        .store(st.base.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    for pool in st.pools.iter().flatten() {
                        let now = pool.waiting.load(Ordering::Relaxed);
                        pool.peak_waiting.store(now, Ordering::Relaxed);
                    }
                    println!("STARTED");
                }
                cmd if cmd.starts_with("workers ") => {
                    let n = st.pools.len();
                    match per_server::<u64>(&cmd["workers ".len()..], n, 1, "workers") {
                        Ok(w) => {
                            for (pool, w) in st.pools.iter().zip(w) {
                                if let Some(pool) = pool {
                                    pool.resize(w);
                                }
                            }
                            let now: Vec<String> = st
                                .pools
                                .iter()
                                .map(|p| p.as_ref().map_or(0, Pool::target).to_string())
                                .collect();
                            println!("WORKERS {}", now.join(","));
                        }
                        Err(e) => println!("ERROR {e}"),
                    }
                }
                "hits" => {
                    let h: Vec<String> = st
                        .hits
                        .iter()
                        .map(|h| h.load(Ordering::Relaxed).to_string())
                        .collect();
                    println!("HITS {}", h.join(","));
                }
                "peaks" => {
                    let p: Vec<String> = st
                        .pools
                        .iter()
                        .map(|p| {
                            p.as_ref()
                                .map_or(0, |p| p.peak_waiting.load(Ordering::Relaxed))
                                .to_string()
                        })
                        .collect();
                    println!("PEAKS {}", p.join(","));
                }
                _ => {}
            }
        }
        std::process::exit(0);
    });
    // Hard time limit, whatever the client does.
    let max = Duration::from_secs(cli.max_secs);
    std::thread::spawn(move || {
        std::thread::sleep(max);
        eprintln!("backend: hard time limit of {max:?} reached; exiting");
        std::process::exit(0);
    });

    let workers = cli.backend_workers.max(1);
    actix_rt::System::new().block_on(async move {
        let data = state.clone();
        let mut server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .default_service(web::to(handle))
        })
        .workers(workers)
        .backlog(4096)
        .disable_signals()
        .shutdown_timeout(1);
        for l in listeners {
            server = server.listen(l).map_err(|e| format!("listen: {e}"))?;
        }
        let running = server.run();
        let p: Vec<String> = ports.iter().map(u16::to_string).collect();
        println!("PORTS {}", p.join(","));
        running.await.map_err(|e| format!("server: {e}"))
    })
}

/// A running backend process.
pub struct BackendProc {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    pub ports: Vec<u16>,
}

impl BackendProc {
    /// Starts `servers` backends with the given latencies (the last one
    /// repeats) and slow periods, and waits for their ports.
    pub fn spawn(
        servers: usize,
        latency_ms: &[u64],
        slow: &[Slow],
        workers: usize,
        max_secs: u64,
    ) -> Result<BackendProc, String> {
        let mut cmd = Self::command_for(servers, latency_ms, workers, max_secs)?;
        for s in slow {
            cmd.arg("--slow").arg(s.arg());
        }
        Self::start(cmd)
    }

    /// Starts `servers` fixed-capacity backends: each serves `capacity`
    /// requests at once for `latency_ms`, the rest wait inside it.
    pub fn spawn_capped(
        servers: usize,
        latency_ms: u64,
        capacity: usize,
        workers: usize,
        max_secs: u64,
    ) -> Result<BackendProc, String> {
        Self::spawn_pools(
            &[capacity],
            latency_ms,
            Service::Fixed,
            1,
            servers,
            workers,
            max_secs,
        )
    }

    /// Starts one fixed-capacity backend per entry of `capacity` (its
    /// workers), service times drawn by `service` around `latency_ms`
    /// from `seed`; `servers` at least as many (the last count repeats).
    pub fn spawn_pools(
        capacity: &[usize],
        latency_ms: u64,
        service: Service,
        seed: u64,
        servers: usize,
        workers: usize,
        max_secs: u64,
    ) -> Result<BackendProc, String> {
        let servers = servers.max(capacity.len());
        let caps: Vec<String> = capacity.iter().map(|c| c.max(&1).to_string()).collect();
        let mut cmd = Self::command_for(servers, &[latency_ms], workers, max_secs)?;
        cmd.arg("--capacity")
            .arg(caps.join(","))
            .arg("--service")
            .arg(service.name())
            .arg("--service-seed")
            .arg(seed.to_string());
        Self::start(cmd)
    }

    fn command_for(
        servers: usize,
        latency_ms: &[u64],
        workers: usize,
        max_secs: u64,
    ) -> Result<Command, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let lat: Vec<String> = latency_ms.iter().map(u64::to_string).collect();
        let mut cmd = Command::new(exe);
        cmd.arg("backend")
            .arg("--servers")
            .arg(servers.to_string())
            .arg("--latency-ms")
            .arg(if lat.is_empty() {
                "0".into()
            } else {
                lat.join(",")
            })
            .arg("--backend-workers")
            .arg(workers.to_string())
            .arg("--max-secs")
            .arg(max_secs.to_string());
        Ok(cmd)
    }

    fn start(mut cmd: Command) -> Result<BackendProc, String> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start the backend process: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut b = BackendProc {
            child,
            stdin,
            stdout,
            ports: Vec::new(),
        };
        let line = b.read_line()?;
        let ports = line
            .strip_prefix("PORTS ")
            .ok_or_else(|| format!("backend said {line:?} instead of its ports"))?;
        b.ports = ports
            .split(',')
            .map(|p| p.parse::<u16>().map_err(|e| format!("port {p:?}: {e}")))
            .collect::<Result<_, _>>()?;
        Ok(b)
    }

    fn read_line(&mut self) -> Result<String, String> {
        let mut line = String::new();
        let n = self
            .stdout
            .read_line(&mut line)
            .map_err(|e| format!("backend stdout: {e}"))?;
        if n == 0 {
            return Err("the backend process ended".into());
        }
        Ok(line.trim().to_owned())
    }

    fn command(&mut self, cmd: &str) -> Result<String, String> {
        let stdin = self.stdin.as_mut().ok_or("backend stdin closed")?;
        writeln!(stdin, "{cmd}")
            .and_then(|_| stdin.flush())
            .map_err(|e| format!("backend stdin: {e}"))?;
        self.read_line()
    }

    /// The base URL of every server.
    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}/"))
            .collect()
    }

    /// Starts the slow-period schedule now.
    pub fn start_schedule(&mut self) -> Result<(), String> {
        match self.command("start")?.as_str() {
            "STARTED" => Ok(()),
            other => Err(format!("backend answered {other:?} to start")),
        }
    }

    /// The most requests that waited at once inside each server since the
    /// last [`BackendProc::start_schedule`] (0 without `--capacity`).
    pub fn peaks(&mut self) -> Result<Vec<u64>, String> {
        let line = self.command("peaks")?;
        let p = line
            .strip_prefix("PEAKS ")
            .ok_or_else(|| format!("backend answered {line:?} to peaks"))?;
        p.split(',')
            .map(|x| x.parse::<u64>().map_err(|e| e.to_string()))
            .collect()
    }

    /// Sets each server's worker count (see the module doc); the answer is
    /// the counts now.
    pub fn resize(&mut self, workers: &[usize]) -> Result<Vec<u64>, String> {
        self.resize_later(workers)?;
        self.resized()
    }

    /// Asks for [`BackendProc::resize`] without waiting for the answer
    /// (a load loop's thread must not wait on the backend process): read
    /// it with [`BackendProc::resized`], one per call, before any other
    /// command.
    pub fn resize_later(&mut self, workers: &[usize]) -> Result<(), String> {
        let w: Vec<String> = workers.iter().map(usize::to_string).collect();
        let stdin = self.stdin.as_mut().ok_or("backend stdin closed")?;
        writeln!(stdin, "workers {}", w.join(","))
            .and_then(|_| stdin.flush())
            .map_err(|e| format!("backend stdin: {e}"))
    }

    /// The answer to the oldest unread [`BackendProc::resize_later`].
    pub fn resized(&mut self) -> Result<Vec<u64>, String> {
        let line = self.read_line()?;
        let p = line
            .strip_prefix("WORKERS ")
            .ok_or_else(|| format!("backend answered {line:?} to workers"))?;
        p.split(',')
            .map(|x| x.parse::<u64>().map_err(|e| e.to_string()))
            .collect()
    }

    /// Requests received so far, per server.
    pub fn hits(&mut self) -> Result<Vec<u64>, String> {
        let line = self.command("hits")?;
        let h = line
            .strip_prefix("HITS ")
            .ok_or_else(|| format!("backend answered {line:?} to hits"))?;
        h.split(',')
            .map(|x| x.parse::<u64>().map_err(|e| e.to_string()))
            .collect()
    }
}

impl Drop for BackendProc {
    fn drop(&mut self) {
        // Closing stdin ends the process; kill it if it lingers.
        self.stdin.take();
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
