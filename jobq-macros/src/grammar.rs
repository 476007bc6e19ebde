//! The two small languages inside `#[job]` string literals: durations (`500ms`, `30s`,
//! `5m`, `1h`) and retry policies (`exp(max=N[,base=D][,cap=D][,jitter])`,
//! `fixed(D[,max=N])`, `none`). Pure functions from text to a value or a message; the
//! caller puts the message at the literal's span.

/// What a retry policy may be, for error messages.
pub(crate) const RETRY_GRAMMAR: &str = "expected `exp(max=N[,base=D][,cap=D][,jitter])`, \
     `fixed(D[,max=N])` or `none`, where N is a number of attempts (at least 1) and D a \
     duration like `500ms`, `30s`, `5m` or `1h`";

/// What a duration may be, for error messages.
pub(crate) const DURATION_GRAMMAR: &str = "expected a whole number followed by a unit, one of \
     `ms`, `s`, `m`, `h` (like `500ms`, `30s`, `5m`, `1h`)";

/// A duration in whole milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Millis(pub(crate) u64);

/// A parsed retry policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Policy {
    /// `exp(max=N[,base=D][,cap=D][,jitter])`.
    Exponential {
        max: u32,
        base: Option<Millis>,
        cap: Option<Millis>,
        jitter: bool,
    },
    /// `fixed(D[,max=N])`.
    Fixed { delay: Millis, max: Option<u32> },
    /// `none`.
    None,
}

/// Parses `500ms`, `30s`, `5m` or `1h`.
pub(crate) fn duration(text: &str) -> Result<Millis, String> {
    let text = text.trim();
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let factor: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(format!("`{text}` is not a duration: {DURATION_GRAMMAR}")),
    };
    if number.is_empty() {
        return Err(format!("`{text}` is not a duration: {DURATION_GRAMMAR}"));
    }
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .map(Millis)
        .ok_or_else(|| format!("duration `{text}` is too large"))
}

/// Parses a retry policy.
pub(crate) fn policy(text: &str) -> Result<Policy, String> {
    let text = text.trim();
    if text == "none" {
        return Ok(Policy::None);
    }
    let Some((name, rest)) = text.split_once('(') else {
        return Err(format!("unknown retry policy `{text}`: {RETRY_GRAMMAR}"));
    };
    let name = name.trim();
    let Some(inner) = rest.trim_end().strip_suffix(')') else {
        return Err(format!(
            "retry policy `{text}` is missing its closing `)`: {RETRY_GRAMMAR}"
        ));
    };
    let items: Vec<&str> = if inner.trim().is_empty() {
        Vec::new()
    } else {
        inner.split(',').map(str::trim).collect()
    };
    match name {
        "exp" => exponential(&items),
        "fixed" => fixed(&items),
        "none" => Err("`none` takes no options: write `retry = \"none\"`".to_owned()),
        _ => Err(format!("unknown retry policy `{name}`: {RETRY_GRAMMAR}")),
    }
}

fn exponential(items: &[&str]) -> Result<Policy, String> {
    let mut max = None;
    let mut base = None;
    let mut cap = None;
    let mut jitter = false;
    let mut seen: Vec<&str> = Vec::new();
    for item in items {
        let (key, value) = split_item(item);
        if seen.contains(&key) {
            return Err(format!("`{key}` is given twice in `exp(...)`"));
        }
        seen.push(key);
        match (key, value) {
            ("max", Some(v)) => max = Some(attempts(v)?),
            ("base", Some(v)) => base = Some(duration(v).map_err(|e| format!("`base`: {e}"))?),
            ("cap", Some(v)) => cap = Some(duration(v).map_err(|e| format!("`cap`: {e}"))?),
            ("jitter", None) => jitter = true,
            ("jitter", Some(_)) => {
                return Err("`jitter` is a flag: write `jitter`, or leave it out".to_owned());
            }
            ("max" | "base" | "cap", None) => {
                return Err(format!(
                    "`{key}` needs a value, like `{key}={}`",
                    example(key)
                ));
            }
            _ => {
                return Err(format!(
                    "unknown `exp` option `{item}`: expected `max=N`, `base=D`, `cap=D` or `jitter`"
                ));
            }
        }
    }
    let Some(max) = max else {
        return Err(
            "`exp` needs `max=N`, the number of attempts, like `exp(max=10,jitter)`".to_owned(),
        );
    };
    if let (Some(b), Some(c)) = (base, cap)
        && b > c
    {
        return Err(
            "`base` is larger than `cap`: the first delay cannot exceed the largest".to_owned(),
        );
    }
    Ok(Policy::Exponential {
        max,
        base,
        cap,
        jitter,
    })
}

fn fixed(items: &[&str]) -> Result<Policy, String> {
    let Some((first, rest)) = items.split_first() else {
        return Err("`fixed` needs a delay, like `fixed(30s)` or `fixed(30s,max=5)`".to_owned());
    };
    if first.contains('=') {
        return Err(
            "`fixed` takes the delay first, like `fixed(30s)` or `fixed(30s,max=5)`".to_owned(),
        );
    }
    let delay = duration(first)?;
    let mut max = None;
    for item in rest {
        match split_item(item) {
            ("max", Some(v)) if max.is_none() => max = Some(attempts(v)?),
            ("max", Some(_)) => return Err("`max` is given twice in `fixed(...)`".to_owned()),
            _ => {
                return Err(format!(
                    "unknown `fixed` option `{item}`: after the delay only `max=N` is allowed"
                ));
            }
        }
    }
    Ok(Policy::Fixed { delay, max })
}

fn split_item(item: &str) -> (&str, Option<&str>) {
    match item.split_once('=') {
        Some((k, v)) => (k.trim(), Some(v.trim())),
        None => (item.trim(), None),
    }
}

fn example(key: &str) -> &'static str {
    if key == "max" { "10" } else { "30s" }
}

fn attempts(value: &str) -> Result<u32, String> {
    match value.parse::<u32>() {
        Ok(0) => Err(
            "`max` must be at least 1: it counts every attempt, the first included \
             (for a single attempt use `none`)"
                .to_owned(),
        ),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "`max` must be a whole number of attempts (at least 1), found `{value}`"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration("500ms"), Ok(Millis(500)));
        assert_eq!(duration("30s"), Ok(Millis(30_000)));
        assert_eq!(duration("5m"), Ok(Millis(300_000)));
        assert_eq!(duration("1h"), Ok(Millis(3_600_000)));
        assert_eq!(duration("0s"), Ok(Millis(0)));
        for bad in ["30", "s", "1.5s", "30 s", "-1s", "30sec", "", "1d"] {
            assert!(duration(bad).is_err(), "{bad}");
        }
        assert!(duration("99999999999999999999h").is_err());
    }

    #[test]
    fn policies() {
        assert_eq!(
            policy("exp(max=10,jitter)"),
            Ok(Policy::Exponential {
                max: 10,
                base: None,
                cap: None,
                jitter: true
            })
        );
        assert_eq!(
            policy(" exp( max = 3 , base=500ms, cap=1h ) "),
            Ok(Policy::Exponential {
                max: 3,
                base: Some(Millis(500)),
                cap: Some(Millis(3_600_000)),
                jitter: false
            })
        );
        assert_eq!(
            policy("fixed(30s)"),
            Ok(Policy::Fixed {
                delay: Millis(30_000),
                max: None
            })
        );
        assert_eq!(
            policy("fixed(30s,max=5)"),
            Ok(Policy::Fixed {
                delay: Millis(30_000),
                max: Some(5)
            })
        );
        assert_eq!(policy("none"), Ok(Policy::None));
    }

    #[test]
    fn policy_errors() {
        for bad in [
            "exp(max=ten)",
            "exp(max=0)",
            "exp()",
            "exp(jitter)",
            "exp(max=3,max=4)",
            "exp(max=3,foo)",
            "exp(max=3,jitter=yes)",
            "exp(max=3,base=1h,cap=1s)",
            "exp(max=3",
            "fixd(30s)",
            "fixed()",
            "fixed(max=3)",
            "fixed(30s,max=3,max=4)",
            "fixed(30s,cap=1h)",
            "none()",
            "",
            "exponential",
        ] {
            assert!(policy(bad).is_err(), "{bad}");
        }
        let msg = policy("fixd(30s)").err().unwrap_or_default();
        assert!(msg.contains("unknown retry policy `fixd`"), "{msg}");
        let msg = policy("exp(max=0)").err().unwrap_or_default();
        assert!(msg.contains("at least 1"), "{msg}");
    }
}
