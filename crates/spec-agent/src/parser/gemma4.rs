//! Gemma 4 calls: `<|tool_call>call:NAME{key:value,..}<tool_call|>`. Values
//! are Gemma's own notation: strings between `<|"|>` marks (no escapes),
//! bare numbers, `true`/`false`/`null`, `{key:value}` objects with bare keys
//! and `[..]` arrays.

use serde_json::{Map, Value};

use super::scan::{self, Scan};
use super::{Call, Syntax};
use crate::Tool;

pub(crate) const OPEN: &str = "<|tool_call>";
pub(crate) const CLOSE: &str = "<tool_call|>";
/// The mark around strings.
pub(crate) const QUOTE: &str = "<|\"|>";

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
    let body = text.strip_suffix(CLOSE)?.trim();
    let body = body.strip_prefix("call:")?;
    let brace = body.find('{')?;
    let name = body[..brace].trim();
    let mut reader = Reader {
        rest: &body[brace..],
    };
    let arguments = reader.value()?;
    if !arguments.is_object() || !reader.rest.trim().is_empty() || name.is_empty() {
        return None;
    }
    Some(vec![Call {
        name: name.to_owned(),
        arguments,
    }])
}

/// A recursive-descent reader of Gemma's value notation.
struct Reader<'a> {
    rest: &'a str,
}

impl Reader<'_> {
    fn skip_space(&mut self) {
        self.rest = self.rest.trim_start();
    }

    fn eat(&mut self, text: &str) -> bool {
        self.skip_space();
        match self.rest.strip_prefix(text) {
            Some(rest) => {
                self.rest = rest;
                true
            }
            None => false,
        }
    }

    fn string(&mut self) -> Option<String> {
        let (text, rest) = self.rest.split_once(QUOTE)?;
        self.rest = rest;
        Some(text.to_owned())
    }

    fn value(&mut self) -> Option<Value> {
        if self.eat(QUOTE) {
            return self.string().map(Value::String);
        }
        if self.eat("{") {
            let mut object = Map::new();
            if self.eat("}") {
                return Some(Value::Object(object));
            }
            loop {
                let key = if self.eat(QUOTE) {
                    let key = self.string()?;
                    if !self.eat(":") {
                        return None;
                    }
                    key
                } else {
                    self.skip_space();
                    let (key, rest) = self.rest.split_once(':')?;
                    let key = key.trim();
                    if key.is_empty() || key.contains(|c: char| "{}[],\"<".contains(c)) {
                        return None;
                    }
                    self.rest = rest;
                    key.to_owned()
                };
                let value = self.value()?;
                object.insert(key, value);
                if self.eat("}") {
                    return Some(Value::Object(object));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        if self.eat("[") {
            let mut items = Vec::new();
            if self.eat("]") {
                return Some(Value::Array(items));
            }
            loop {
                items.push(self.value()?);
                if self.eat("]") {
                    return Some(Value::Array(items));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        self.skip_space();
        let len = self.rest.find([',', '}', ']']).unwrap_or(self.rest.len());
        let word = self.rest[..len].trim();
        self.rest = &self.rest[len..];
        match word {
            "true" => Some(Value::Bool(true)),
            "false" => Some(Value::Bool(false)),
            "null" => Some(Value::Null),
            _ => match serde_json::from_str::<Value>(word).ok()? {
                Value::Number(n) => Some(Value::Number(n)),
                _ => None,
            },
        }
    }
}

/// Gemma's notation of a JSON value, as its template writes call arguments
/// (keys bare and sorted); for tests and grammar examples.
#[cfg(test)]
pub(crate) fn write(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{QUOTE}{s}{QUOTE}"),
        Value::Object(map) => {
            let mut keys: Vec<_> = map.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .iter()
                .map(|k| format!("{k}:{}", write(&map[*k])))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(write).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn gemma_values_become_json() {
        let args = json!({"city": "Paris, \"FR\"", "days": 3, "hot": true, "opts": {"unit": "C", "n": [1, 2.5]}, "none": null});
        let text = format!("call:get_weather{}{CLOSE}", write(&args));
        let calls = parse(&text, &[]).expect("call");
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, args);
        assert_eq!(
            parse(&format!("call:f{{}}{CLOSE}"), &[]).expect("empty")[0].arguments,
            json!({})
        );
        assert_eq!(parse(&format!("call:f{{a:bare}}{CLOSE}"), &[]), None);
        assert_eq!(parse(&format!("call:f{{a:{QUOTE}x}}{CLOSE}"), &[]), None);
        assert_eq!(parse(&format!("f{{}}{CLOSE}"), &[]), None);
    }
}
