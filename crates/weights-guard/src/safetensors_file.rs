//! The safetensors checker: 8-byte little-endian header length, a JSON header
//! of `{name: {dtype, shape, data_offsets}}` plus an optional `__metadata__`
//! string map, then a data buffer the tensors must cover exactly.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::safetensors_json::{parse_header, RawEntry, Shallow};
use crate::{GuardError, Limits, MEMORY};

/// A safetensors element type, as the format's `dtype` strings name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)] // the format's own spelling
pub enum SafetensorsDtype {
    /// Boolean, one byte.
    BOOL,
    /// MX float4 (e2m1), half a byte.
    F4,
    /// MX float6 (e2m3), six bits.
    F6_E2M3,
    /// MX float6 (e3m2), six bits.
    F6_E3M2,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// float8 e5m2.
    F8_E5M2,
    /// float8 e4m3.
    F8_E4M3,
    /// float8 e8m0 (MX scales).
    F8_E8M0,
    /// float8 e4m3, finite, unsigned zero.
    F8_E4M3FNUZ,
    /// float8 e5m2, finite, unsigned zero.
    F8_E5M2FNUZ,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// IEEE single precision.
    F32,
    /// Complex of two f32.
    C64,
    /// IEEE double precision.
    F64,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
}

impl SafetensorsDtype {
    const ALL: [Self; 22] = [
        Self::BOOL,
        Self::F4,
        Self::F6_E2M3,
        Self::F6_E3M2,
        Self::U8,
        Self::I8,
        Self::F8_E5M2,
        Self::F8_E4M3,
        Self::F8_E8M0,
        Self::F8_E4M3FNUZ,
        Self::F8_E5M2FNUZ,
        Self::I16,
        Self::U16,
        Self::F16,
        Self::BF16,
        Self::I32,
        Self::U32,
        Self::F32,
        Self::C64,
        Self::F64,
        Self::I64,
        Self::U64,
    ];

    /// The dtype a header string names, if safetensors defines it.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The header string for this dtype.
    pub fn name(self) -> &'static str {
        match self {
            Self::BOOL => "BOOL",
            Self::F4 => "F4",
            Self::F6_E2M3 => "F6_E2M3",
            Self::F6_E3M2 => "F6_E3M2",
            Self::U8 => "U8",
            Self::I8 => "I8",
            Self::F8_E5M2 => "F8_E5M2",
            Self::F8_E4M3 => "F8_E4M3",
            Self::F8_E8M0 => "F8_E8M0",
            Self::F8_E4M3FNUZ => "F8_E4M3FNUZ",
            Self::F8_E5M2FNUZ => "F8_E5M2FNUZ",
            Self::I16 => "I16",
            Self::U16 => "U16",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::I32 => "I32",
            Self::U32 => "U32",
            Self::F32 => "F32",
            Self::C64 => "C64",
            Self::F64 => "F64",
            Self::I64 => "I64",
            Self::U64 => "U64",
        }
    }

    /// Bits per element (sub-byte types pack several elements per byte).
    pub fn bits(self) -> u64 {
        match self {
            Self::F4 => 4,
            Self::F6_E2M3 | Self::F6_E3M2 => 6,
            Self::BOOL
            | Self::U8
            | Self::I8
            | Self::F8_E5M2
            | Self::F8_E4M3
            | Self::F8_E8M0
            | Self::F8_E4M3FNUZ
            | Self::F8_E5M2FNUZ => 8,
            Self::I16 | Self::U16 | Self::F16 | Self::BF16 => 16,
            Self::I32 | Self::U32 | Self::F32 => 32,
            Self::C64 | Self::F64 | Self::I64 | Self::U64 => 64,
        }
    }
}

impl fmt::Display for SafetensorsDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One tensor of a checked safetensors file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafetensorsTensor {
    /// Its name.
    pub name: String,
    /// Its element type.
    pub dtype: SafetensorsDtype,
    /// Its shape (row-major, outermost first).
    pub shape: Vec<u64>,
    /// `[begin, end)` relative to the data section.
    pub data_offsets: [u64; 2],
}

impl SafetensorsTensor {
    /// Bytes the tensor occupies.
    pub fn byte_len(&self) -> u64 {
        self.data_offsets[1] - self.data_offsets[0]
    }
}

/// What a valid safetensors file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafetensorsSummary {
    /// Length of the JSON header in bytes.
    pub header_len: u64,
    /// Length of the data section in bytes (file length - 8 - header).
    pub data_len: u64,
    /// The tensors in data order.
    pub tensors: Vec<SafetensorsTensor>,
    /// The `__metadata__` map (empty when absent).
    pub metadata: BTreeMap<String, String>,
}

/// Checks the safetensors file at `path`, reading only its header: the data
/// section is never read, and the header is read only once its declared
/// length is known to be within [`Limits::max_safetensors_header`] and the
/// file.
pub fn check_safetensors(path: &Path, limits: &Limits) -> Result<SafetensorsSummary, GuardError> {
    let mut file = File::open(path).map_err(GuardError::io(path, "opening"))?;
    let file_len = file
        .metadata()
        .map_err(GuardError::io(path, "reading metadata of"))?
        .len();
    if file_len < 8 {
        return Err(GuardError::SafetensorsTooShort {
            path: path.to_path_buf(),
            len: file_len,
        });
    }
    let mut len_bytes = [0_u8; 8];
    file.read_exact(&mut len_bytes)
        .map_err(GuardError::io(path, "reading the header length of"))?;
    let header_len = u64::from_le_bytes(len_bytes);
    let n = checked_header_len(path, header_len, file_len, limits)?;
    let mut header = vec![0_u8; n];
    file.read_exact(&mut header)
        .map_err(GuardError::io(path, "reading the header of"))?;
    check_header(path, &header, file_len, limits)
}

/// [`check_safetensors`] on a whole file held in memory (for fuzzing and
/// tests). Errors name the path `<memory>`.
pub fn check_safetensors_bytes(
    bytes: &[u8],
    limits: &Limits,
) -> Result<SafetensorsSummary, GuardError> {
    let path = Path::new(MEMORY);
    let file_len = bytes.len() as u64;
    let Some((len_bytes, rest)) = bytes.split_first_chunk::<8>() else {
        return Err(GuardError::SafetensorsTooShort {
            path: path.to_path_buf(),
            len: file_len,
        });
    };
    let n = checked_header_len(path, u64::from_le_bytes(*len_bytes), file_len, limits)?;
    let header = rest
        .get(..n)
        .ok_or(GuardError::SafetensorsHeaderBeyondFile {
            path: path.to_path_buf(),
            header_len: n as u64,
            file_len,
        })?;
    check_header(path, header, file_len, limits)
}

/// The header length as a `usize`, once it is known to fit the limit and the
/// file.
fn checked_header_len(
    path: &Path,
    header_len: u64,
    file_len: u64,
    limits: &Limits,
) -> Result<usize, GuardError> {
    if header_len > limits.max_safetensors_header {
        return Err(GuardError::SafetensorsHeaderTooLarge {
            path: path.to_path_buf(),
            header_len,
            limit: limits.max_safetensors_header,
        });
    }
    let beyond = || GuardError::SafetensorsHeaderBeyondFile {
        path: path.to_path_buf(),
        header_len,
        file_len,
    };
    if header_len > file_len.saturating_sub(8) {
        return Err(beyond());
    }
    usize::try_from(header_len).map_err(|_| beyond())
}

/// Checks the JSON header bytes of a file of `file_len` bytes.
fn check_header(
    path: &Path,
    header: &[u8],
    file_len: u64,
    limits: &Limits,
) -> Result<SafetensorsSummary, GuardError> {
    let header_len = header.len() as u64;
    let data_len = file_len.saturating_sub(8).saturating_sub(header_len);
    let text = std::str::from_utf8(header).map_err(|e| GuardError::SafetensorsHeaderNotUtf8 {
        path: path.to_path_buf(),
        valid_up_to: e.valid_up_to(),
    })?;
    match text.trim_start().chars().next() {
        Some('{') => {}
        Some(_) => {
            return Err(GuardError::SafetensorsHeaderNotObject {
                path: path.to_path_buf(),
            })
        }
        None => {
            return Err(GuardError::SafetensorsHeaderNotJson {
                path: path.to_path_buf(),
                message: "the header is empty".into(),
            })
        }
    }
    let raw = parse_header(path, text, limits)?;
    let mut tensors = Vec::with_capacity(raw.entries.len());
    for (name, entry) in raw.entries {
        tensors.push(check_entry(path, name, entry, data_len, limits)?);
    }
    check_coverage(path, &mut tensors, data_len)?;
    Ok(SafetensorsSummary {
        header_len,
        data_len,
        tensors,
        metadata: raw.metadata,
    })
}

/// Checks one entry's fields against each other and the data section.
fn check_entry(
    path: &Path,
    name: String,
    entry: RawEntry,
    data_len: u64,
    limits: &Limits,
) -> Result<SafetensorsTensor, GuardError> {
    let missing = |field| GuardError::SafetensorsMissingField {
        path: path.to_path_buf(),
        tensor: name.clone(),
        field,
    };
    let wrong_type = |field, expected| GuardError::SafetensorsFieldType {
        path: path.to_path_buf(),
        tensor: name.clone(),
        field,
        expected,
    };

    let dtype = match entry.dtype.ok_or_else(|| missing("dtype"))? {
        Shallow::Str(s) => {
            SafetensorsDtype::from_name(&s).ok_or_else(|| GuardError::SafetensorsUnknownDtype {
                path: path.to_path_buf(),
                tensor: name.clone(),
                dtype: s,
            })?
        }
        _ => return Err(wrong_type("dtype", "a string")),
    };

    let (dims, n_dims) = match entry.shape.ok_or_else(|| missing("shape"))? {
        Shallow::Seq { items, len } => (items, len),
        _ => return Err(wrong_type("shape", "an array of non-negative integers")),
    };
    if n_dims > limits.max_dims as u64 {
        return Err(GuardError::SafetensorsTooManyDims {
            path: path.to_path_buf(),
            tensor: name,
            dims: n_dims,
            limit: limits.max_dims,
        });
    }
    let mut shape = Vec::with_capacity(dims.len());
    for (index, dim) in dims.into_iter().enumerate() {
        match dim {
            Shallow::UInt(d) => shape.push(d),
            other => {
                return Err(GuardError::SafetensorsBadDim {
                    path: path.to_path_buf(),
                    tensor: name,
                    index,
                    value: other.to_string(),
                })
            }
        }
    }

    let offsets_type = "[begin, end]: two non-negative integers";
    let [begin, end] = match entry.data_offsets.ok_or_else(|| missing("data_offsets"))? {
        Shallow::Seq { items, len: 2 } => match items.as_slice() {
            [Shallow::UInt(b), Shallow::UInt(e)] => [*b, *e],
            _ => return Err(wrong_type("data_offsets", offsets_type)),
        },
        _ => return Err(wrong_type("data_offsets", offsets_type)),
    };
    if end < begin {
        return Err(GuardError::SafetensorsOffsetsReversed {
            path: path.to_path_buf(),
            tensor: name,
            begin,
            end,
        });
    }

    let elements = shape.iter().try_fold(1_u64, |acc, &d| acc.checked_mul(d));
    let Some((elements, bits)) = elements.and_then(|n| Some((n, n.checked_mul(dtype.bits())?)))
    else {
        return Err(GuardError::SafetensorsSizeOverflow {
            path: path.to_path_buf(),
            tensor: name,
            dtype: dtype.name(),
            shape,
        });
    };
    if bits % 8 != 0 {
        return Err(GuardError::SafetensorsPartialByte {
            path: path.to_path_buf(),
            tensor: name,
            dtype: dtype.name(),
            elements,
        });
    }
    let expected = bits / 8;
    if end - begin != expected {
        return Err(GuardError::SafetensorsByteLenMismatch {
            path: path.to_path_buf(),
            tensor: name,
            dtype: dtype.name(),
            shape,
            expected,
            actual: end - begin,
        });
    }
    if end > data_len {
        return Err(GuardError::SafetensorsOutOfBounds {
            path: path.to_path_buf(),
            tensor: name,
            begin,
            end,
            data_len,
        });
    }
    Ok(SafetensorsTensor {
        name,
        dtype,
        shape,
        data_offsets: [begin, end],
    })
}

/// Sorts `tensors` into data order and checks they tile the data section:
/// no overlaps, no gaps, nothing left over.
fn check_coverage(
    path: &Path,
    tensors: &mut [SafetensorsTensor],
    data_len: u64,
) -> Result<(), GuardError> {
    tensors.sort_by_key(|t| t.data_offsets);
    let mut covered = 0_u64;
    let mut previous: Option<&SafetensorsTensor> = None;
    for tensor in tensors.iter() {
        let [begin, end] = tensor.data_offsets;
        if begin < covered {
            // `covered > 0` implies a previous tensor.
            let first = previous.map(|p| p.name.clone()).unwrap_or_default();
            return Err(GuardError::SafetensorsOverlap {
                path: path.to_path_buf(),
                first,
                first_end: covered,
                second: tensor.name.clone(),
                second_begin: begin,
            });
        }
        if begin > covered {
            return Err(GuardError::SafetensorsGap {
                path: path.to_path_buf(),
                after: previous.map(|p| p.name.clone()),
                before: tensor.name.clone(),
                gap_begin: covered,
                gap_end: begin,
            });
        }
        covered = end;
        previous = Some(tensor);
    }
    if covered < data_len {
        return Err(GuardError::SafetensorsTrailingBytes {
            path: path.to_path_buf(),
            covered,
            data_len,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_round_trip() {
        for dtype in SafetensorsDtype::ALL {
            assert_eq!(SafetensorsDtype::from_name(dtype.name()), Some(dtype));
        }
        assert_eq!(SafetensorsDtype::from_name("f32"), None);
        assert_eq!(SafetensorsDtype::from_name("Q4_0"), None);
    }
}
