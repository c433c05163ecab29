//! GGUF metadata values as [`read_gguf`](crate::read_gguf) keeps them: each
//! value in its stored type, arrays element by element.

use std::collections::HashMap;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float32`.
    F32(f32),
    /// `float64`.
    F64(f64),
    /// `bool`.
    Bool(bool),
    /// A UTF-8 string.
    String(String),
    /// An array (its elements of one type, arrays at most one level deep).
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The stored type's name, as errors print it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::U8(_) => "uint8",
            Self::I8(_) => "int8",
            Self::U16(_) => "uint16",
            Self::I16(_) => "int16",
            Self::U32(_) => "uint32",
            Self::I32(_) => "int32",
            Self::U64(_) => "uint64",
            Self::I64(_) => "int64",
            Self::F32(_) => "float32",
            Self::F64(_) => "float64",
            Self::Bool(_) => "bool",
            Self::String(_) => "string",
            Self::Array(_) => "array",
        }
    }

    /// The GGUF type id it is stored as (for an array, the array's).
    pub fn type_id(&self) -> u32 {
        use crate::gguf_file::value_type::*;
        match self {
            Self::U8(_) => U8,
            Self::I8(_) => I8,
            Self::U16(_) => U16,
            Self::I16(_) => I16,
            Self::U32(_) => U32,
            Self::I32(_) => I32,
            Self::U64(_) => U64,
            Self::I64(_) => I64,
            Self::F32(_) => F32,
            Self::F64(_) => F64,
            Self::Bool(_) => BOOL,
            Self::String(_) => STRING,
            Self::Array(_) => ARRAY,
        }
    }

    /// An integer value, whatever its width; `None` for any other type or
    /// a `uint64` beyond `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::I8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::U64(v) => i64::try_from(v).ok(),
            Self::I64(v) => Some(v),
            _ => None,
        }
    }

    /// A number (an integer or a float) as `f64`; `None` for any other
    /// type.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            Self::U64(v) => Some(v as f64),
            Self::I64(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// A bool's value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A string's text.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// An array's elements.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// A GGUF file's metadata by key.
pub type GgufMetadata = HashMap<String, GgufValue>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_across_widths_and_other_types_do_not() {
        assert_eq!(GgufValue::U32(7).as_i64(), Some(7));
        assert_eq!(GgufValue::I8(-3).as_f64(), Some(-3.0));
        assert_eq!(GgufValue::F32(0.5).as_f64(), Some(0.5));
        assert_eq!(GgufValue::F32(0.5).as_i64(), None);
        assert_eq!(GgufValue::U64(u64::MAX).as_i64(), None);
        assert_eq!(GgufValue::String("7".into()).as_f64(), None);
        assert_eq!(GgufValue::Bool(true).as_i64(), None);
        assert_eq!(GgufValue::Array(vec![]).type_name(), "array");
    }
}
