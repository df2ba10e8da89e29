//! The `redis.sentinel` object: a master found through Redis Sentinel.
//!
//! ```json
//! "redis": { "url": "redis://:data-password@mymaster/0",
//!            "sentinel": { "master": "mymaster",
//!                          "nodes": ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"] } }
//! ```
//!
//! The master's address changes with every failover, so no URL can hold
//! it: the sentinels (`nodes`) give it. `url` keeps what does not change,
//! how to talk to whichever node is master: its scheme (`rediss://` for
//! TLS), its userinfo (the data nodes' `AUTH`) and its db, with the
//! master's name where an address would be (no port), so that every log
//! line shows `redis://<redacted>@mymaster/0`. Each node is a sentinel's
//! `redis://[user:password@]host:port` (`rediss://` for TLS); the
//! userinfo is the sentinels' own `AUTH`, one for all of them (the client
//! sends the same to each), so every node has the same scheme and
//! userinfo.

use std::fmt;

use serde::Deserialize;

use super::url::{redact_url, url_secrets};

/// The most sentinels listed.
const MAX_NODES: usize = 16;
/// The longest master name.
const MAX_MASTER: usize = 128;

/// The object as written.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSentinel {
    pub master: String,
    pub nodes: Vec<String>,
}

/// The validated `redis.sentinel` object (feature `redis`): where the
/// master named `master` is found. Its `Debug` shows the nodes redacted.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SentinelConfig {
    /// The master's name, as the sentinels monitor it (`sentinel monitor
    /// <master> ...`).
    pub master: String,
    /// The sentinels, `redis://[user:password@]host:port` or `rediss://`;
    /// asked in this order. They may hold a password: log
    /// [`SentinelConfig::redacted_nodes`], never these.
    pub nodes: Vec<String>,
}

impl fmt::Debug for SentinelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelConfig")
            .field("master", &self.master)
            .field("nodes", &self.redacted_nodes())
            .finish()
    }
}

impl SentinelConfig {
    /// The nodes with their userinfo and query replaced by `<redacted>`.
    pub fn redacted_nodes(&self) -> Vec<String> {
        self.nodes.iter().map(|n| redact_url(n)).collect()
    }

    /// The nodes' secrets (to scrub from messages), longest first.
    pub(super) fn secrets(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .nodes
            .iter()
            .map(|n| (n.clone(), redact_url(n)))
            .collect();
        for n in &self.nodes {
            out.extend(url_secrets(n).into_iter().map(|s| (s, "<redacted>".into())));
        }
        out
    }
}

/// A URL's parts this module checks: scheme, userinfo, host, port, and
/// what follows the authority (path, query).
#[derive(Debug, PartialEq, Eq)]
struct Parts<'a> {
    scheme: &'a str,
    userinfo: Option<&'a str>,
    host: &'a str,
    port: Option<&'a str>,
    rest: &'a str,
}

fn parts(url: &str) -> Option<Parts<'_>> {
    let (scheme, after) = url.split_once("://")?;
    let end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let (authority, rest) = after.split_at(end);
    let (userinfo, hostport) = match authority.rfind('@') {
        Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
        None => (None, authority),
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let close = v6.find(']')?;
        let port = v6[close + 1..].strip_prefix(':');
        (&hostport[..close + 2], port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    Some(Parts {
        scheme,
        userinfo,
        host,
        port,
        rest,
    })
}

/// Validates the object against the section's `url` and `cluster`;
/// errors are `(field, message)`.
pub(super) fn validate_sentinel(
    raw: &RawSentinel,
    url: &str,
    cluster: bool,
) -> Result<SentinelConfig, (String, String)> {
    let err = |f: &str, m: String| Err((format!("redis.{f}"), m));
    if cluster {
        return err(
            "sentinel",
            "`cluster: true` and `sentinel` exclude each other: a Cluster finds its masters itself"
                .into(),
        );
    }
    let m = &raw.master;
    if m.is_empty()
        || m.len() > MAX_MASTER
        || !m
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return err(
            "sentinel.master",
            format!("expected the master's name: 1..={MAX_MASTER} letters, digits, `.`, `_`, `-`"),
        );
    }
    if raw.nodes.is_empty() || raw.nodes.len() > MAX_NODES {
        return err(
            "sentinel.nodes",
            format!("expected 1..={MAX_NODES} sentinels, `redis://host:port`"),
        );
    }
    let mut first: Option<Parts<'_>> = None;
    for (i, node) in raw.nodes.iter().enumerate() {
        let field = format!("sentinel.nodes[{i}]");
        let Some(p) = parts(node) else {
            return err(&field, "expected a redis:// or rediss:// URL".into());
        };
        if !matches!(p.scheme, "redis" | "rediss") {
            return err(&field, "expected a redis:// or rediss:// URL".into());
        }
        if p.host.is_empty()
            || !p
                .port
                .is_some_and(|x| x.parse::<u16>().is_ok_and(|n| n > 0))
        {
            return err(
                &field,
                "expected a sentinel's host:port (the port is required: sentinels usually listen on 26379)"
                    .into(),
            );
        }
        if !matches!(p.rest, "" | "/" | "/0") {
            return err(
                &field,
                "a sentinel has no db nor query: the data nodes' db goes in `url`".into(),
            );
        }
        if let Some(f) = &first {
            if f.scheme != p.scheme || f.userinfo != p.userinfo {
                return err(
                    &field,
                    "every sentinel needs the scheme and the user and password of the first (one AUTH for all)"
                        .into(),
                );
            }
            if raw.nodes[..i]
                .iter()
                .any(|n| parts(n).is_some_and(|q| (q.host, q.port) == (p.host, p.port)))
            {
                return err(&field, "listed twice".into());
            }
        } else {
            first = Some(p);
        }
    }
    let named = parts(url).filter(|p| {
        matches!(p.scheme, "redis" | "rediss")
            && p.host == raw.master
            && p.port.is_none()
            && !p.rest.contains(['?', '#'])
    });
    if named.is_none() {
        return err(
            "url",
            format!(
                "with `sentinel`, the URL names the master, not an address: \
                 `redis://[user:password@]{}[/db]` (or rediss://), no port; the sentinels give the address",
                raw.master
            ),
        );
    }
    Ok(SentinelConfig {
        master: raw.master.clone(),
        nodes: raw.nodes.clone(),
    })
}

/// Whether `url` is over TLS.
pub(super) fn is_tls(url: &str) -> bool {
    url.starts_with("rediss://")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(master: &str, nodes: &[&str]) -> RawSentinel {
        RawSentinel {
            master: master.into(),
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn urls_split_into_their_parts() {
        assert_eq!(
            parts("redis://u:p@h:26379/0"),
            Some(Parts {
                scheme: "redis",
                userinfo: Some("u:p"),
                host: "h",
                port: Some("26379"),
                rest: "/0"
            })
        );
        let v6 = parts("rediss://[::1]:26379").unwrap();
        assert_eq!((v6.host, v6.port), ("[::1]", Some("26379")));
        let named = parts("redis://:p@mymaster/2").unwrap();
        assert_eq!(
            (named.host, named.port, named.rest),
            ("mymaster", None, "/2")
        );
        assert_eq!(parts("mymaster"), None);
    }

    #[test]
    fn a_good_object_passes() {
        let nodes = [
            "redis://:sp@127.0.0.1:26379",
            "redis://:sp@127.0.0.1:26380/",
        ];
        let s = validate_sentinel(
            &raw("my-master.1", &nodes),
            "redis://:dp@my-master.1/3",
            false,
        )
        .unwrap();
        assert_eq!(s.master, "my-master.1");
        assert_eq!(s.nodes.len(), 2);
        let dbg = format!("{s:?}");
        assert!(!dbg.contains("sp"), "{dbg}");
        assert!(dbg.contains("redis://<redacted>@127.0.0.1:26379"), "{dbg}");
        assert!(validate_sentinel(&raw("m", &["rediss://h:1"]), "rediss://m", false).is_ok());
    }

    #[test]
    fn bad_objects_are_refused_naming_the_field() {
        let ok = ["redis://127.0.0.1:26379"];
        for (master, nodes, url, cluster, field) in [
            ("m", &ok[..], "redis://m/0", true, "redis.sentinel"),
            ("", &ok[..], "redis://m/0", false, "redis.sentinel.master"),
            (
                "a b",
                &ok[..],
                "redis://a b/0",
                false,
                "redis.sentinel.master",
            ),
            ("m", &[][..], "redis://m/0", false, "redis.sentinel.nodes"),
            (
                "m",
                &["http://h:1"][..],
                "redis://m",
                false,
                "redis.sentinel.nodes[0]",
            ),
            (
                "m",
                &["redis://h"][..],
                "redis://m",
                false,
                "redis.sentinel.nodes[0]",
            ),
            (
                "m",
                &["redis://h:0"][..],
                "redis://m",
                false,
                "redis.sentinel.nodes[0]",
            ),
            (
                "m",
                &["redis://:1"][..],
                "redis://m",
                false,
                "redis.sentinel.nodes[0]",
            ),
            (
                "m",
                &["redis://h:1/2"][..],
                "redis://m",
                false,
                "redis.sentinel.nodes[0]",
            ),
            (
                "m",
                &["redis://h:1?x=1"][..],
                "redis://m",
                false,
                "redis.sentinel.nodes[0]",
            ),
            (
                "m",
                &["redis://h:1", "rediss://h:2"][..],
                "redis://m",
                false,
                "redis.sentinel.nodes[1]",
            ),
            (
                "m",
                &["redis://:a@h:1", "redis://:b@h:2"][..],
                "redis://m",
                false,
                "redis.sentinel.nodes[1]",
            ),
            (
                "m",
                &["redis://h:1", "redis://h:1/"][..],
                "redis://m",
                false,
                "redis.sentinel.nodes[1]",
            ),
            ("m", &ok[..], "redis://127.0.0.1:6379/0", false, "redis.url"),
            ("m", &ok[..], "redis://m:6379/0", false, "redis.url"),
            ("m", &ok[..], "redis://other/0", false, "redis.url"),
            ("m", &ok[..], "redis+unix:///m", false, "redis.url"),
        ] {
            let e = validate_sentinel(&raw(master, nodes), url, cluster).unwrap_err();
            assert_eq!(e.0, field, "{master} {nodes:?} {url}: {e:?}");
        }
        let long = "m".repeat(MAX_MASTER + 1);
        let e = validate_sentinel(&raw(&long, &ok), &format!("redis://{long}"), false);
        assert_eq!(e.unwrap_err().0, "redis.sentinel.master");
        let many: Vec<String> = (1..=MAX_NODES + 1)
            .map(|p| format!("redis://h:{p}"))
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let e = validate_sentinel(&raw("m", &many), "redis://m", false);
        assert_eq!(e.unwrap_err().0, "redis.sentinel.nodes");
    }

    #[test]
    fn the_nodes_secrets_are_listed() {
        let s = SentinelConfig {
            master: "m".into(),
            nodes: vec!["redis://u:s%40p@h:1".into()],
        };
        let secrets: Vec<String> = s.secrets().into_iter().map(|(a, _)| a).collect();
        assert!(secrets.contains(&"s%40p".to_string()), "{secrets:?}");
        assert!(secrets.contains(&"s@p".to_string()), "{secrets:?}");
        assert!(
            secrets.contains(&"redis://u:s%40p@h:1".to_string()),
            "{secrets:?}"
        );
    }
}
