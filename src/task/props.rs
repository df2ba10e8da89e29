//! Property tests: building and preparing a task never panics, and an
//! accepted path never leaves its endpoint's prefix however a server
//! normalises it.

use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::*;

/// Pieces that hostile paths are made of.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(".".to_owned()),
        Just("..".to_owned()),
        Just("/".to_owned()),
        Just("\\".to_owned()),
        Just("%2e".to_owned()),
        Just("%2E".to_owned()),
        Just("%2f".to_owned()),
        Just("%2F".to_owned()),
        Just("%5c".to_owned()),
        Just("%5C".to_owned()),
        Just("%25".to_owned()),
        Just("%".to_owned()),
        Just(";".to_owned()),
        Just("?".to_owned()),
        Just("//".to_owned()),
        Just("://".to_owned()),
        Just("a".to_owned()),
        Just("admin".to_owned()),
        Just("x:y".to_owned()),
        "[a-z0-9%./\\\\?;:]{0,4}",
    ]
}

fn hostile_path() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::collection::vec(piece(), 0..14).prop_map(|v| v.concat()),
        any::<String>(),
    ]
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::MAX),
        Just(Duration::ZERO),
        Just(crate::algo::time::MAX_DURATION),
        Just(crate::algo::time::MAX_DURATION + Duration::from_nanos(1)),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (0u64..100_000).prop_map(Duration::from_millis),
    ]
}

/// Percent-decodes repeatedly (at most `rounds` times), `\` read as `/`.
fn decode_all(s: &str, rounds: usize) -> String {
    let mut cur = s.replace('\\', "/").into_bytes();
    for _ in 0..rounds {
        let mut next = Vec::with_capacity(cur.len());
        let mut i = 0;
        while i < cur.len() {
            let hex = cur
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            match (cur[i], hex) {
                (b'%', Some(b)) if !cur[i + 1].is_ascii_whitespace() && cur[i + 1] != b'+' => {
                    next.push(b);
                    i += 3;
                }
                (c, _) => {
                    next.push(c);
                    i += 1;
                }
            }
        }
        if next == cur {
            break;
        }
        cur = next;
        cur = String::from_utf8_lossy(&cur)
            .replace('\\', "/")
            .into_bytes();
    }
    String::from_utf8_lossy(&cur).into_owned()
}

/// RFC 3986 §5.2.4 remove_dot_segments, with Tomcat's `;params` dropped.
fn normalise(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let segs: Vec<&str> = path.split('/').collect();
    let last = segs.len() - 1;
    for (i, seg) in segs.iter().enumerate() {
        let name = seg.split(';').next().unwrap_or(seg);
        match name {
            "." => {}
            ".." => {
                if out.len() > 1 {
                    out.pop();
                }
            }
            _ => out.push(seg),
        }
        if i == last && (name == "." || name == "..") {
            out.push("");
        }
    }
    out.join("/")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn task_building_and_prepare_never_panic(
        method in "[A-Z!#$%&'*+.^_`|~-]{0,12}",
        path in hostile_path(),
        headers in prop::collection::vec((any::<String>(), any::<String>()), 0..4),
        timeout in prop::option::of(duration()),
        within in prop::option::of(duration()),
        at in prop::option::of(0u64..u64::MAX / 4),
        id in any::<u64>(),
    ) {
        let method = Method::from_bytes(method.as_bytes()).unwrap_or(Method::GET);
        let mut t = Task::new("svc", method, path).id(id);
        for (k, v) in headers {
            t = t.header(k, v);
        }
        if let Some(d) = timeout {
            t = t.timeout(d);
        }
        if let Some(d) = within {
            t = t.deadline_in(d);
        }
        let now = Instant::now();
        if let Some(ns) = at {
            t = t.deadline(crate::algo::time::add(now, Duration::from_nanos(ns)));
        }
        let _ = t.clone().prepare(id, now);
        let _ = t.to_string();
    }

    #[test]
    fn accepted_paths_stay_under_the_endpoint_prefix(path in hostile_path()) {
        let prefix = "http://h/v1/";
        if let Ok(job) = Task::get("svc", path.clone()).prepare(1, Instant::now()) {
            let url = format!("{prefix}{}", job.path());
            prop_assert!(url.starts_with(prefix));
            let target = &url["http://h".len()..];
            let part = target.split('?').next().unwrap_or(target);
            let decoded = decode_all(part, 8);
            for seg in decoded.split('/') {
                let name = seg.split(';').next().unwrap_or(seg);
                prop_assert!(name != "." && name != "..", "{path:?} -> {url} -> {decoded}");
            }
            prop_assert!(normalise(&decoded).starts_with("/v1/"), "{path:?} -> {decoded}");
        }
    }
}

#[test]
fn the_issue_s_escapes_are_refused() {
    for p in [
        "../../admin",
        "/%2e%2e/admin",
        "..%2f..%2fadmin",
        "/.%2e/admin",
        r"\..\..\admin",
    ] {
        assert!(Task::get("s", p).prepare(1, Instant::now()).is_err(), "{p}");
    }
    assert_eq!(normalise("/v1/../../admin"), "/admin");
}
