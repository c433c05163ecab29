//! Hermes / Qwen calls: `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>`.

use serde_json::Value;

use super::scan::{self, Scan};
use super::{Call, Syntax};
use crate::Tool;

pub(crate) const OPEN: &str = "<tool_call>";
pub(crate) const CLOSE: &str = "</tool_call>";

pub(super) const SYNTAX: Syntax = Syntax {
    opens: &[OPEN],
    opens_at_start: None,
    end,
    parse,
};

fn end(text: &str) -> Scan {
    scan::through(text, CLOSE)
}

fn parse(text: &str, _tools: &[Tool]) -> Option<Vec<Call>> {
    let body = text.strip_suffix(CLOSE)?;
    let call: Value = serde_json::from_str(body.trim()).ok()?;
    Some(vec![json_call(&call, &["arguments", "parameters"])?])
}

/// A call written as a JSON object: `name`, and the arguments under the
/// first of `keys` present (an object, or a string holding one).
pub(super) fn json_call(call: &Value, keys: &[&str]) -> Option<Call> {
    let name = call.get("name")?.as_str()?.to_owned();
    let arguments = keys.iter().find_map(|key| call.get(*key))?;
    Some(Call {
        name,
        arguments: scan::arguments_object(arguments)?,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn parses_the_json_body() {
        let calls = parse(
            "\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
            &[],
        )
        .expect("call");
        assert_eq!(
            calls,
            vec![Call {
                name: "f".into(),
                arguments: json!({"a": 1})
            }]
        );
        let stringly = parse(
            r#"{"name": "f", "arguments": "{\"a\": 1}"}</tool_call>"#,
            &[],
        )
        .expect("call");
        assert_eq!(stringly[0].arguments, json!({"a": 1}));
        assert_eq!(
            parse(r#"{"name": "f", "arguments": 1}</tool_call>"#, &[]),
            None
        );
        assert_eq!(
            parse(r#"{"name": "f", "arguments": {"a": }</tool_call>"#, &[]),
            None
        );
        assert_eq!(parse(r#"{"arguments": {}}</tool_call>"#, &[]), None);
    }
}
