//! The GGUF (v2, v3) checker: magic, version, counts, metadata key/values,
//! tensor infos, then tensor data at aligned offsets from an aligned data
//! section. [`check_gguf`] validates metadata values and skips them, never
//! stored (except `general.alignment` and `general.architecture`), so memory
//! stays bounded by one string however large the metadata is; [`read_gguf`]
//! keeps them too, within [`Limits::max_metadata_bytes`].

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::gguf_value::{GgufMetadata, GgufValue};
use crate::{GgmlType, GuardError, Limits, MEMORY};

const MAGIC: [u8; 4] = *b"GGUF";
const DEFAULT_ALIGNMENT: u32 = 32;

/// GGUF metadata value types.
pub(crate) mod value_type {
    pub(crate) const U8: u32 = 0;
    pub(crate) const I8: u32 = 1;
    pub(crate) const U16: u32 = 2;
    pub(crate) const I16: u32 = 3;
    pub(crate) const U32: u32 = 4;
    pub(crate) const I32: u32 = 5;
    pub(crate) const F32: u32 = 6;
    pub(crate) const BOOL: u32 = 7;
    pub(crate) const STRING: u32 = 8;
    pub(crate) const ARRAY: u32 = 9;
    pub(crate) const U64: u32 = 10;
    pub(crate) const I64: u32 = 11;
    pub(crate) const F64: u32 = 12;
}

/// Bytes of a fixed-size value type.
fn fixed_size(ty: u32) -> Option<u64> {
    use value_type::*;
    match ty {
        U8 | I8 | BOOL => Some(1),
        U16 | I16 => Some(2),
        U32 | I32 | F32 => Some(4),
        U64 | I64 | F64 => Some(8),
        _ => None,
    }
}

/// The fewest bytes one value of type `ty` can take (an empty string is its
/// 8-byte length, an empty array its type and count).
fn min_size(ty: u32) -> Option<u64> {
    match ty {
        value_type::STRING => Some(8),
        value_type::ARRAY => Some(12),
        _ => fixed_size(ty),
    }
}

/// Smallest metadata entry: key length, a 1-byte key, value type, 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Smallest tensor info: name length, a 1-byte name, dimension count, one
/// dimension, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 1 + 4 + 8 + 4 + 8;

/// One tensor of a checked GGUF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensor {
    /// Its name.
    pub name: String,
    /// Its ggml type.
    pub ggml_type: GgmlType,
    /// Its shape in ggml order (`ne[0]`, the contiguous row length, first).
    pub shape: Vec<u64>,
    /// Offset of its data from the start of the data section.
    pub offset: u64,
    /// Bytes of data.
    pub byte_len: u64,
}

/// What a valid GGUF file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufSummary {
    /// The format version (2 or 3).
    pub version: u32,
    /// The data alignment (`general.alignment`, 32 when absent).
    pub alignment: u32,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    /// The metadata keys in file order.
    pub metadata_keys: Vec<String>,
    /// `general.architecture`, when present as a string.
    pub architecture: Option<String>,
    /// The tensors in file order.
    pub tensors: Vec<GgufTensor>,
}

/// Checks the GGUF file at `path`, reading only its header: tensor data is
/// never read, only its extent compared with the file's length.
pub fn check_gguf(path: &Path, limits: &Limits) -> Result<GgufSummary, GuardError> {
    let file = File::open(path).map_err(GuardError::io(path, "opening"))?;
    let len = file
        .metadata()
        .map_err(GuardError::io(path, "reading metadata of"))?
        .len();
    parse(BufReader::new(file), len, path, limits, None)
}

/// [`check_gguf`], keeping every metadata value as well: what a loader
/// reads the model's configuration and tokenizer from without any other
/// reader touching the file's header.
pub fn read_gguf(path: &Path, limits: &Limits) -> Result<(GgufSummary, GgufMetadata), GuardError> {
    let file = File::open(path).map_err(GuardError::io(path, "opening"))?;
    let len = file
        .metadata()
        .map_err(GuardError::io(path, "reading metadata of"))?
        .len();
    let mut metadata = GgufMetadata::new();
    let summary = parse(BufReader::new(file), len, path, limits, Some(&mut metadata))?;
    Ok((summary, metadata))
}

/// [`check_gguf`] on any seekable reader, read from its start; its length is
/// found by seeking to the end. Errors name the path `<reader>`.
pub fn check_gguf_reader<R: Read + Seek>(
    mut reader: R,
    limits: &Limits,
) -> Result<GgufSummary, GuardError> {
    let path = Path::new("<reader>");
    let len = reader
        .seek(SeekFrom::End(0))
        .map_err(GuardError::io(path, "seeking"))?;
    reader
        .seek(SeekFrom::Start(0))
        .map_err(GuardError::io(path, "seeking"))?;
    parse(reader, len, path, limits, None)
}

/// [`check_gguf`] on a whole file held in memory (for fuzzing and tests).
/// Errors name the path `<memory>`.
pub fn check_gguf_bytes(bytes: &[u8], limits: &Limits) -> Result<GgufSummary, GuardError> {
    parse(bytes, bytes.len() as u64, Path::new(MEMORY), limits, None)
}

/// [`read_gguf`] on a whole file held in memory (for fuzzing and tests).
pub fn read_gguf_bytes(
    bytes: &[u8],
    limits: &Limits,
) -> Result<(GgufSummary, GgufMetadata), GuardError> {
    let mut metadata = GgufMetadata::new();
    let summary = parse(
        bytes,
        bytes.len() as u64,
        Path::new(MEMORY),
        limits,
        Some(&mut metadata),
    )?;
    Ok((summary, metadata))
}

fn parse<R: Read>(
    reader: R,
    len: u64,
    path: &Path,
    limits: &Limits,
    mut keep: Option<&mut GgufMetadata>,
) -> Result<GgufSummary, GuardError> {
    let mut input = Input {
        reader,
        pos: 0,
        len,
        path,
        limits,
        scratch: Vec::new(),
        kept_bytes: 0,
    };
    let p = || path.to_path_buf();

    let magic = input.bytes::<4>("magic")?;
    if magic != MAGIC {
        return Err(GuardError::GgufBadMagic {
            path: p(),
            found: magic,
        });
    }
    let version = input.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(GuardError::GgufUnsupportedVersion { path: p(), version });
    }
    let tensor_count = input.u64("tensor count")?;
    let kv_count = input.u64("metadata count")?;
    if tensor_count > limits.max_tensors {
        return Err(GuardError::GgufTooManyTensors {
            path: p(),
            count: tensor_count,
            limit: limits.max_tensors,
        });
    }
    if kv_count > limits.max_kvs {
        return Err(GuardError::GgufTooManyKvs {
            path: p(),
            count: kv_count,
            limit: limits.max_kvs,
        });
    }
    let min_bytes = tensor_count
        .saturating_mul(MIN_TENSOR_INFO_BYTES)
        .saturating_add(kv_count.saturating_mul(MIN_KV_BYTES));
    if min_bytes > input.remaining() {
        return Err(GuardError::GgufCountsExceedFile {
            path: p(),
            tensor_count,
            kv_count,
            min_bytes,
            remaining: input.remaining(),
        });
    }

    // Collections grow only as entries are actually read, each of which
    // consumed bytes of the file: no capacity comes from a count.
    let mut metadata_keys = Vec::new();
    let mut seen_keys = HashSet::new();
    let mut alignment = DEFAULT_ALIGNMENT;
    let mut architecture = None;
    for _ in 0..kv_count {
        let key = input.name("metadata key")?;
        if !seen_keys.insert(key.clone()) {
            return Err(GuardError::GgufDuplicateKey { path: p(), key });
        }
        let ty = input.u32("metadata value type")?;
        if let Some(kept) = keep.as_deref_mut() {
            let value = input.value(&key, ty, 0)?;
            match (key.as_str(), &value) {
                ("general.alignment", GgufValue::U32(a)) => alignment = *a,
                ("general.alignment", other) => {
                    return Err(GuardError::GgufAlignmentType {
                        path: p(),
                        value_type: other.type_id(),
                    })
                }
                ("general.architecture", GgufValue::String(a)) => architecture = Some(a.clone()),
                _ => {}
            }
            if !alignment.is_power_of_two() {
                return Err(GuardError::GgufBadAlignment {
                    path: p(),
                    alignment,
                });
            }
            kept.insert(key.clone(), value);
            metadata_keys.push(key);
            continue;
        }
        match key.as_str() {
            "general.alignment" => {
                if ty != value_type::U32 {
                    return Err(GuardError::GgufAlignmentType {
                        path: p(),
                        value_type: ty,
                    });
                }
                alignment = input.u32("general.alignment")?;
                if !alignment.is_power_of_two() {
                    return Err(GuardError::GgufBadAlignment {
                        path: p(),
                        alignment,
                    });
                }
            }
            "general.architecture" if ty == value_type::STRING => {
                architecture = Some(input.string("metadata string value")?.to_owned());
            }
            _ => input.skip_value(&key, ty)?,
        }
        metadata_keys.push(key);
    }

    let mut tensors = Vec::new();
    let mut seen_names = HashSet::new();
    for _ in 0..tensor_count {
        let tensor = input.tensor_info(u64::from(alignment))?;
        if !seen_names.insert(tensor.name.clone()) {
            return Err(GuardError::GgufDuplicateTensor {
                path: p(),
                name: tensor.name,
            });
        }
        tensors.push(tensor);
    }

    let data_offset = input
        .pos
        .checked_next_multiple_of(u64::from(alignment))
        .unwrap_or(u64::MAX);
    for t in &tensors {
        let start = data_offset.saturating_add(t.offset);
        let end = start.saturating_add(t.byte_len);
        if end > len {
            return Err(GuardError::GgufTensorBeyondFile {
                path: p(),
                tensor: t.name.clone(),
                start,
                end,
                file_len: len,
            });
        }
    }
    check_overlaps(path, &tensors)?;

    Ok(GgufSummary {
        version,
        alignment,
        data_offset,
        metadata_keys,
        architecture,
        tensors,
    })
}

/// Tensors (already known to lie inside the file) must not share bytes.
fn check_overlaps(path: &Path, tensors: &[GgufTensor]) -> Result<(), GuardError> {
    let mut by_offset: Vec<&GgufTensor> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        let (first, second) = (pair[0], pair[1]);
        let first_end = first.offset.saturating_add(first.byte_len);
        if second.offset < first_end {
            return Err(GuardError::GgufOverlap {
                path: path.to_path_buf(),
                first: first.name.clone(),
                first_end,
                second: second.name.clone(),
                second_start: second.offset,
            });
        }
    }
    Ok(())
}

/// The reader with its position, the file length, and the scratch buffer
/// strings are read into.
struct Input<'a, R> {
    reader: R,
    pos: u64,
    len: u64,
    path: &'a Path,
    limits: &'a Limits,
    scratch: Vec<u8>,
    /// What [`Input::value`] has kept so far, counted as
    /// [`Limits::max_metadata_bytes`] counts it.
    kept_bytes: u64,
}

impl<R: Read> Input<'_, R> {
    fn path(&self) -> PathBuf {
        self.path.to_path_buf()
    }

    fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    fn truncated(&self, what: &'static str, needed: u64) -> GuardError {
        GuardError::GgufTruncated {
            path: self.path(),
            what,
            offset: self.pos,
            needed,
            remaining: self.remaining(),
        }
    }

    fn read_error(&self, what: &'static str, needed: u64, e: io::Error) -> GuardError {
        // The reader ended before the length it reported (a file shrinking
        // under us reads the same as a truncated one).
        if e.kind() == io::ErrorKind::UnexpectedEof {
            self.truncated(what, needed)
        } else {
            GuardError::Io {
                path: self.path(),
                action: "reading",
                source: e,
            }
        }
    }

    fn fill(&mut self, buf: &mut [u8], what: &'static str) -> Result<(), GuardError> {
        let n = buf.len() as u64;
        if n > self.remaining() {
            return Err(self.truncated(what, n));
        }
        if let Err(e) = self.reader.read_exact(buf) {
            return Err(self.read_error(what, n, e));
        }
        self.pos += n;
        Ok(())
    }

    fn bytes<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GuardError> {
        let mut buf = [0_u8; N];
        self.fill(&mut buf, what)?;
        Ok(buf)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GuardError> {
        self.bytes(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GuardError> {
        self.bytes(what).map(u64::from_le_bytes)
    }

    /// Reads and discards `n` bytes without buffering them.
    fn skip(&mut self, n: u64, what: &'static str) -> Result<(), GuardError> {
        if n > self.remaining() {
            return Err(self.truncated(what, n));
        }
        match io::copy(&mut (&mut self.reader).take(n), &mut io::sink()) {
            Ok(copied) if copied == n => {}
            Ok(_) => return Err(self.truncated(what, n)),
            Err(e) => return Err(self.read_error(what, n, e)),
        }
        self.pos += n;
        Ok(())
    }

    /// Reads a string into the scratch buffer, once its length is within the
    /// limit and the file, and checks it is UTF-8.
    fn string(&mut self, what: &'static str) -> Result<&str, GuardError> {
        let offset = self.pos;
        let len = self.u64(what)?;
        if len > self.limits.max_string_len {
            return Err(GuardError::GgufStringTooLong {
                path: self.path(),
                what,
                offset,
                len,
                limit: self.limits.max_string_len,
            });
        }
        if len > self.remaining() {
            return Err(self.truncated(what, len));
        }
        let n = usize::try_from(len).map_err(|_| self.truncated(what, len))?;
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.resize(n, 0);
        let filled = self.fill(&mut scratch, what);
        self.scratch = scratch;
        filled?;
        std::str::from_utf8(&self.scratch).map_err(|_| GuardError::GgufStringNotUtf8 {
            path: self.path.to_path_buf(),
            what,
            offset,
        })
    }

    /// A non-empty string that names something (a key or a tensor).
    fn name(&mut self, what: &'static str) -> Result<String, GuardError> {
        let offset = self.pos;
        let name = self.string(what)?.to_owned();
        if name.is_empty() {
            return Err(GuardError::GgufEmptyName {
                path: self.path(),
                what,
                offset,
            });
        }
        Ok(name)
    }

    /// Validates and discards one metadata value of type `ty`.
    fn skip_value(&mut self, key: &str, ty: u32) -> Result<(), GuardError> {
        match ty {
            value_type::STRING => self.string("metadata string value").map(|_| ()),
            value_type::ARRAY => self.skip_array(key, 0),
            _ => match fixed_size(ty) {
                Some(n) => self.skip(n, "metadata value"),
                None => Err(self.unknown_type(key, ty)),
            },
        }
    }

    /// Validates and discards an array; `depth` is 0 for a value, 1 for an
    /// array inside an array (whose elements may not be arrays again).
    fn skip_array(&mut self, key: &str, depth: u8) -> Result<(), GuardError> {
        let elem = self.u32("array element type")?;
        let count = self.u64("array length")?;
        let needed = self.check_array(key, elem, count, depth)?;
        match elem {
            value_type::STRING => {
                for _ in 0..count {
                    self.string("metadata array string")?;
                }
                Ok(())
            }
            value_type::ARRAY => {
                for _ in 0..count {
                    self.skip_array(key, depth + 1)?;
                }
                Ok(())
            }
            _ => self.skip(needed, "array elements"),
        }
    }

    /// Checks an array's element type, depth and length against the
    /// limits and the bytes left; the fewest bytes its elements take.
    fn check_array(&self, key: &str, elem: u32, count: u64, depth: u8) -> Result<u64, GuardError> {
        if elem == value_type::ARRAY && depth >= 1 {
            return Err(GuardError::GgufNestedArray {
                path: self.path(),
                key: key.to_owned(),
            });
        }
        let Some(min) = min_size(elem) else {
            return Err(self.unknown_type(key, elem));
        };
        if count > self.limits.max_array_len {
            return Err(GuardError::GgufArrayTooLong {
                path: self.path(),
                key: key.to_owned(),
                len: count,
                limit: self.limits.max_array_len,
            });
        }
        let needed = count.saturating_mul(min);
        if needed > self.remaining() {
            return Err(self.truncated("array elements", needed));
        }
        Ok(needed)
    }

    /// Reads one metadata value of type `ty`, validated as
    /// [`Input::skip_value`] validates it; `depth` as in
    /// [`Input::skip_array`].
    fn value(&mut self, key: &str, ty: u32, depth: u8) -> Result<GgufValue, GuardError> {
        use value_type::*;
        self.keep_bytes(key, 32)?;
        let value = match ty {
            U8 => GgufValue::U8(self.bytes::<1>("metadata value")?[0]),
            I8 => GgufValue::I8(i8::from_le_bytes(self.bytes("metadata value")?)),
            U16 => GgufValue::U16(u16::from_le_bytes(self.bytes("metadata value")?)),
            I16 => GgufValue::I16(i16::from_le_bytes(self.bytes("metadata value")?)),
            U32 => GgufValue::U32(self.u32("metadata value")?),
            I32 => GgufValue::I32(i32::from_le_bytes(self.bytes("metadata value")?)),
            U64 => GgufValue::U64(self.u64("metadata value")?),
            I64 => GgufValue::I64(i64::from_le_bytes(self.bytes("metadata value")?)),
            F32 => GgufValue::F32(f32::from_le_bytes(self.bytes("metadata value")?)),
            F64 => GgufValue::F64(f64::from_le_bytes(self.bytes("metadata value")?)),
            BOOL => GgufValue::Bool(self.bytes::<1>("metadata value")?[0] != 0),
            STRING => {
                let what = if depth == 0 {
                    "metadata string value"
                } else {
                    "metadata array string"
                };
                let text = self.string(what)?.to_owned();
                self.keep_bytes(key, text.len() as u64)?;
                GgufValue::String(text)
            }
            ARRAY => {
                let elem = self.u32("array element type")?;
                let count = self.u64("array length")?;
                self.check_array(key, elem, count, depth)?;
                // Grows only as elements are read.
                let mut items = Vec::new();
                for _ in 0..count {
                    items.push(self.value(key, elem, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            _ => return Err(self.unknown_type(key, ty)),
        };
        Ok(value)
    }

    /// Counts `n` more bytes kept for `key` against the limit.
    fn keep_bytes(&mut self, key: &str, n: u64) -> Result<(), GuardError> {
        self.kept_bytes = self.kept_bytes.saturating_add(n);
        if self.kept_bytes > self.limits.max_metadata_bytes {
            return Err(GuardError::GgufMetadataTooLarge {
                path: self.path(),
                key: key.to_owned(),
                limit: self.limits.max_metadata_bytes,
            });
        }
        Ok(())
    }

    fn unknown_type(&self, key: &str, value_type: u32) -> GuardError {
        GuardError::GgufUnknownValueType {
            path: self.path(),
            key: key.to_owned(),
            value_type,
        }
    }

    /// Reads one tensor info and checks what can be checked before the data
    /// section's position is known.
    fn tensor_info(&mut self, alignment: u64) -> Result<GgufTensor, GuardError> {
        let name = self.name("tensor name")?;
        let n_dims = self.u32("tensor dimension count")?;
        let max_dims = self.limits.max_dims;
        if n_dims == 0 || usize::try_from(n_dims).map_or(true, |n| n > max_dims) {
            return Err(GuardError::GgufBadDimCount {
                path: self.path(),
                tensor: name,
                n_dims,
                limit: max_dims,
            });
        }
        let mut shape = Vec::new();
        for _ in 0..n_dims {
            shape.push(self.u64("tensor dimension")?);
        }
        let type_id = self.u32("tensor type")?;
        let offset = self.u64("tensor offset")?;

        if shape.contains(&0) {
            return Err(GuardError::GgufZeroDim {
                path: self.path(),
                tensor: name,
                shape,
            });
        }
        // ggml counts elements and bytes in int64_t.
        let fits = |n: &u64| i64::try_from(*n).is_ok();
        let Some(elements) = shape
            .iter()
            .try_fold(1_u64, |acc, &d| acc.checked_mul(d))
            .filter(fits)
        else {
            return Err(GuardError::GgufShapeOverflow {
                path: self.path(),
                tensor: name,
                shape,
            });
        };
        let Some(ggml_type) = GgmlType::from_id(type_id) else {
            return Err(GuardError::GgufUnsupportedType {
                path: self.path(),
                tensor: name,
                ggml_type: type_id,
            });
        };
        // ggml stores and indexes rows of whole blocks: ne[0] must split into
        // blocks, which also makes the element count a whole number of blocks.
        let ne0 = shape[0];
        if ne0 % ggml_type.block_size() != 0 {
            return Err(GuardError::GgufBlockMismatch {
                path: self.path(),
                tensor: name,
                ggml_type: ggml_type.name(),
                ne0,
                block_size: ggml_type.block_size(),
            });
        }
        let Some(byte_len) = (elements / ggml_type.block_size())
            .checked_mul(ggml_type.block_bytes())
            .filter(fits)
        else {
            return Err(GuardError::GgufShapeOverflow {
                path: self.path(),
                tensor: name,
                shape,
            });
        };
        if offset % alignment != 0 {
            return Err(GuardError::GgufUnalignedOffset {
                path: self.path(),
                tensor: name,
                offset,
                alignment,
            });
        }
        Ok(GgufTensor {
            name,
            ggml_type,
            shape,
            offset,
            byte_len,
        })
    }
}
