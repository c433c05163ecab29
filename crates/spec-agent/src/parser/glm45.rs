//! GLM-4.5 / 4.6 / 5 calls: `<tool_call>NAME\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_call>`,
//! string values bare and others as JSON, typed by the tool's schema.

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
    let body = text.strip_suffix(CLOSE)?;
    let (name, mut rest) = match body.find("<arg_key>") {
        Some(at) => body.split_at(at),
        None => (body, ""),
    };
    let name = name.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return None;
    }
    let mut arguments = Map::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            return Some(vec![Call {
                name: name.to_owned(),
                arguments: Value::Object(arguments),
            }]);
        }
        let (key, after) = rest.strip_prefix("<arg_key>")?.split_once("</arg_key>")?;
        let (value, after) = after
            .trim_start()
            .strip_prefix("<arg_value>")?
            .split_once("</arg_value>")?;
        let key = key.trim();
        arguments.insert(key.to_owned(), typed::argument(tools, name, key, value));
        rest = after;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn keys_and_values() {
        let text = "get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";
        let calls = parse(text, &[]).expect("call");
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, json!({"city": "Paris", "days": 3}));
        assert_eq!(
            parse("f\n</tool_call>", &[]).expect("no args")[0].arguments,
            json!({})
        );
        // GLM-4.7 and 5 write the parts together.
        let compact = "get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>";
        assert_eq!(parse(compact, &[]), parse(text, &[]));
        assert_eq!(parse("f\n<arg_key>a</arg_key>x</tool_call>", &[]), None);
        assert_eq!(parse("two words\n</tool_call>", &[]), None);
    }
}
