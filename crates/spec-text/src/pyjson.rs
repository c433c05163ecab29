//! The `tojson` filter as transformers defines it for chat templates: Python's
//! `json.dumps` layout (`", "` and `": "` separators, or `indent` spaces), with
//! non-ASCII text kept (unless `ensure_ascii=True`, which some templates
//! pass) and no HTML escaping (minijinja's own `tojson` escapes `<`, `>`, `&`
//! and `'`, which would change the prompt).

use std::io;

use minijinja::value::Kwargs;
use minijinja::{Error, ErrorKind, Value};
use serde::Serialize;
use serde_json::ser::{Formatter, PrettyFormatter, Serializer};

/// `value|tojson`, `value|tojson(indent=N)`, `value|tojson(ensure_ascii=B)`.
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let written = match indent {
        None => value.serialize(&mut Serializer::with_formatter(&mut out, PythonCompact)),
        Some(width) => {
            let spaces = vec![b' '; width];
            value.serialize(&mut Serializer::with_formatter(
                &mut out,
                PrettyFormatter::with_indent(&spaces),
            ))
        }
    };
    written.map_err(|e| Error::new(ErrorKind::InvalidOperation, "tojson").with_source(e))?;
    let text = String::from_utf8(out)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, "tojson").with_source(e))?;
    Ok(Value::from(if ensure_ascii == Some(true) {
        escape_non_ascii(&text)
    } else {
        text
    }))
}

/// `json.dumps(..., ensure_ascii=True)`: every non-ASCII character as `\uXXXX`
/// (a surrogate pair above U+FFFF). Non-ASCII only occurs inside strings, so
/// escaping the serialized text is escaping the strings.
fn escape_non_ascii(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// `value` as Python's `json.dumps(value, ensure_ascii=False)` writes it (a
/// space after each comma and colon): how templates' `tojson` lays out JSON,
/// so text written outside a template (a call in a tool-less template's
/// history) matches what the model saw and generates.
pub fn python_json(value: &serde_json::Value) -> String {
    let mut out = Vec::new();
    let written = value.serialize(&mut Serializer::with_formatter(&mut out, PythonCompact));
    match (written, String::from_utf8(out)) {
        (Ok(()), Ok(text)) => text,
        // A `Value` always serializes to UTF-8; this only keeps the
        // signature infallible.
        _ => value.to_string(),
    }
}

/// `json.dumps` without `indent`: everything on one line, a space after each
/// comma and colon.
struct PythonCompact;

impl Formatter for PythonCompact {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_json_spaces_like_json_dumps() {
        let value = serde_json::json!({"name": "f", "arguments": {"a": [1, 2.5, "é"], "b": null}});
        assert_eq!(
            python_json(&value),
            r#"{"name": "f", "arguments": {"a": [1, 2.5, "é"], "b": null}}"#
        );
    }
}
