//! Reading the replies of XREADGROUP, XAUTOCLAIM, XPENDING and XINFO.

use redis::Value;

pub(super) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// A flat `[k, v, k, v]` array or a map, as (name, value) pairs.
pub(super) fn pairs(v: &Value) -> Vec<(String, Value)> {
    match v {
        Value::Array(a) => a
            .chunks(2)
            .filter_map(|c| Some((text(c.first()?)?, c.get(1)?.clone())))
            .collect(),
        Value::Map(m) => m
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, v.clone())))
            .collect(),
        _ => Vec::new(),
    }
}

pub(super) fn field(fields: &[(String, String)], name: &str) -> Option<String> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

/// `[[id, [f, v, ...]], ...]`; entries deleted meanwhile (nil fields) are
/// skipped.
pub(super) fn entries(v: &Value) -> Vec<(String, Vec<(String, String)>)> {
    let Value::Array(list) = v else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|e| {
            let Value::Array(e) = e else { return None };
            let id = text(e.first()?)?;
            let fields = pairs(e.get(1)?)
                .into_iter()
                .filter_map(|(k, v)| Some((k, text(&v)?)))
                .collect::<Vec<_>>();
            (!fields.is_empty()).then_some((id, fields))
        })
        .collect()
}

/// An `XREADGROUP` reply for one stream: its entries.
pub(super) fn read_reply(v: &Value) -> Vec<(String, Vec<(String, String)>)> {
    match v {
        Value::Array(streams) => streams
            .iter()
            .filter_map(|s| match s {
                Value::Array(kv) => kv.get(1).map(entries),
                _ => None,
            })
            .flatten()
            .collect(),
        Value::Map(m) => m.iter().flat_map(|(_, e)| entries(e)).collect(),
        _ => Vec::new(),
    }
}

/// The delivery count of a one-entry `XPENDING` reply.
pub(super) fn delivery_count(v: &Value) -> Option<u64> {
    let Value::Array(rows) = v else { return None };
    let Value::Array(row) = rows.first()? else {
        return None;
    };
    text(row.get(3)?)?.parse().ok()
}
