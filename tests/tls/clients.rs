//! What real clients found over HTTPS (issue 23): the cause of a TLS
//! failure stays in the result and its result line, also once the breaker
//! has opened; and a TLS failure is never retried on the same node.

use super::*;

use actix_dispatch::codec::{error_message, ResultLine};
use actix_dispatch::Rejection;

/// A service over `endpoint` alone with `extra` fields (no breaker
/// settings of [`config`]'s).
fn one(endpoint: String, extra: &str) -> Config {
    let json = format!(
        r#"{{"services":[{{"name":"svc","timeout":"10s","endpoints":[{endpoint}]{extra}}}]}}"#
    );
    Config::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

/// The result line's `error` (what the command line writes).
fn line_error(r: &TaskResult) -> String {
    ResultLine::from_result(r, None, None)
        .error
        .unwrap_or_default()
}

#[actix_rt::test]
async fn with_the_breaker_on_the_result_still_names_the_tls_failure() {
    let trusted = Pki::new("trusted CA");
    let stranger = Pki::new("stranger CA");
    let echo = Echo::start(Mode::TlsH2(stranger.server_config(LOCAL)));
    let d = no_retries(&echo, &trusted);
    // Two TLS failures: each result says which, in words.
    for _ in 0..2 {
        let r = get(&d).await;
        assert!(tls_error(&r), "{:?}", r.outcome);
        let err = r.attempts[0].error.as_deref().unwrap_or_default();
        assert!(err.contains("unknown authority"), "{err}");
        let line = line_error(&r);
        assert!(
            line.contains("TLS error") && line.contains("unknown authority"),
            "{line}"
        );
        assert_eq!(error_message(&r).as_deref(), Some(line.as_str()));
    }
    // The breaker is open now: the rejection names what opened it.
    let r = get(&d).await;
    match &r.outcome {
        Outcome::Rejected(Rejection::CircuitOpen { last_error, .. }) => {
            let e = last_error.as_deref().unwrap_or_default();
            assert!(
                e.contains("TLS error") && e.contains("unknown authority"),
                "{e}"
            );
        }
        other => panic!("not circuit_open: {other:?}"),
    }
    assert!(r.attempts.is_empty());
    let line = line_error(&r);
    assert!(line.starts_with("circuit open on every node"), "{line}");
    assert!(
        line.contains("last error: TLS error") && line.contains("unknown authority"),
        "{line}"
    );
    d.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn with_the_breaker_off_a_tls_failure_is_not_retried_on_the_same_node() {
    let trusted = Pki::new("trusted CA");
    let stranger = Pki::new("stranger CA");
    let echo = Echo::start(Mode::TlsH2(stranger.server_config(LOCAL)));
    let d = Dispatcher::start(one(
        endpoint(&echo),
        &format!(
            r#"{},"breaker":{{"enabled":false}},
               "retry":{{"max_retries":3,"backoff_base":"1ms","backoff_max":"1ms"}}"#,
            trusting(&trusted)
        ),
    ))
    .unwrap();
    for _ in 0..3 {
        let r = get(&d).await;
        assert_eq!(
            r.attempts.len(),
            1,
            "retried on the same node: {:?}",
            r.attempts
        );
        match &r.outcome {
            Outcome::Failure(f) => {
                assert_eq!(f.reason, actix_dispatch::FailReason::NotRetryable);
                assert_eq!(f.last, Some(AttemptOutcome::Error(ErrorKind::Tls)));
            }
            other => panic!("not a failure: {other:?}"),
        }
        let line = line_error(&r);
        assert!(line.contains("unknown authority"), "{line}");
    }
    let stats = d.stats().await;
    let svc = stats.service("svc").unwrap();
    assert_eq!(svc.nodes[0].total, 3, "one attempt per task");
    d.shutdown(Duration::from_secs(1)).await;
}
