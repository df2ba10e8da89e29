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

/// A field's value: text, or the bytes of a value that is not UTF-8 (a
/// permanent error of its entry, never parsed).
pub(crate) type FieldValue = Result<String, Vec<u8>>;

/// An entry's fields, as read.
pub(crate) type Fields = Vec<(String, FieldValue)>;

/// The value of field `name`, if the entry has it.
pub(super) fn field<'a>(fields: &'a [(String, FieldValue)], name: &str) -> Option<&'a FieldValue> {
    fields.iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

fn value(v: &Value) -> Option<FieldValue> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8(b.clone()).map_err(|e| e.into_bytes())),
        other => text(other).map(Ok),
    }
}

/// `[[id, [f, v, ...]], ...]`; entries deleted meanwhile (nil fields) are
/// skipped. An entry whose fields are not text is kept (its `task` field
/// missing or not UTF-8), so that it is dead-lettered, not left pending.
pub(super) fn entries(v: &Value) -> Vec<(String, Fields)> {
    let Value::Array(list) = v else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|e| {
            let Value::Array(e) = e else { return None };
            let id = text(e.first()?)?;
            let raw = e.get(1)?;
            if matches!(raw, Value::Nil) {
                return None;
            }
            let fields = pairs(raw)
                .into_iter()
                .filter_map(|(k, v)| Some((k, value(&v)?)))
                .collect::<Vec<_>>();
            Some((id, fields))
        })
        .collect()
}

/// An `XREADGROUP` reply for one stream: its entries.
pub(super) fn read_reply(v: &Value) -> Vec<(String, Fields)> {
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
