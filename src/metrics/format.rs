//! The two exposition formats of `GET /metrics`, chosen by the scraper's
//! `Accept`: OpenMetrics 1.0.0 (what prometheus-client encodes) or the
//! Prometheus text format 0.0.4 (what `promtool check metrics` and older
//! scrapers read).
//!
//! **Negotiation**: the media range of the highest `q` among those served
//! wins (the first listed on a tie); `application/openmetrics-text` gives
//! OpenMetrics, `text/plain` (or `text/*`) the text format. Without either
//! (no `Accept`, `*/*`, only other types) the answer is OpenMetrics, as it
//! was before there was a choice. Prometheus asks for OpenMetrics first;
//! scrapers that predate it (and Telegraf, vmagent) ask for `text/plain`;
//! for promtool, ask for it too: `curl -H 'Accept: text/plain' ... |
//! promtool check metrics`.
//!
//! **Conversion** from OpenMetrics to text 0.0.4 (the formats differ only
//! in the comment lines and suffixes): a counter family is named with its
//! `_total` suffix in `# HELP` and `# TYPE`, as its samples are (otherwise
//! the text parser sees a sampleless counter and an untyped `_total`
//! family); `# UNIT` and `# EOF` lines go; `_created` samples and exemplars
//! go; the OpenMetrics-only types become the nearest text ones (`info` and
//! `stateset` a gauge, `gaugehistogram` a histogram, `unknown` untyped).

/// An exposition format of `GET /metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Format {
    /// The Prometheus text format, version 0.0.4.
    Text,
    /// OpenMetrics 1.0.0 text.
    OpenMetrics,
}

impl Format {
    /// The format to answer a request whose `Accept` header is `accept`
    /// (all its values joined with `,`), as the module docs describe.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let mut best: Option<(f32, Format)> = None;
        for range in accept.unwrap_or("").split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim();
            let mut q = 1.0f32;
            for p in parts {
                if let Some((k, v)) = p.split_once('=') {
                    if k.trim().eq_ignore_ascii_case("q") {
                        q = v.trim().parse().unwrap_or(0.0);
                    }
                }
            }
            let format = if media.eq_ignore_ascii_case("application/openmetrics-text") {
                Format::OpenMetrics
            } else if media.eq_ignore_ascii_case("text/plain")
                || media.eq_ignore_ascii_case("text/*")
            {
                Format::Text
            } else {
                continue;
            };
            // `q` is 0 to 1; NaN or 0 (and anything unparsable) is "not this".
            if q > 0.0 && best.is_none_or(|(b, _)| q > b) {
                best = Some((q, format));
            }
        }
        best.map_or(Format::OpenMetrics, |(_, f)| f)
    }

    /// The `Content-Type` of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => TEXT_CONTENT_TYPE,
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }
}

/// `Content-Type` of the Prometheus text format 0.0.4.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `Content-Type` of OpenMetrics 1.0.0 text.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The text format 0.0.4 of an OpenMetrics exposition (see the module
/// docs for what changes).
pub fn openmetrics_to_text(open: &str) -> String {
    let mut out = String::with_capacity(open.len());
    // The family being read: its name in OpenMetrics, its type, and the
    // `# HELP` line waiting for its `# TYPE` (which may rename it).
    let mut family = String::new();
    let mut kind = "";
    let mut help: Option<&str> = None;
    for line in open.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some(h) = help.take() {
                push_help(&mut out, &family, h);
            }
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            family = name.to_owned();
            kind = "";
            help = Some(text);
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            family = name.to_owned();
            kind = match ty {
                "counter" => "counter",
                "gauge" => "gauge",
                "histogram" | "gaugehistogram" => "histogram",
                "summary" => "summary",
                "info" | "stateset" => "gauge",
                _ => "untyped",
            };
            let renamed = text_name(name, ty);
            if let Some(h) = help.take() {
                push_help(&mut out, &renamed, h);
            }
            out.push_str("# TYPE ");
            out.push_str(&renamed);
            out.push(' ');
            out.push_str(kind);
            out.push('\n');
            continue;
        }
        if let Some(h) = help.take() {
            push_help(&mut out, &family, h);
        }
        if line.starts_with("# UNIT ") || line == "# EOF" || line.is_empty() {
            continue;
        }
        if line.starts_with('#') {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let name = line.split(['{', ' ']).next().unwrap_or("");
        let created = name
            .strip_suffix("_created")
            .is_some_and(|f| f == family || f == format!("{family}_total"));
        if created && matches!(kind, "counter" | "histogram" | "summary") {
            continue;
        }
        out.push_str(without_exemplar(line));
        out.push('\n');
    }
    if let Some(h) = help.take() {
        push_help(&mut out, &family, h);
    }
    out
}

/// A family's name in the text format: a counter's with `_total`, an
/// info's with `_info` (as their samples are named).
fn text_name(name: &str, ty: &str) -> String {
    match ty {
        "counter" if !name.ends_with("_total") => format!("{name}_total"),
        "info" if !name.ends_with("_info") => format!("{name}_info"),
        _ => name.to_owned(),
    }
}

/// `# HELP name text`, with only the escapes the text format knows
/// (`\\` and `\n`: OpenMetrics' `\"` is a plain quote there).
fn push_help(out: &mut String, name: &str, text: &str) {
    out.push_str("# HELP ");
    out.push_str(name);
    out.push(' ');
    out.push_str(&text.replace("\\\"", "\""));
    out.push('\n');
}

/// A sample line without its exemplar (` # {labels} value [timestamp]`
/// after the value), which the text format has no place for.
fn without_exemplar(line: &str) -> &str {
    // A label value may hold " # {" itself, so look past the label set.
    let after_labels = match line.find('{') {
        Some(open) => closing_brace(line, open).map_or(0, |c| c + 1),
        None => 0,
    };
    match line[after_labels..].find(" # {") {
        Some(at) => &line[..after_labels + at],
        None => line,
    }
}

/// The index of the `}` closing the label set opened at `open`, skipping
/// quoted label values (with their escapes).
fn closing_brace(line: &str, open: usize) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, b) in line.bytes().enumerate().skip(open + 1) {
        match (quoted, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') => quoted = false,
            (false, _, b'"') => quoted = true,
            (false, _, b'}') => return Some(i),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_asks_for_openmetrics_first() {
        let prometheus = "application/openmetrics-text;version=1.0.0;q=0.5,\
            application/openmetrics-text;version=0.0.1;q=0.4,\
            text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        let prefers_text = "application/openmetrics-text;q=0.2, text/plain;version=0.0.4;q=0.9";
        assert_eq!(Format::negotiate(Some(prefers_text)), Format::Text);
    }

    #[test]
    fn older_scrapers_get_the_text_format() {
        let old_prometheus = "application/vnd.google.protobuf;\
            proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,\
            text/plain;version=0.0.4;q=0.3,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(old_prometheus)), Format::Text);
        assert_eq!(Format::negotiate(Some("text/plain")), Format::Text);
        assert_eq!(Format::negotiate(Some("text/*")), Format::Text);
    }

    #[test]
    fn no_choice_gets_openmetrics_as_before() {
        assert_eq!(Format::negotiate(None), Format::OpenMetrics);
        assert_eq!(Format::negotiate(Some("*/*")), Format::OpenMetrics);
        assert_eq!(
            Format::negotiate(Some("application/json")),
            Format::OpenMetrics
        );
        assert_eq!(Format::negotiate(Some("")), Format::OpenMetrics);
    }

    #[test]
    fn q_zero_refuses_a_type_and_ties_go_to_the_first() {
        let refused = "application/openmetrics-text;q=0, text/plain;q=0.1";
        assert_eq!(Format::negotiate(Some(refused)), Format::Text);
        let only_refused = "text/plain; q=0";
        assert_eq!(Format::negotiate(Some(only_refused)), Format::OpenMetrics);
        let tie = "APPLICATION/OPENMETRICS-TEXT, text/plain";
        assert_eq!(Format::negotiate(Some(tie)), Format::OpenMetrics);
        let bad_q = "text/plain;q=x";
        assert_eq!(Format::negotiate(Some(bad_q)), Format::OpenMetrics);
    }

    #[test]
    fn counters_are_named_with_total_units_eof_and_created_go() {
        let open = "\
# HELP dispatch_tasks Tasks ended, by outcome.
# TYPE dispatch_tasks counter
dispatch_tasks_total{service=\"a\"} 3
dispatch_tasks_created{service=\"a\"} 1700000000.0
# HELP dispatch_queue_depth Queued.
# TYPE dispatch_queue_depth gauge
dispatch_queue_depth{service=\"a\"} 0
# HELP dispatch_task_duration_seconds Task \\\"duration\\\".
# TYPE dispatch_task_duration_seconds histogram
# UNIT dispatch_task_duration_seconds seconds
dispatch_task_duration_seconds_sum 0.5
dispatch_task_duration_seconds_count 1
dispatch_task_duration_seconds_bucket{le=\"+Inf\"} 1 # {trace_id=\"x\"} 0.5
# HELP build Build.
# TYPE build info
build_info{v=\"1 # {\"} 1
# EOF
";
        let expected = "\
# HELP dispatch_tasks_total Tasks ended, by outcome.
# TYPE dispatch_tasks_total counter
dispatch_tasks_total{service=\"a\"} 3
# HELP dispatch_queue_depth Queued.
# TYPE dispatch_queue_depth gauge
dispatch_queue_depth{service=\"a\"} 0
# HELP dispatch_task_duration_seconds Task \"duration\".
# TYPE dispatch_task_duration_seconds histogram
dispatch_task_duration_seconds_sum 0.5
dispatch_task_duration_seconds_count 1
dispatch_task_duration_seconds_bucket{le=\"+Inf\"} 1
# HELP build_info Build.
# TYPE build_info gauge
build_info{v=\"1 # {\"} 1
";
        assert_eq!(openmetrics_to_text(open), expected);
    }

    #[test]
    fn a_counter_already_named_total_keeps_its_name() {
        let open = "# TYPE x_total counter\nx_total 1\n# EOF\n";
        assert_eq!(
            openmetrics_to_text(open),
            "# TYPE x_total counter\nx_total 1\n"
        );
    }
}
