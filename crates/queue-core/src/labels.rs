//! Message labels: what a message may carry, and how a claim selects by them.
//!
//! A label is a short name (`gpu`, `eu-west`, `tenant:42`). A message carries a few; a
//! worker that names labels claims only messages carrying at least one of them, and a
//! worker that names none claims every message.

use crate::error::{shown, Error, Result};

/// Labels one message may carry.
pub const MAX_LABELS: usize = 8;

/// Bytes in one label.
pub const MAX_LABEL_LEN: usize = 64;

/// Checks one label: 1 to 64 of `A-Z a-z 0-9 _ - . :`. The SQL stores keep a message's
/// labels in one column, separated by commas, so a comma can never be part of one.
pub fn check_label(label: &str) -> Result<()> {
    if crate::names::is_name(label, MAX_LABEL_LEN) {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!(
            "invalid label {}: expected 1 to {MAX_LABEL_LEN} of A-Z, a-z, 0-9, '_', '-', '.', ':'",
            shown(label)
        )))
    }
}

/// Checks a message's or a worker's labels and puts them in one order without
/// duplicates, so that equal sets are stored alike.
pub fn normalize(labels: Vec<String>) -> Result<Vec<String>> {
    for label in &labels {
        check_label(label)?;
    }
    let mut labels = labels;
    labels.sort();
    labels.dedup();
    if labels.len() > MAX_LABELS {
        return Err(Error::InvalidInput(format!(
            "{} labels: expected at most {MAX_LABELS}",
            labels.len()
        )));
    }
    Ok(labels)
}

/// The column value the SQL stores keep: `,a,b,` (so that `,a,` finds label `a` and
/// nothing else), or `None` for no labels.
pub fn column(labels: &[String]) -> Option<String> {
    if labels.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(labels.iter().map(|l| l.len() + 1).sum::<usize>() + 1);
    out.push(',');
    for label in labels {
        out.push_str(label);
        out.push(',');
    }
    Some(out)
}

/// What a claim filtered by `labels` searches the column for: `,a,` for each.
pub fn needles(labels: &[String]) -> Vec<String> {
    labels.iter().map(|l| format!(",{l},")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_checked_sorted_and_deduplicated() {
        let l = normalize(vec!["red".into(), "blue".into(), "red".into()]).expect("valid");
        assert_eq!(l, ["blue", "red"]);
        assert_eq!(column(&l).as_deref(), Some(",blue,red,"));
        assert_eq!(column(&[]), None);
        assert_eq!(needles(&l), [",blue,", ",red,"]);
        for bad in ["", "a,b", "with space", "ü", &"x".repeat(65)] {
            let err = normalize(vec![bad.to_owned()]).expect_err(bad).to_string();
            assert!(err.contains("invalid label"), "{err}");
        }
        let many: Vec<String> = (0..9).map(|i| format!("l{i}")).collect();
        let err = normalize(many).expect_err("too many").to_string();
        assert!(err.contains("at most 8"), "{err}");
    }
}
