//! An in-process API gateway on actix-web:
//! `cargo run --example gateway --features web [-- CONFIG.json] [--listen ADDR] [--admin ADDR]`.
//!
//! Every service of the config is mounted at `/{service}/{tail}` with
//! [`actix_dispatch::web::forward`] on the public listener,
//! `127.0.0.1:8080` (`--listen` to change it, loopback only by default).
//! `GET /stats` and `GET /health` ([`actix_dispatch::web::configure`]) list
//! every backend's address and state, so they are served on a listener of
//! their own, `127.0.0.1:9090` (`--admin`), never beside the public routes:
//! keep that one off the public network.
//!
//! Without CONFIG it starts three embedded demo backends on 127.0.0.1
//! (`fast`, `slow`, `flaky`, each on its own thread and actix System, as in
//! the demo) and a service `demo` over them. In a CONFIG file, `{fast}`,
//! `{slow}` and `{flaky}` stand for those backends' addresses (they are only
//! started when the file names one), e.g.
//! `{"services":[{"name":"api","endpoints":[{"address":"{fast}"},{"address":"http://127.0.0.1:9000/"}]}]}`.
//!
//! ```sh
//! curl -i localhost:8080/demo/items/1
//! curl -s localhost:9090/health
//! curl -s localhost:9090/stats
//! xdg-open http://localhost:9090/status
//! ```
//!
//! Ctrl-C stops the servers, then the engine (10 s grace).

use std::sync::mpsc;
use std::time::Duration;

use actix_dispatch::web::{configure, forward, status_page, ForwardConfig};
use actix_dispatch::{Config, Dispatcher};
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};

const DEFAULT_CONFIG: &str = r#"{"services": [{
    "name": "demo",
    "mode": "p2c",
    "timeout": "2s",
    "retry": {"max_retries": 2},
    "breaker": {"consecutive_failures": 5, "open_for": "2s"},
    "endpoints": [
        {"address": "{fast}", "max_concurrent": 32},
        {"address": "{slow}", "max_concurrent": 32},
        {"address": "{flaky}", "max_concurrent": 32}
    ]
}]}"#;

/// The embedded backends: name, latency range (ms), share of 500s.
const BACKENDS: [(&str, (u64, u64), f64); 3] = [
    ("fast", (2, 5), 0.0),
    ("slow", (40, 60), 0.0),
    ("flaky", (5, 10), 0.2),
];

/// Starts a backend on its own thread and System; returns its URL.
fn start_backend(name: &'static str, latency_ms: (u64, u64), errors: f64) -> String {
    let (port_tx, port_rx) = mpsc::channel();
    std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let serve = move |req: HttpRequest| async move {
                let ms = rand::random_range(latency_ms.0..=latency_ms.1);
                actix_web::rt::time::sleep(Duration::from_millis(ms)).await;
                if rand::random_bool(errors) {
                    HttpResponse::InternalServerError().body(format!("{name}: random failure\n"))
                } else {
                    let body = format!("{name} served {} {}\n", req.method(), req.uri());
                    HttpResponse::Ok()
                        .insert_header(("x-backend", name))
                        .body(body)
                }
            };
            let server = HttpServer::new(move || App::new().default_service(web::to(serve)))
                .workers(1)
                .disable_signals()
                .bind(("127.0.0.1", 0))?;
            let _ = port_tx.send(server.addrs()[0].port());
            server.run().await
        })
    });
    let port = port_rx.recv().expect("backend failed to bind 127.0.0.1");
    format!("http://127.0.0.1:{port}/")
}

fn fail(msg: &str) -> ! {
    eprintln!("gateway: {msg}");
    std::process::exit(2)
}

fn main() -> std::io::Result<()> {
    let env = env_logger::Env::default().default_filter_or("actix_dispatch=info");
    env_logger::Builder::from_env(env).init();

    let mut args = std::env::args().skip(1);
    let (mut file, mut listen) = (None, "127.0.0.1:8080".to_owned());
    let mut admin = "127.0.0.1:9090".to_owned();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next().unwrap_or_else(|| fail("--listen needs ADDR")),
            "--admin" => admin = args.next().unwrap_or_else(|| fail("--admin needs ADDR")),
            "-h" | "--help" => fail(
                "usage: gateway [CONFIG.json] [--listen 127.0.0.1:8080] [--admin 127.0.0.1:9090]",
            ),
            _ => file = Some(a),
        }
    }
    let mut json = match &file {
        Some(path) => std::fs::read_to_string(path)
            .unwrap_or_else(|e| fail(&format!("cannot read {path}: {e}"))),
        None => DEFAULT_CONFIG.to_owned(),
    };
    for (name, latency, errors) in BACKENDS {
        let placeholder = format!("{{{name}}}");
        if json.contains(&placeholder) {
            let url = start_backend(name, latency, errors);
            println!(
                "backend {name:<5} {url}  {}-{} ms, {:.0} % errors",
                latency.0,
                latency.1,
                errors * 100.0
            );
            json = json.replace(&placeholder, &url);
        }
    }
    let config = Config::from_json(&json).unwrap_or_else(|e| fail(&e.to_string()));
    let services: Vec<String> = config.services.iter().map(|s| s.name.clone()).collect();

    actix_web::rt::System::new().block_on(async move {
        let dispatcher = Dispatcher::start(config).unwrap_or_else(|e| fail(&e.to_string()));
        let data = web::Data::new(dispatcher.clone());
        let routes = services.clone();
        let public_data = data.clone();
        let server = HttpServer::new(move || {
            let mut app = App::new()
                .app_data(public_data.clone())
                .app_data(ForwardConfig::default().max_body(1 << 20));
            for name in &routes {
                app = app.route(&format!("/{name}/{{tail:.*}}"), forward(name.as_str()));
            }
            app
        })
        // A client's EOF ends its request, so a client that leaves
        // cancels its task (actix-web's default waits for the answer).
        .h1_allow_half_closed(false)
        .bind(listen.as_str())
        .unwrap_or_else(|e| fail(&format!("cannot listen on {listen}: {e}")));
        for name in &services {
            println!("route   http://{listen}/{name}/...  ->  service {name:?}");
        }
        // The admin routes on their own listener: they name every backend.
        let admin_server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .configure(configure)
                .service(status_page())
        })
        .workers(1)
        .bind(admin.as_str())
        .unwrap_or_else(|e| fail(&format!("cannot listen on {admin}: {e}")));
        println!("admin   http://{admin}/stats  http://{admin}/health  http://{admin}/status");
        futures::try_join!(server.run(), admin_server.run())?;
        dispatcher.shutdown(Duration::from_secs(10)).await;
        Ok(())
    })
}
