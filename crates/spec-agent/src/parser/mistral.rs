//! Mistral calls after `[TOOL_CALLS]`: a JSON array of
//! `{"name": .., "arguments": {..}}` (Mistral Small 3.1 and earlier), or
//! `name[ARGS]{..}` (later models; an optional `[CALL_ID]id` before `[ARGS]`).

use serde_json::Value;

use super::scan::{self, Scan};
use super::{hermes, Call, Syntax};
use crate::Tool;

pub(crate) const OPEN: &str = "[TOOL_CALLS]";
pub(crate) const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";

pub(super) const SYNTAX: Syntax = Syntax {
    opens: &[OPEN],
    opens_at_start: None,
    end,
    parse,
};

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

fn end(text: &str) -> Scan {
    let trimmed = text.trim_start();
    if trimmed.starts_with('[') && !trimmed.starts_with(CALL_ID) && !trimmed.starts_with(ARGS) {
        return offset(text, trimmed, scan::json_end(trimmed));
    }
    let name_len = trimmed.len() - trimmed.trim_start_matches(is_name_char).len();
    let mut rest = &trimmed[name_len..];
    if name_len == 0 {
        return if rest.is_empty() {
            Scan::Wait
        } else {
            Scan::Invalid
        };
    }
    if let Some(after) = rest.strip_prefix(CALL_ID) {
        let id_len = after.len()
            - after
                .trim_start_matches(|c: char| c.is_ascii_alphanumeric())
                .len();
        rest = &after[id_len..];
    } else if CALL_ID.starts_with(rest) && !ARGS.starts_with(rest) {
        return Scan::Wait;
    }
    match rest.strip_prefix(ARGS) {
        Some(args) => offset(text, args, scan::json_end(args)),
        None if ARGS.starts_with(rest) => Scan::Wait,
        None => Scan::Invalid,
    }
}

/// A scan of `part`, a tail of `text`, measured from the start of `text`.
fn offset(text: &str, part: &str, scanned: Scan) -> Scan {
    match scanned {
        Scan::Done(len) => Scan::Done(text.len() - part.len() + len),
        other => other,
    }
}

fn parse(text: &str, _tools: &[Tool]) -> Option<Vec<Call>> {
    let trimmed = text.trim();
    if trimmed.starts_with('[') {
        let calls: Vec<Value> = serde_json::from_str(trimmed).ok()?;
        return calls
            .iter()
            .map(|call| hermes::json_call(call, &["arguments", "parameters"]))
            .collect();
    }
    let (head, arguments) = trimmed.split_once(ARGS)?;
    let name = head.split_once(CALL_ID).map_or(head, |(name, _)| name);
    let arguments: Value = serde_json::from_str(arguments).ok()?;
    Some(vec![Call {
        name: name.to_owned(),
        arguments: scan::arguments_object(&arguments)?,
    }])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn both_forms() {
        let array = r#" [{"name": "f", "arguments": {"a": 1}, "id": "abc123def"}, {"name": "g", "arguments": {}}]"#;
        assert_eq!(end(array), Scan::Done(array.len()));
        let calls = parse(array, &[]).expect("array form");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, json!({"a": 1}));
        let named = r#"get_weather[ARGS]{"city": "Paris"}"#;
        assert_eq!(
            end(&format!("{named}[TOOL_CALLS]")),
            Scan::Done(named.len())
        );
        assert_eq!(parse(named, &[]).expect("named")[0].name, "get_weather");
        let with_id = r#"f[CALL_ID]a1b2c3d4e[ARGS]{}"#;
        assert_eq!(end(with_id), Scan::Done(with_id.len()));
        assert_eq!(parse(with_id, &[]).expect("id")[0].name, "f");
        assert_eq!(end("get_weather[AR"), Scan::Wait);
        assert_eq!(end("get_weather[CALL"), Scan::Wait);
        assert_eq!(end("get weather"), Scan::Invalid);
        assert_eq!(end(" and so on"), Scan::Invalid);
    }
}
