//! Text from outside (a handler's error, a command's stderr, a dead-letter reason, bytes
//! a database returned) made storable on every backend. PostgreSQL refuses NUL in
//! `text`, MySQL's `TEXT` and `VARCHAR` columns have byte and character limits, and a
//! store that refuses a failure's message turns every retry into a lost lease. For
//! transport crates; not semver-stable.

/// Longest `last_error` kept, in bytes (its end, where the error usually is). Far below
/// MySQL's 64 KiB `TEXT`.
pub const ERROR_KEPT: usize = 8 * 1024;

/// Longest dead-letter reason kept, in bytes (MySQL's `reason` is a `VARCHAR(64)`).
pub const REASON_KEPT: usize = 64;

/// Longest denormalised `kind` column kept, in bytes (MySQL's is a `VARCHAR(255)`); the
/// envelope keeps the whole kind.
pub const KIND_KEPT: usize = 255;

/// What stands in for a NUL: visible, so that an operator sees something was there.
const NUL_STANDIN: &str = "\u{fffd}";

/// `text` with every NUL replaced by U+FFFD, cut to `limit` bytes at a character
/// boundary, keeping its start (`tail` false) or its end; a cut is marked with `…`
/// (which the limit counts).
pub fn bounded(text: &str, limit: usize, tail: bool) -> String {
    let text = if text.contains('\0') {
        text.replace('\0', NUL_STANDIN)
    } else {
        text.to_owned()
    };
    if text.len() <= limit {
        return text;
    }
    let room = limit.saturating_sub('…'.len_utf8());
    if tail {
        let mut from = text.len() - room;
        while !text.is_char_boundary(from) {
            from += 1;
        }
        format!("…{}", &text[from..])
    } else {
        let mut to = room;
        while !text.is_char_boundary(to) {
            to -= 1;
        }
        format!("{}…", &text[..to])
    }
}

/// A failure's message as stored in `last_error`: NUL-free, its last [`ERROR_KEPT`]
/// bytes.
pub fn error_text(error: &str) -> String {
    bounded(error, ERROR_KEPT, true)
}

/// A dead-letter reason as stored: NUL-free, its first [`REASON_KEPT`] bytes.
pub fn reason_text(reason: &str) -> String {
    bounded(reason, REASON_KEPT, false)
}

/// The denormalised `kind` column of a stored envelope: NUL-free, its first
/// [`KIND_KEPT`] bytes. Only an index: the envelope JSON keeps the kind as published.
pub fn kind_column(kind: &str) -> String {
    bounded(kind, KIND_KEPT, false)
}

/// Text from bytes a database (or a command) returned, with invalid UTF-8 replaced
/// rather than failing.
pub fn lossy(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nuls_are_replaced_and_long_text_is_cut_at_a_character_boundary() {
        assert_eq!(error_text("a\0b"), "a\u{fffd}b");
        let long = format!("{}é the cause", "x".repeat(20_000));
        let kept = error_text(&long);
        assert!(kept.len() <= ERROR_KEPT, "{}", kept.len());
        assert!(kept.starts_with('…') && kept.ends_with("é the cause"));
        let head = bounded(&"é".repeat(100), 11, false);
        assert!(head.len() <= 11 && head.ends_with('…'), "{head}");
        assert_eq!(reason_text("max_attempts"), "max_attempts");
        assert!(reason_text(&"r".repeat(100)).len() <= REASON_KEPT);
        assert_eq!(lossy(b"ok\xff".to_vec()), "ok\u{fffd}");
    }
}
