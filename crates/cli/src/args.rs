//! Value parsers for numeric flags: clap's own message for `--max-tokens -1` ("invalid digit
//! found in string") names no range, so counts are parsed here and say what they take.

/// A count of zero or more.
pub fn count(s: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .map_err(|_| format!("takes a whole number, 0 or more (got {s:?})"))
}

/// A count of one or more.
pub fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("takes a whole number, 1 or more (got {s:?})")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn counts_say_their_range() {
        assert_eq!(count("0"), Ok(0));
        assert_eq!(at_least_one("3"), Ok(3));
        assert!(count("-1").unwrap_err().contains("0 or more"));
        assert!(at_least_one("0").unwrap_err().contains("1 or more"));
        assert!(at_least_one("x").unwrap_err().contains("\"x\""));
    }
}
