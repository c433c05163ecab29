//! Llama 3.x JSON calls: a bare `{"name": .., "parameters": {..}}` where the
//! response begins (or after `<|python_tag|>`), several separated by
//! whitespace or `;`.

use serde_json::Value;

use super::scan::{self, Scan};
use super::{hermes, Call, Syntax};
use crate::Tool;

pub(crate) const PYTHON_TAG: &str = "<|python_tag|>";

pub(super) const SYNTAX: Syntax = Syntax {
    opens: &[PYTHON_TAG],
    opens_at_start: Some("{"),
    end,
    parse,
};

/// Through the first JSON object and any further ones that follow,
/// separated by whitespace or `;`; while only whitespace follows, more
/// calls may come, so the end of generation decides.
fn end(text: &str) -> Scan {
    let mut at = 0;
    loop {
        match scan::json_end(&text[at..]) {
            Scan::Done(len) => at += len,
            other => return other,
        }
        let rest = text[at..].trim_start_matches(separator);
        if rest.is_empty() {
            return Scan::Wait;
        }
        if !rest.starts_with('{') {
            return Scan::Done(at);
        }
        at = text.len() - rest.len();
    }
}

fn separator(c: char) -> bool {
    c.is_whitespace() || c == ';'
}

fn parse(text: &str, _tools: &[Tool]) -> Option<Vec<Call>> {
    let mut calls = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches(separator);
        if rest.is_empty() {
            return Some(calls);
        }
        let Scan::Done(len) = scan::json_end(rest) else {
            return None;
        };
        let call: Value = serde_json::from_str(&rest[..len]).ok()?;
        calls.push(hermes::json_call(&call, &["parameters", "arguments"])?);
        rest = &rest[len..];
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn one_or_more_objects() {
        assert_eq!(end(r#"{"name": "f", "parameters": {}}"#), Scan::Wait);
        assert_eq!(end(r#"{"name": "f", "parameters": {}}; "#), Scan::Wait);
        assert_eq!(
            end(r#"{"name": "f", "parameters": {}} and"#),
            Scan::Done(31)
        );
        let calls = parse(
            r#"{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}"#,
            &[],
        )
        .expect("calls");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, json!({"x": 1}));
        assert_eq!(parse(r#"{"type": "object"}"#, &[]), None);
    }
}
