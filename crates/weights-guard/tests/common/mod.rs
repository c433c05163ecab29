//! Builders for valid safetensors and GGUF files, written independently of the
//! crate under test (its own type tables are not used), so each corpus test
//! can start from a valid file and break exactly one thing.
#![allow(dead_code)] // each test binary uses a different part

use std::fmt::Write as _;

// ---- safetensors ----------------------------------------------------------

/// Bytes of `elements` of `dtype`, for the dtypes the tests use.
pub fn st_bytes_of(dtype: &str, elements: u64) -> u64 {
    match dtype {
        "F4" => elements / 2,
        "U8" | "I8" | "BOOL" => elements,
        "F16" | "BF16" | "I16" => elements * 2,
        "F32" | "I32" | "U32" => elements * 4,
        "F64" | "I64" | "U64" => elements * 8,
        other => panic!("test table lacks {other}"),
    }
}

/// The tensors of the valid test file: name, dtype, shape.
pub const ST_TENSORS: [(&str, &str, &[u64]); 6] = [
    ("model.embed_tokens.weight", "F32", &[4, 3]),
    ("model.norm.weight", "BF16", &[3]),
    ("lm_head.bias", "F16", &[4]),
    ("step", "I64", &[]),
    ("empty", "U8", &[0]),
    ("packed", "F4", &[2, 4]),
];

/// A header's JSON text for `tensors` laid out back to back in the given
/// order, plus `extra` (raw JSON members appended inside the object), and
/// the data length the tensors need.
pub fn st_header(tensors: &[(&str, &str, &[u64])], extra: &str) -> (String, u64) {
    let mut json = String::from("{");
    let mut offset = 0;
    for (i, (name, dtype, shape)) in tensors.iter().enumerate() {
        let elements: u64 = shape.iter().product();
        let end = offset + st_bytes_of(dtype, elements);
        if i > 0 {
            json.push(',');
        }
        write!(
            json,
            r#""{name}":{{"dtype":"{dtype}","shape":{shape:?},"data_offsets":[{offset},{end}]}}"#
        )
        .expect("write to String");
        offset = end;
    }
    json.push_str(extra);
    json.push('}');
    (json, offset)
}

/// A safetensors file: length, `header`, then `data_len` bytes of data.
pub fn st_file(header: &str, data_len: u64) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend((0..data_len).map(|i| i as u8));
    out
}

/// The valid safetensors test file.
pub fn st_valid() -> Vec<u8> {
    let (header, data_len) = st_header(&ST_TENSORS, r#","__metadata__":{"format":"pt"}"#);
    st_file(&header, data_len)
}

// ---- GGUF -----------------------------------------------------------------

/// A metadata value, written as GGUF writes it.
#[derive(Debug, Clone)]
pub enum Kv {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    /// Raw string bytes (to write invalid UTF-8) with the real length.
    RawStr(Vec<u8>),
    Array(u32, Vec<Kv>),
    U64(u64),
    I64(i64),
    F64(f64),
    /// Any type id followed by any bytes.
    Raw(u32, Vec<u8>),
}

impl Kv {
    pub fn type_id(&self) -> u32 {
        match self {
            Self::U8(_) => 0,
            Self::I8(_) => 1,
            Self::U16(_) => 2,
            Self::I16(_) => 3,
            Self::U32(_) => 4,
            Self::I32(_) => 5,
            Self::F32(_) => 6,
            Self::Bool(_) => 7,
            Self::Str(_) | Self::RawStr(_) => 8,
            Self::Array(..) => 9,
            Self::U64(_) => 10,
            Self::I64(_) => 11,
            Self::F64(_) => 12,
            Self::Raw(ty, _) => *ty,
        }
    }

    /// The value's bytes, without its type id.
    pub fn write_value(&self, out: &mut Vec<u8>) {
        match self {
            Self::U8(v) => out.push(*v),
            Self::I8(v) => out.extend(v.to_le_bytes()),
            Self::U16(v) => out.extend(v.to_le_bytes()),
            Self::I16(v) => out.extend(v.to_le_bytes()),
            Self::U32(v) => out.extend(v.to_le_bytes()),
            Self::I32(v) => out.extend(v.to_le_bytes()),
            Self::F32(v) => out.extend(v.to_le_bytes()),
            Self::Bool(v) => out.push(u8::from(*v)),
            Self::Str(s) => write_str(out, s.as_bytes()),
            Self::RawStr(b) => write_str(out, b),
            Self::Array(elem, items) => {
                out.extend(elem.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for item in items {
                    item.write_value(out);
                }
            }
            Self::U64(v) => out.extend(v.to_le_bytes()),
            Self::I64(v) => out.extend(v.to_le_bytes()),
            Self::F64(v) => out.extend(v.to_le_bytes()),
            Self::Raw(_, bytes) => out.extend_from_slice(bytes),
        }
    }
}

pub fn write_str(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend((bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Bytes of a tensor of `elements` of ggml type `ty`, for the types the tests
/// use (block layouts from ggml-common.h).
pub fn ggml_bytes_of(ty: u32, elements: u64) -> u64 {
    let (block, bytes) = match ty {
        0 => (1, 4),      // F32
        1 => (1, 2),      // F16
        2 => (32, 18),    // Q4_0
        3 => (32, 20),    // Q4_1
        8 => (32, 34),    // Q8_0
        14 => (256, 210), // Q6_K
        30 => (1, 2),     // BF16
        _ => return 0,    // unknown: the checker must refuse it before sizes matter
    };
    (elements / block).saturating_mul(bytes)
}

/// One tensor info.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: Vec<u8>,
    pub dims: Vec<u64>,
    pub ty: u32,
    /// `None`: laid out after the previous tensor, aligned.
    pub offset: Option<u64>,
}

impl TensorSpec {
    pub fn new(name: &str, dims: &[u64], ty: u32) -> Self {
        Self {
            name: name.as_bytes().to_vec(),
            dims: dims.to_vec(),
            ty,
            offset: None,
        }
    }
}

/// A GGUF file to build; every field can be broken by a test.
#[derive(Debug, Clone)]
pub struct GgufBuilder {
    pub magic: [u8; 4],
    pub version: u32,
    /// Overrides the tensor count written (default: `tensors.len()`).
    pub tensor_count: Option<u64>,
    /// Overrides the metadata count written (default: `kvs.len()`).
    pub kv_count: Option<u64>,
    pub kvs: Vec<(Vec<u8>, Kv)>,
    pub tensors: Vec<TensorSpec>,
    /// Alignment used to lay the file out (the `general.alignment` entry, if
    /// any, is just another kv).
    pub layout_alignment: u64,
}

impl GgufBuilder {
    /// A valid file using every metadata type (and one level of nested
    /// arrays) and several tensor types, one of them unaligned in size.
    pub fn valid() -> Self {
        let s = |v: &str| Kv::Str(v.to_owned());
        let kvs: Vec<(&str, Kv)> = vec![
            ("general.architecture", s("llama")),
            ("general.name", s("tiny test model")),
            ("general.alignment", Kv::U32(32)),
            ("test.u8", Kv::U8(7)),
            ("test.i8", Kv::I8(-7)),
            ("test.u16", Kv::U16(700)),
            ("test.i16", Kv::I16(-700)),
            ("test.i32", Kv::I32(-70_000)),
            ("test.f32", Kv::F32(0.5)),
            ("test.bool", Kv::Bool(true)),
            ("test.u64", Kv::U64(1 << 40)),
            ("test.i64", Kv::I64(-(1 << 40))),
            ("test.f64", Kv::F64(0.25)),
            ("test.empty_string", s("")),
            (
                "tokenizer.ggml.tokens",
                Kv::Array(8, vec![s("<s>"), s("é"), s("")]),
            ),
            (
                "tokenizer.ggml.scores",
                Kv::Array(6, vec![Kv::F32(0.0), Kv::F32(-1.0)]),
            ),
            (
                "test.nested",
                Kv::Array(
                    9,
                    vec![
                        Kv::Array(1, vec![Kv::I8(1), Kv::I8(2)]),
                        Kv::Array(8, vec![s("x")]),
                    ],
                ),
            ),
            ("test.empty_array", Kv::Array(4, vec![])),
        ];
        Self {
            magic: *b"GGUF",
            version: 3,
            tensor_count: None,
            kv_count: None,
            kvs: kvs
                .into_iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v))
                .collect(),
            tensors: vec![
                TensorSpec::new("token_embd.weight", &[64, 10], 3),
                TensorSpec::new("output_norm.weight", &[64], 0),
                TensorSpec::new("tiny", &[3], 1),
                TensorSpec::new("blk.0.attn_q.weight", &[64, 64], 8),
                TensorSpec::new("blk.0.ffn_down.weight", &[256, 2, 1], 14),
                TensorSpec::new("blk.0.attn_k.weight", &[32, 4], 2),
            ],
            layout_alignment: 32,
        }
    }

    pub fn kv(mut self, key: &str, value: Kv) -> Self {
        self.kvs.push((key.as_bytes().to_vec(), value));
        self
    }

    pub fn set_kv(mut self, key: &str, value: Kv) -> Self {
        for (k, v) in &mut self.kvs {
            if k == key.as_bytes() {
                *v = value;
                return self;
            }
        }
        self.kv(key, value)
    }

    /// The tensors' offsets: given ones kept, the others laid out in order.
    pub fn offsets(&self) -> Vec<u64> {
        let mut next = 0;
        self.tensors
            .iter()
            .map(|t| {
                let offset = t.offset.unwrap_or(next);
                let elements = t.dims.iter().fold(1_u64, |a, &d| a.saturating_mul(d));
                let size = ggml_bytes_of(t.ty, elements);
                next = offset
                    .saturating_add(size)
                    .checked_next_multiple_of(self.layout_alignment)
                    .unwrap_or(u64::MAX);
                offset
            })
            .collect()
    }

    /// The bytes up to the end of the tensor infos.
    pub fn header(&self) -> Vec<u8> {
        let mut out = self.magic.to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend(
            self.tensor_count
                .unwrap_or(self.tensors.len() as u64)
                .to_le_bytes(),
        );
        out.extend(self.kv_count.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for (key, value) in &self.kvs {
            write_str(&mut out, key);
            out.extend(value.type_id().to_le_bytes());
            value.write_value(&mut out);
        }
        for (t, offset) in self.tensors.iter().zip(self.offsets()) {
            write_str(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
        }
        out
    }

    /// The whole file: header, padding, and the data section (sized to the
    /// last tensor's end; tensors too large for memory are not laid out).
    pub fn build(&self) -> Vec<u8> {
        let mut out = self.header();
        let data_start = (out.len() as u64).next_multiple_of(self.layout_alignment);
        let data_len = self
            .tensors
            .iter()
            .zip(self.offsets())
            .map(|(t, offset)| {
                let elements = t.dims.iter().try_fold(1_u64, |a, &d| a.checked_mul(d));
                offset.saturating_add(elements.map_or(0, |n| ggml_bytes_of(t.ty, n)))
            })
            .filter(|end| *end < (1 << 24))
            .max()
            .unwrap_or(0);
        out.resize((data_start + data_len) as usize, 0);
        out
    }
}
