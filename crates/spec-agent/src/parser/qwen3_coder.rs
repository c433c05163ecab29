//! Qwen3-Coder calls: `<tool_call>\n<function=NAME>\n<parameter=P>\nvalue\n</parameter>\n</function>\n</tool_call>`,
//! values as bare text typed by the tool's schema.

use serde_json::{Map, Value};

use super::scan::{self, Scan};
use super::{typed, Call, Syntax};
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

fn parse(text: &str, tools: &[Tool]) -> Option<Vec<Call>> {
    let body = text.strip_suffix(CLOSE)?.trim();
    let body = body.strip_prefix("<function=")?;
    let (name, mut rest) = body.split_once('>')?;
    let name = name.trim();
    let mut arguments = Map::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix("</function>") {
            return after.trim().is_empty().then(|| {
                vec![Call {
                    name: name.to_owned(),
                    arguments: Value::Object(arguments),
                }]
            });
        }
        let (param, after) = rest.strip_prefix("<parameter=")?.split_once('>')?;
        let (value, after) = after.split_once("</parameter>")?;
        // The template puts the value on lines of its own.
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        let param = param.trim();
        arguments.insert(param.to_owned(), typed::argument(tools, name, param, value));
        rest = after;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn parameters_are_typed_by_the_schema() {
        let tool = Tool {
            name: "f".into(),
            description: None,
            parameters: json!({"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}}),
        };
        let text = "\n<function=f>\n<parameter=n>\n42\n</parameter>\n<parameter=s>\n42\nlines\n</parameter>\n</function>\n</tool_call>";
        let calls = parse(text, &[tool]).expect("call");
        assert_eq!(calls[0].arguments, json!({"n": 42, "s": "42\nlines"}));
        assert_eq!(
            parse(
                "<function=f>\n<parameter=n>\n1\n</function>\n</tool_call>",
                &[]
            ),
            None
        );
        assert_eq!(
            parse("<function=f>\n</function> trailing</tool_call>", &[]),
            None
        );
    }
}
