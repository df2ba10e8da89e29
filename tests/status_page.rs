//! The live status page (feature `web`): a gateway over three real
//! backends, one answering 500 so its breaker opens, under steady traffic;
//! the page opened in a real headless browser (Debian's `chromium`) shows
//! the failing node's breaker open, the others closed, and numbers that
//! move between two reads; a screenshot of it is saved under the target
//! directory. The page's JSON holds to its schema, exactly.
//!
//! The browser test fails, rather than skips, when `chromium` is missing
//! and `CI` or `ACTIX_DISPATCH_REQUIRE_CHROMIUM` is set (`.ci/run` installs
//! it and sets the latter).

#![cfg(feature = "web")]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_dispatch::web::{configure, forward, status_page};
use actix_dispatch::{Config, Dispatcher};
use actix_web::dev::{ServerHandle, Service as _};
use actix_web::{web, App, HttpServer};
use serde_json::Value;

use support::wait::stats_until;
use support::Backend;

/// A gateway on 127.0.0.1: `/svc/{tail}` forwards to service `svc`, and
/// an admin scope holds the status page and `configure`'s routes.
struct Gateway {
    url: String,
    dispatcher: Dispatcher,
    server: ServerHandle,
    /// Requests for `/admin/status.json` so far: the page's polls.
    polls: Arc<AtomicU64>,
}

impl Gateway {
    fn start(config: Config) -> Gateway {
        let dispatcher = Dispatcher::start(config).expect("inside a System");
        let data = web::Data::new(dispatcher.clone());
        let polls = Arc::new(AtomicU64::new(0));
        let counter = polls.clone();
        let server = HttpServer::new(move || {
            let counter = counter.clone();
            App::new()
                .wrap_fn(move |req, srv| {
                    if req.path() == "/admin/status.json" {
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                    srv.call(req)
                })
                .app_data(data.clone())
                .route("/svc/{tail:.*}", forward("svc"))
                .service(
                    web::scope("/admin")
                        .service(status_page())
                        .configure(configure),
                )
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(0)
        .bind(("127.0.0.1", 0))
        .expect("bind 127.0.0.1");
        let url = format!("http://127.0.0.1:{}", server.addrs()[0].port());
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        Gateway {
            url,
            dispatcher,
            server: handle,
            polls,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    async fn stop(self) {
        self.dispatcher.shutdown(Duration::ZERO).await;
        self.server.stop(false).await;
    }
}

/// Three nodes (the third's breaker opens after 3 failures and stays open
/// a minute), a few slots each so tasks queue, two retries; with `creds`,
/// a second service whose one endpoint has a secret header (an address
/// with `user:password@` is refused at load).
fn three_nodes(b: &[Backend], creds: bool) -> Config {
    let creds = if creds {
        r#",{"name":"creds","endpoints":[{"address":"http://127.0.0.1:1/","headers":{"authorization":"Bearer s3cret"}}]}"#
    } else {
        ""
    };
    let json = format!(
        r#"{{"services":[{{"name":"svc","mode":"round_robin",
            "retry":{{"max_retries":2,"backoff_base":"1ms","backoff_max":"5ms"}},
            "breaker":{{"consecutive_failures":3,"open_for":"60s","max_open_for":"60s"}},
            "endpoints":[
              {{"address":"{}","max_concurrent":4}},
              {{"address":"{}","max_concurrent":4}},
              {{"address":"{}","max_concurrent":4}}]}}{creds}]}}"#,
        b[0].url(),
        b[1].url(),
        b[2].url()
    );
    Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

/// `loops` clients sending GETs through the gateway until `stop` is set.
fn drive(url: String, loops: usize, stop: Arc<AtomicBool>) -> Vec<actix_rt::task::JoinHandle<u64>> {
    (0..loops)
        .map(|i| {
            let (url, stop) = (url.clone(), stop.clone());
            actix_rt::spawn(async move {
                let client = awc::Client::default();
                let mut sent = 0;
                while !stop.load(Ordering::Relaxed) {
                    let res = client
                        .get(format!("{url}/svc/load/{i}/{sent}"))
                        .timeout(Duration::from_secs(5))
                        .send()
                        .await;
                    if let Ok(mut res) = res {
                        let _ = res.body().await;
                    }
                    sent += 1;
                }
                sent
            })
        })
        .collect()
}

#[actix_rt::test]
async fn status_page_in_a_browser_shows_the_open_breaker_and_moving_numbers() {
    let Some(browser) = chromium() else {
        return;
    };
    let b = support::backends(3);
    b[1].set_latency(Duration::from_millis(15));
    b[2].set_status(Some(500));
    let gw = Gateway::start(three_nodes(&b, false));
    let stop = Arc::new(AtomicBool::new(false));
    let loops = drive(gw.url.clone(), 16, stop.clone());

    let failing = b[2].url();
    let s = stats_until(&gw.dispatcher, |s| {
        let svc = s.service("svc").unwrap();
        svc.node(&failing).unwrap().breaker == "open" && svc.queue.succeeded >= 50
    })
    .await;
    let svc = s.service("svc").unwrap();
    assert_eq!(svc.node(&failing).unwrap().breaker, "open", "{svc:#?}");

    let page = gw.url("/admin/status");
    let first = browse(&browser, &page, None, 5).await;
    actix_rt::time::sleep(Duration::from_millis(500)).await;
    // The second read: its tenth poll sees the first node's weight change.
    let polls = gw.polls.load(Ordering::Relaxed);
    let reweight = async {
        wait_polls(&gw.polls, polls + 10).await;
        gw.dispatcher
            .set_weight("svc", &b[0].url(), 3)
            .await
            .unwrap();
    };
    let (second, ()) = futures::join!(browse(&browser, &page, None, 30), reweight);

    // The screenshot: a minute of the page's time, during which the second
    // node slows down and then the first starts failing, so the charts,
    // the log and a highlighted row have something to show.
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    let polls = gw.polls.load(Ordering::Relaxed);
    let events = async {
        wait_polls(&gw.polls, polls + 20).await;
        b[1].set_latency(Duration::from_millis(40));
        wait_polls(&gw.polls, polls + 35).await;
        b[0].set_status(Some(500));
    };
    futures::join!(browse(&browser, &page, Some(&shot), 60), events);

    stop.store(true, Ordering::Relaxed);
    for l in loops {
        assert!(l.await.unwrap() > 0);
    }
    gw.stop().await;

    for dom in [&first, &second] {
        // The page polled its JSON more than once and drew every node.
        let samples: u64 = attr(dom, "<body", "data-samples").parse().unwrap();
        assert!(samples >= 2, "samples {samples}\n{dom}");
        assert_eq!(node_breaker(dom, &b[0].url()), "closed", "{dom}");
        assert_eq!(node_breaker(dom, &b[1].url()), "closed", "{dom}");
        assert_eq!(node_breaker(dom, &failing), "open", "{dom}");
        assert!(dom.contains("not overloaded"), "{dom}");
        assert!(dom.contains("page opened: 1 service(s)"), "{dom}");
    }
    // The first read saw no change, the second the weight's: logged, and
    // the node highlighted.
    for (dom, class) in [(&first, "node"), (&second, "node recent")] {
        assert_eq!(node_attr(dom, &b[0].url(), "class"), class, "{dom}");
        assert_eq!(node_attr(dom, &b[1].url(), "class"), "node", "{dom}");
    }
    let change = format!("svc: {} weight 1 → 3", b[0].url());
    assert!(
        !first.contains(&change) && second.contains(&change),
        "{second}"
    );
    // Numbers move: the second read saw more tasks than the first.
    let (a, z) = (tile(&first, "submitted"), tile(&second, "submitted"));
    assert!(z > a && a > 0.0, "submitted {a} then {z}");
    let png = std::fs::read(&shot).expect("the screenshot was written");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{}", shot.display());
    eprintln!("status page screenshot: {}", shot.display());
}

#[actix_rt::test]
async fn status_json_holds_to_its_schema() {
    let b = support::backends(3);
    b[2].set_status(Some(500));
    let gw = Gateway::start(three_nodes(&b, true));
    let client = awc::Client::default();
    for i in 0..12 {
        let mut res = client
            .get(gw.url(&format!("/svc/x/{i}")))
            .send()
            .await
            .unwrap();
        let _ = res.body().await;
    }
    let mut res = client
        .get(gw.url("/admin/status.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "content-type"), "application/json");
    assert_eq!(header(&res, "cache-control"), "no-store");
    let body = res.body().await.unwrap();
    assert!(!String::from_utf8_lossy(&body).contains("s3cret"));
    let v: Value = serde_json::from_slice(&body).unwrap();

    use Kind::*;
    check(
        &v,
        &[
            ("version", U),
            ("clock_ms", U),
            ("refused", U),
            ("services", Arr),
        ],
        "",
    );
    assert_eq!(v["version"], 1);
    let services = v["services"].as_array().unwrap();
    assert_eq!(services.len(), 2);
    for s in services {
        check(
            s,
            &[
                ("name", Str),
                ("mode", Str),
                ("submitted", U),
                ("succeeded", U),
                ("failed", U),
                ("rejected", U),
                ("shed", U),
                ("shed_at_intake", U),
                ("shed_by_class", Obj),
                ("ready_by_class", Obj),
                ("retried", U),
                ("hedged", U),
                ("cancelled", U),
                ("queued", U),
                ("waiting", U),
                ("capacity", U),
                ("peak_queued", U),
                ("in_flight", U),
                ("overloaded", Bool),
                ("retry_budget_left", U),
                ("gate", StrOrNull),
                ("tenants", Arr),
                ("nodes", Arr),
            ],
            "service",
        );
        for by_class in ["shed_by_class", "ready_by_class"] {
            check(
                &s[by_class],
                &[("critical", U), ("default", U), ("sheddable", U)],
                by_class,
            );
        }
        for n in s["nodes"].as_array().unwrap() {
            check(
                n,
                &[
                    ("address", Str),
                    ("weight", U),
                    ("effective_weight", U),
                    ("active", Bool),
                    ("draining", Bool),
                    ("health", Str),
                    ("breaker", Str),
                    ("open_for_ms", UOrNull),
                    ("trips", U),
                    ("in_flight", U),
                    ("max_concurrent", U),
                    ("concurrency_limit", U),
                    ("free_limit", U),
                    ("total", U),
                    ("errors", U),
                    ("error_rate", F),
                    ("latency_p50_ms", F),
                    ("latency_p99_ms", F),
                    ("ewma_latency_ms", F),
                    ("tokens", UOrNull),
                ],
                "node",
            );
            let breaker = n["breaker"].as_str().unwrap();
            assert!(
                ["closed", "open", "half-open"].contains(&breaker),
                "{breaker}"
            );
        }
    }
    // The figures are stats()'s; the address has lost its userinfo.
    let svc = &services[0];
    assert_eq!(svc["name"], "svc");
    assert_eq!(svc["mode"], "round_robin");
    assert_eq!(svc["submitted"], 12);
    assert_eq!(svc["nodes"][2]["address"], b[2].url());
    assert_eq!(services[1]["nodes"][0]["address"], "http://127.0.0.1:1/");

    // The page itself, read-only, loading nothing from elsewhere.
    let mut res = client.get(gw.url("/admin/status")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "content-type"), "text/html; charset=utf-8");
    let csp = header(&res, "content-security-policy");
    assert!(csp.starts_with("default-src 'none';"), "{csp}");
    let html = res.body().await.unwrap();
    assert!(html.starts_with(b"<!doctype html>"));
    let res = client
        .head(gw.url("/admin/status.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    for path in ["/admin/status", "/admin/status.json"] {
        let res = client.post(gw.url(path)).send().await.unwrap();
        assert_eq!(res.status(), 405, "POST {path}");
    }
    gw.stop().await;
}

/// The value of header `name` of `res` (empty when missing).
fn header<S>(res: &awc::ClientResponse<S>, name: &str) -> String {
    res.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// Waits (10 s at most: the screenshot's events are for show only) until
/// the page has polled `n` times in all.
async fn wait_polls(polls: &AtomicU64, n: u64) {
    support::wait::until(|| polls.load(Ordering::Relaxed) >= n).await;
}

// === the JSON schema ===

#[derive(Debug, Clone, Copy)]
enum Kind {
    U,
    F,
    Bool,
    Str,
    StrOrNull,
    UOrNull,
    Arr,
    Obj,
}

/// `v` is an object with exactly the fields `want`, each of its kind.
fn check(v: &Value, want: &[(&str, Kind)], what: &str) {
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("{what}: not an object: {v}"));
    let mut got: Vec<&str> = obj.keys().map(String::as_str).collect();
    let mut names: Vec<&str> = want.iter().map(|(k, _)| *k).collect();
    got.sort_unstable();
    names.sort_unstable();
    assert_eq!(got, names, "{what}: fields");
    for (k, kind) in want {
        let x = &obj[*k];
        let ok = match kind {
            Kind::U => x.is_u64(),
            Kind::F => x.is_f64() || x.is_u64(),
            Kind::Bool => x.is_boolean(),
            Kind::Str => x.is_string(),
            Kind::StrOrNull => x.is_string() || x.is_null(),
            Kind::UOrNull => x.is_u64() || x.is_null(),
            Kind::Arr => x.is_array(),
            Kind::Obj => x.is_object(),
        };
        assert!(ok, "{what}.{k}: {x} is not {kind:?}");
    }
}

// === the browser ===

/// The headless browser, or `None` (with a message) when it is missing and
/// not required; a missing browser fails the test when `CI` or
/// `ACTIX_DISPATCH_REQUIRE_CHROMIUM` is set.
fn chromium() -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("chromium"))
        .chain([PathBuf::from("/usr/bin/chromium")])
        .find(|p| p.is_file());
    let required = ["CI", "ACTIX_DISPATCH_REQUIRE_CHROMIUM"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()));
    match found {
        Some(p) => Some(p),
        None if required => panic!(
            "chromium is required (CI or ACTIX_DISPATCH_REQUIRE_CHROMIUM is set) but not found: \
             apt-get install -y chromium"
        ),
        None => {
            eprintln!("SKIPPED: chromium not found (apt-get install -y chromium)");
            None
        }
    }
}

/// Opens `url` in a fresh headless browser for `secs` seconds of the
/// page's virtual time (a poll a second: the browser runs the page's
/// timers at once, while its requests take real time): the rendered DOM,
/// or with `shot` a screenshot written there.
async fn browse(browser: &Path, url: &str, shot: Option<&Path>, secs: u32) -> String {
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let profile = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "chromium-profile-{}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ));
    let mut cmd = Command::new(browser);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
    ])
    .arg(format!("--virtual-time-budget={}", secs * 1000))
    .arg(format!("--user-data-dir={}", profile.display()));
    match shot {
        Some(p) => cmd
            .arg(format!("--screenshot={}", p.display()))
            .arg("--window-size=1280,1000"),
        None => cmd.arg("--dump-dom"),
    };
    cmd.arg(url).stdout(Stdio::piped()).stderr(Stdio::piped());
    let out = actix_rt::task::spawn_blocking(move || run_bounded(cmd, 120))
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&profile);
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "chromium failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    dom
}

/// Runs `cmd`, killing it after `secs` seconds (polled every 100 ms).
fn run_bounded(mut cmd: Command, secs: u32) -> std::process::Output {
    let mut child = cmd.spawn().expect("start chromium");
    // Read the pipes on threads so a full pipe never stalls the browser.
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut v).map(|_| v)
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut stderr, &mut v).map(|_| v)
    });
    for _ in 0..secs * 10 {
        if let Some(status) = child.try_wait().expect("wait for chromium") {
            return std::process::Output {
                status,
                stdout: out.join().unwrap().unwrap_or_default(),
                stderr: err.join().unwrap().unwrap_or_default(),
            };
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("chromium did not finish within {secs} s");
}

// === reading the rendered DOM ===

/// The value of attribute `name` in the first tag that contains `anchor`.
fn attr(dom: &str, anchor: &str, name: &str) -> String {
    let at = dom
        .find(anchor)
        .unwrap_or_else(|| panic!("no {anchor} in the page:\n{dom}"));
    let start = dom[..at + 1].rfind('<').unwrap();
    let tag = &dom[start..start + dom[start..].find('>').unwrap()];
    let key = format!(" {name}=\"");
    let v = &tag[tag
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {tag}"))
        + key.len()..];
    v[..v.find('"').unwrap()].to_owned()
}

/// The breaker state the page shows for the node at `address`.
fn node_breaker(dom: &str, address: &str) -> String {
    node_attr(dom, address, "data-breaker")
}

/// Attribute `name` of the page's row of the node at `address`.
fn node_attr(dom: &str, address: &str, name: &str) -> String {
    let at = dom
        .find(&format!("data-address=\"{address}\" data-breaker="))
        .unwrap_or_else(|| panic!("no row of {address}:\n{dom}"));
    attr(&dom[dom[..at].rfind('<').unwrap()..], "<tr", name)
}

/// The raw value of the service tile `key` (`svc`'s: the first service).
fn tile(dom: &str, key: &str) -> f64 {
    attr(dom, &format!("data-k=\"{key}\" data-v="), "data-v")
        .parse()
        .unwrap()
}
