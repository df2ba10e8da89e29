//! `GET /metrics` over a real socket, by `Accept` (issue 23): OpenMetrics
//! for Prometheus, the text format 0.0.4 for older scrapers and promtool,
//! the same samples in both.

use super::*;

/// Parses the text format 0.0.4 as Prometheus' text parser and promtool's
/// lint read it: every sample's name is its family's (a counter's ends in
/// `_total`) or, for a histogram, the family's with `_bucket`, `_sum` or
/// `_count`; `# HELP` and `# TYPE` name the family the same; no
/// OpenMetrics-only line (`# UNIT`, `# EOF`).
fn parse_text(text: &str) -> Vec<Sample> {
    let mut family: Option<(String, String)> = None;
    let mut help: Option<String> = None;
    let mut samples = Vec::new();
    for line in text.lines() {
        assert!(!line.starts_with("# UNIT") && line != "# EOF", "{line}");
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest.split_once(' ').expect("HELP name text").0.to_owned());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').expect("TYPE name type");
            assert_eq!(help.take().as_deref(), Some(name), "HELP before TYPE");
            assert!(["counter", "gauge", "histogram"].contains(&ty), "{line}");
            if ty == "counter" {
                assert!(name.ends_with("_total"), "a counter without _total: {line}");
            }
            family = Some((name.to_owned(), ty.to_owned()));
            continue;
        }
        assert!(!line.starts_with('#'), "unknown comment line: {line}");
        let (fam, ty) = family.as_ref().expect("a sample after its TYPE");
        let (head, value) = line.rsplit_once(' ').expect("sample value");
        let (name, labels) = match head.split_once('{') {
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').expect("closing brace");
                let mut labels = HashMap::new();
                for pair in body.split("\",").filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once("=\"").expect("label=\"value\"");
                    labels.insert(k.to_owned(), v.trim_end_matches('"').to_owned());
                }
                (name.to_owned(), labels)
            }
            None => (head.to_owned(), HashMap::new()),
        };
        let fits = match ty.as_str() {
            "histogram" => ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| name == format!("{fam}{s}")),
            _ => name == *fam,
        };
        assert!(fits, "sample {name} is not of family {fam} ({ty})");
        let value = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        samples.push(Sample {
            name,
            labels,
            value,
        });
    }
    samples
}

/// A comparable form of a sample set.
fn keyed(samples: &[Sample]) -> Vec<String> {
    let mut out: Vec<String> = samples
        .iter()
        .map(|s| {
            let mut labels: Vec<_> = s.labels.iter().collect();
            labels.sort();
            format!("{} {labels:?} {}", s.name, s.value)
        })
        .collect();
    out.sort();
    out
}

#[actix_rt::test]
async fn metrics_answer_in_the_format_the_scraper_accepts() {
    use actix_web::{web, App, HttpServer};
    init_logs();
    let bs = backends(1);
    let d = Dispatcher::start(config("round_robin", &[(&bs[0], 1, 10)], "")).unwrap();
    for i in 0..3 {
        assert!(d
            .submit(Task::get("svc", format!("/{i}")))
            .await
            .is_success());
    }
    let data = web::Data::new(d.clone());
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .configure(actix_dispatch::web::configure)
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(0)
    .bind(("127.0.0.1", 0))
    .unwrap();
    let url = format!("http://127.0.0.1:{}/metrics", server.addrs()[0].port());
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(server);

    let client = awc::Client::default();
    let scrape = |accept: Option<&'static str>| {
        let mut req = client.get(&url);
        if let Some(a) = accept {
            req = req.insert_header(("accept", a));
        }
        async move {
            let mut res = req.send().await.expect("GET /metrics");
            assert_eq!(res.status(), 200);
            let header = |n: &str| {
                res.headers()
                    .get(n)
                    .map(|v| v.to_str().unwrap().to_owned())
                    .unwrap_or_default()
            };
            let (ct, vary) = (header("content-type"), header("vary"));
            let body = res.body().await.unwrap();
            (ct, vary, String::from_utf8(body.to_vec()).unwrap())
        }
    };

    // Prometheus (2.x and 3.x ask for OpenMetrics first).
    let prometheus = "application/openmetrics-text;version=1.0.0;q=0.5,\
        application/openmetrics-text;version=0.0.1;q=0.4,\
        text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
    let (ct, vary, open) = scrape(Some(prometheus)).await;
    assert_eq!(
        ct,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert_eq!(vary, "Accept");
    let (_, open_samples) = parse(&open);

    // A scraper that predates OpenMetrics, and promtool's reader.
    let old = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;\
        encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.1";
    for accept in [old, "text/plain"] {
        let (ct, vary, text) = scrape(Some(accept)).await;
        assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8", "{accept}");
        assert_eq!(vary, "Accept");
        let samples = parse_text(&text);
        assert_eq!(keyed(&samples), keyed(&open_samples), "the same samples");
        let ok = value(
            &samples,
            "dispatch_tasks_total",
            &[("service", "svc"), ("outcome", "success")],
        );
        assert_eq!(ok, 3.0);
        assert!(
            text.contains("# TYPE dispatch_tasks_total counter\n"),
            "{text}"
        );
    }

    // No preference: OpenMetrics, as before.
    for accept in [None, Some("*/*")] {
        let (ct, _, text) = scrape(accept).await;
        assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
        assert!(text.ends_with("# EOF\n"));
    }
    handle.stop(false).await;
    d.shutdown(Duration::from_secs(1)).await;
}
