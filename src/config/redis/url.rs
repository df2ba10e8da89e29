//! The Redis URL's secrets: where its userinfo and query are, their
//! redacted form, and the strings to scrub from error messages.

/// Where the userinfo of `url` is: the byte range between `://` and the
/// last `@` before the path.
fn userinfo(url: &str) -> Option<(usize, usize)> {
    let start = url.find("://")? + 3;
    let rest = &url[start..];
    let host_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let at = rest[..host_end].rfind('@')?;
    Some((start, start + at))
}

/// `url` with its userinfo and query replaced by `<redacted>`.
pub(crate) fn redact_url(url: &str) -> String {
    let mut out = match userinfo(url) {
        Some((a, b)) => format!("{}<redacted>{}", &url[..a], &url[b..]),
        None => url.to_owned(),
    };
    if let Some(q) = out.find('?') {
        out.truncate(q);
        out.push_str("?<redacted>");
    }
    out
}

/// The secrets `url` holds, as written and percent-decoded: its userinfo,
/// the password in it, and its query's values.
pub(super) fn url_secrets(url: &str) -> Vec<String> {
    let mut raw = Vec::new();
    if let Some((a, b)) = userinfo(url) {
        let info = &url[a..b];
        raw.push(info.to_owned());
        if let Some((_, pw)) = info.split_once(':') {
            raw.push(pw.to_owned());
        }
    }
    if let Some((_, q)) = url.split_once('?') {
        raw.extend(
            q.split('&')
                .filter_map(|kv| kv.split_once('='))
                .map(|(_, v)| v.to_owned()),
        );
    }
    let mut all: Vec<String> = raw
        .iter()
        .flat_map(|s| [s.clone(), percent_decode(s)])
        .filter(|s| !s.is_empty())
        .collect();
    // Longest first: a password inside the userinfo is replaced after it.
    all.sort_by_key(|s| std::cmp::Reverse(s.len()));
    all.dedup();
    all
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn the_url_is_redacted_in_debug_and_messages() {
        use super::redact_url;
        assert_eq!(
            redact_url("redis://app:s3cr%40t@r.example:6379/0"),
            "redis://<redacted>@r.example:6379/0"
        );
        assert_eq!(redact_url("rediss://:pw@h/1"), "rediss://<redacted>@h/1");
        assert_eq!(redact_url("redis://h:6379/0"), "redis://h:6379/0");
        assert_eq!(
            redact_url("redis+unix:///run/r.sock?db=1&pass=hunter2"),
            "redis+unix:///run/r.sock?<redacted>"
        );
        // An `@` in the path is not userinfo.
        assert_eq!(redact_url("unix:///tmp/a@b"), "unix:///tmp/a@b");
        let c = Config::from_json(
            r#"{"redis":{"url":"redis://app:s3cr%40t@127.0.0.1:6379/0"},
                "services":[{"name":"a","endpoints":[{"address":"http://h/"}]}]}"#,
        );
        // Without the feature the section is refused: nothing to show.
        let Ok(c) = c else { return };
        let r = c.redis.clone().unwrap();
        let dbg = format!("{r:?} {c:?}");
        assert!(!dbg.contains("s3cr"), "{dbg}");
        assert!(dbg.contains("redis://<redacted>@127.0.0.1:6379/0"), "{dbg}");
        let msg =
            r.scrub("WRONGPASS for app:s3cr%40t (s3cr@t) at redis://app:s3cr%40t@127.0.0.1:6379/0");
        assert!(!msg.contains("s3cr"), "{msg}");
    }
}
