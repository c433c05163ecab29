//! The `tojson` filter as transformers defines it for chat templates: Python's
//! `json.dumps` layout (`", "` and `": "` separators, or `indent` spaces), with
//! non-ASCII text kept and no HTML escaping (minijinja's own `tojson` escapes
//! `<`, `>`, `&` and `'`, which would change the prompt).

use std::io;

use minijinja::value::Kwargs;
use minijinja::{Error, ErrorKind, Value};
use serde::Serialize;
use serde_json::ser::{Formatter, PrettyFormatter, Serializer};

/// `value|tojson` or `value|tojson(indent=N)`.
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
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
    String::from_utf8(out)
        .map(Value::from)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, "tojson").with_source(e))
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
