//! A message's payload as people and the JSON API show it.

/// A dead letter as JSON with its payload beside the listed fields: the decoded
/// payload, or the stored text of a malformed message (under `raw`, as without
/// `--payload`).
pub(crate) fn with_payload(d: &switchyard::DeadLetter) -> serde_json::Value {
    let mut row = serde_json::to_value(d).unwrap_or(serde_json::Value::Null);
    if let serde_json::Value::Object(fields) = &mut row {
        fields.insert(
            "payload".to_owned(),
            d.envelope
                .as_ref()
                .map_or(serde_json::Value::Null, payload_value),
        );
    }
    row
}

/// The payload as people read it: pretty JSON, or the stored text of a malformed
/// message, which is all there is of it.
pub(crate) fn payload_text(d: &switchyard::DeadLetter) -> String {
    match (&d.envelope, &d.raw) {
        (Some(e), _) => serde_json::to_string_pretty(&payload_value(e)).unwrap_or_default(),
        (None, Some(raw)) => format!("(malformed, stored as) {raw}"),
        (None, None) => "(none)".to_owned(),
    }
}

pub(crate) fn payload_value(e: &switchyard::Envelope) -> serde_json::Value {
    // Stored as valid JSON by every transport; the text itself if it ever is not.
    serde_json::from_str(e.payload.get())
        .unwrap_or_else(|_| serde_json::Value::String(e.payload.get().to_owned()))
}
