//! A small writer of llguidance Lark grammars: numbered rules, literals that
//! name a special token by id when the vocabulary has it as one, inline
//! JSON schemas, lazy text up to a marker.

use serde_json::Value;

/// Free text: any characters, newlines included (special tokens never match).
pub(super) const ANY: &str = "ANY";
/// Whitespace between parts.
pub(super) const WS: &str = "WS";

/// A grammar being written.
pub(super) struct Lark<'a> {
    rules: Vec<String>,
    next: usize,
    /// Fixed-name rules already written.
    named: Vec<String>,
    special: &'a dyn Fn(&str) -> Option<u32>,
}

impl<'a> Lark<'a> {
    pub(super) fn new(special: &'a dyn Fn(&str) -> Option<u32>) -> Self {
        Self {
            rules: Vec::new(),
            next: 0,
            named: Vec::new(),
            special,
        }
    }

    /// Whether `text` is one special token of the vocabulary.
    pub(super) fn is_special(&self, text: &str) -> bool {
        (self.special)(text).is_some()
    }

    /// `text` as grammar atoms: string literals, with every special token in
    /// it named by id (`<|channel>thought` is the token `<|channel>` then
    /// text in Gemma 4's vocabulary). Special tokens are looked for where
    /// `<` or `[` starts one, up to 32 bytes long: every marker we write
    /// has that shape.
    pub(super) fn lit(&self, text: &str) -> String {
        let mut parts = Vec::new();
        let mut plain = String::new();
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            if let Some((len, id)) = self.special_prefix(rest) {
                if !plain.is_empty() {
                    parts.push(quote(&std::mem::take(&mut plain)));
                }
                parts.push(format!("<[{id}]>"));
                rest = &rest[len..];
            } else {
                plain.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        if !plain.is_empty() || parts.is_empty() {
            parts.push(quote(&plain));
        }
        parts.join(" ")
    }

    /// The longest special token `text` starts with: its length and id.
    fn special_prefix(&self, text: &str) -> Option<(usize, u32)> {
        if !text.starts_with(['<', '[']) {
            return None;
        }
        (2..=text.len().min(32))
            .rev()
            .filter(|&len| text.is_char_boundary(len))
            .find_map(|len| (self.special)(&text[..len]).map(|id| (len, id)))
    }

    /// A new rule `prefix_N` (with `attrs`, e.g. `[lazy]`) for `body`; its name.
    pub(super) fn rule(&mut self, prefix: &str, attrs: &str, body: &str) -> String {
        let name = format!("{prefix}_{}", self.next);
        self.next += 1;
        self.rules.push(format!("{name}{attrs}: {body}"));
        name
    }

    /// The rule `name` for `body`, written once however often it is asked for.
    pub(super) fn shared(&mut self, name: &str, body: impl FnOnce(&mut Self) -> String) -> String {
        if !self.named.iter().any(|n| n == name) {
            self.named.push(name.to_owned());
            let body = body(self);
            self.rules.push(format!("{name}: {body}"));
        }
        name.to_owned()
    }

    /// A JSON value valid under `schema`.
    pub(super) fn json(&mut self, schema: &Value) -> String {
        self.rule("json", "", &format!("%json {schema}"))
    }

    /// A call's JSON valid under `schema`, closed (see [`closed`]) and laid
    /// out as Python's `json.dumps` (the templates' `tojson`) writes it.
    pub(super) fn call_json(&mut self, schema: &Value) -> String {
        let mut schema = closed(schema);
        if let Value::Object(object) = &mut schema {
            object.insert(
                spec_grammar::LAYOUT_KEY.into(),
                spec_grammar::json_dumps_layout(),
            );
        }
        self.json(&schema)
    }

    /// Free text through the first `end` (which it includes).
    pub(super) fn text_through(&mut self, end: &str) -> String {
        match self.special_prefix(end) {
            // Special tokens never occur inside text: greedy text stops at
            // the one `end` starts with.
            Some((len, id)) if len == end.len() => format!("{ANY}? <[{id}]>"),
            Some((len, id)) => format!("{ANY}? <[{id}]> {}", self.lit(&end[len..])),
            None => self.rule("text", &format!("[suffix={}]", quote(end)), "/(.|\\n)*/"),
        }
    }

    /// Free text in which `marker` never occurs (nothing else may follow it).
    pub(super) fn text_without(&mut self, marker: &str) -> String {
        if self.is_special(marker) {
            return format!("{ANY}?");
        }
        let name = format!("FREE_{}", self.next);
        self.next += 1;
        self.rules.push(format!(
            "{name}: /(.|\\n)*/ & ~/(?s:.*){}(?s:.*)/",
            regex_escape(marker)
        ));
        format!("{name}?")
    }

    /// The grammar text with `start: start`.
    pub(super) fn finish(self, start: &str) -> String {
        let mut text = format!("start: {start}\n");
        for rule in &self.rules {
            text.push_str(rule);
            text.push('\n');
        }
        text.push_str(&format!("{ANY}: /(.|\\n)+/\n{WS}: /[ \\t\\r\\n]+/\n"));
        text
    }
}

/// `schema` with `"additionalProperties": false` on every object schema
/// that declares `properties` and does not say otherwise: a call's
/// arguments hold what the tool declares, not whatever a model adds.
pub(super) fn closed(schema: &Value) -> Value {
    close(schema, true)
}

/// `schema` closed where it declares properties (when `here`), and every
/// schema inside it, found by keyword: maps of schemas, lists of schemas,
/// single schemas; everything else (`const`, `enum`, ..) is data. Parts of
/// an `allOf` are not closed themselves: each would refuse the others'
/// properties.
fn close(schema: &Value, here: bool) -> Value {
    let Value::Object(object) = schema else {
        return schema.clone();
    };
    let all = |value: &Value, here: bool| match value {
        Value::Array(items) => Value::Array(items.iter().map(|s| close(s, here)).collect()),
        other => close(other, here),
    };
    let mut out = serde_json::Map::new();
    for (key, value) in object {
        let value = match key.as_str() {
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
                match value {
                    Value::Object(map) => Value::Object(
                        map.iter()
                            .map(|(name, s)| (name.clone(), close(s, true)))
                            .collect(),
                    ),
                    other => other.clone(),
                }
            }
            "items"
            | "prefixItems"
            | "additionalItems"
            | "additionalProperties"
            | "anyOf"
            | "oneOf"
            | "not"
            | "contains"
            | "propertyNames"
            | "if"
            | "then"
            | "else" => all(value, true),
            "allOf" => all(value, false),
            _ => value.clone(),
        };
        out.insert(key.clone(), value);
    }
    if here && object.contains_key("properties") && !object.contains_key("additionalProperties") {
        out.insert("additionalProperties".into(), Value::Bool(false));
    }
    Value::Object(out)
}

/// A Lark string literal (Python's string syntax accepts JSON's escapes).
pub(super) fn quote(text: &str) -> String {
    Value::from(text).to_string()
}

/// `text` as a regex matching itself, for `/../` in Lark.
pub(super) fn regex_escape(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_and_escapes() {
        let special = |t: &str| (t == "[TOOL_CALLS]").then_some(9);
        let g = Lark::new(&special);
        assert_eq!(g.lit("[TOOL_CALLS]"), "<[9]>");
        assert_eq!(g.lit("[TOOL_CALLS]get[TOOL_CALLS]"), r#"<[9]> "get" <[9]>"#);
        assert_eq!(g.lit("a[TOOL_CALLS"), r#""a[TOOL_CALLS""#);
        assert_eq!(g.lit(""), r#""""#);
        assert_eq!(g.lit("<tool_call>\n\"x\""), r#""<tool_call>\n\"x\"""#);
        assert_eq!(regex_escape("<|tool_call>"), r"<\|tool_call>");
    }

    #[test]
    fn closed_schemas_take_only_their_properties() {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {
                "inner": {"type": "object", "properties": {"a": {"type": "string"}}},
                "open": {"type": "object", "properties": {}, "additionalProperties": true},
                "properties": {"const": {"properties": 1}}
            }
        });
        let closed = closed(&schema);
        assert_eq!(closed["additionalProperties"], false);
        assert_eq!(closed["properties"]["inner"]["additionalProperties"], false);
        assert_eq!(closed["properties"]["open"]["additionalProperties"], true);
        assert_eq!(
            closed["properties"]["properties"]["const"],
            serde_json::json!({"properties": 1})
        );
        assert!(
            closed["properties"].get("additionalProperties").is_none(),
            "a parameter named `properties` is no schema keyword"
        );
        let merged = super::closed(&serde_json::json!({"allOf": [
            {"type": "object", "properties": {"a": {"type": "object", "properties": {}}}},
            {"type": "object", "properties": {"b": {}}}
        ]}));
        assert!(merged["allOf"][0].get("additionalProperties").is_none());
        assert_eq!(
            merged["allOf"][0]["properties"]["a"]["additionalProperties"],
            false
        );
    }
}
