//! Small text scanners the streaming parser and the call formats share.

use serde_json::Value;

/// How far a call reaches in the text after its open marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scan {
    /// Not decided yet: more text may complete the call.
    Wait,
    /// The call ends after this many bytes.
    Done(usize),
    /// This can never be a call: the marker was ordinary text.
    Invalid,
}

/// The call text reaches through the first `marker`.
pub(crate) fn through(text: &str, marker: &str) -> Scan {
    match text.find(marker) {
        Some(at) => Scan::Done(at + marker.len()),
        None => Scan::Wait,
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of
/// one of `markers`: text that must be held until the next push decides it.
pub(crate) fn partial_suffix(text: &str, markers: &[&str]) -> usize {
    let mut longest = 0;
    for marker in markers {
        for len in (1..marker.len().min(text.len() + 1)).rev() {
            if len <= longest {
                break;
            }
            if marker.is_char_boundary(len) && text.ends_with(&marker[..len]) {
                longest = len;
                break;
            }
        }
    }
    longest
}

/// The first occurrence of any of `markers` in `text`: its position and the marker.
pub(crate) fn find_first<'m>(text: &str, markers: &[&'m str]) -> Option<(usize, &'m str)> {
    markers
        .iter()
        .filter_map(|marker| text.find(marker).map(|at| (at, *marker)))
        .min_by_key(|(at, marker)| (*at, usize::MAX - marker.len()))
}

/// Where the JSON object or array that `text` starts with (after
/// whitespace) ends: brackets balanced outside strings.
pub(crate) fn json_end(text: &str) -> Scan {
    let start = text.len() - text.trim_start().len();
    match text[start..].chars().next() {
        None => return Scan::Wait,
        Some('{' | '[') => {}
        Some(_) => return Scan::Invalid,
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, b) in text.bytes().enumerate().skip(start) {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Scan::Done(i + 1);
                }
            }
            _ => {}
        }
    }
    Scan::Wait
}

/// A call's arguments as a JSON object: an object as is, or a string that
/// holds one (some models write the arguments as a JSON string).
pub(crate) fn arguments_object(value: &Value) -> Option<Value> {
    match value {
        Value::Object(_) => Some(value.clone()),
        Value::String(text) => match serde_json::from_str(text) {
            Ok(parsed @ Value::Object(_)) => Some(parsed),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scanners() {
        assert_eq!(partial_suffix("abc<tool", &["<tool_call>"]), 5);
        assert_eq!(
            partial_suffix("abc<tool_call>", &["<tool_call>"]),
            0,
            "a whole marker is not partial"
        );
        assert_eq!(partial_suffix("x<", &["[A]", "<b>"]), 1);
        assert_eq!(find_first("a [B] <c>", &["<c>", "[B]"]), Some((2, "[B]")));
        assert_eq!(json_end(r#" {"a": "}{", "b": [1]} tail"#), Scan::Done(22));
        assert_eq!(json_end(r#"{"a": "\"}"#), Scan::Wait);
        assert_eq!(json_end("x{}"), Scan::Invalid);
        assert_eq!(json_end("  "), Scan::Wait);
        assert_eq!(through("a</x>b", "</x>"), Scan::Done(5));
    }
}
