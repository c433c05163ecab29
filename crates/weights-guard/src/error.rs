//! The crate's error type: one variant per way a weights file can be refused,
//! each carrying the values that explain it.

use std::path::{Path, PathBuf};

/// Why a weights file was refused. Every variant names the file (`path`; the
/// byte-slice and reader entry points use a placeholder such as `<memory>`).
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// The file could not be opened or read.
    #[error("{path}: {action}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done, e.g. "opening".
        action: &'static str,
        /// The underlying error.
        source: std::io::Error,
    },

    /// The file is a pickle checkpoint, which is never loaded.
    #[error(
        "{path}: refusing a .{extension} checkpoint: it is a Python pickle, and unpickling can \
         run arbitrary code; convert it to safetensors (in a trusted sandbox, e.g. load it with \
         PyTorch and write it with safetensors' save_file) and load the .safetensors file instead"
    )]
    PickleRefused {
        /// The file.
        path: PathBuf,
        /// Its extension, as written in the file name.
        extension: String,
    },

    /// The extension is neither `.safetensors` nor `.gguf`.
    #[error("{path}: unknown weights format (expected a .safetensors or .gguf file)")]
    UnknownFormat {
        /// The file.
        path: PathBuf,
    },

    // ---- safetensors -------------------------------------------------------
    /// The file cannot even hold the 8-byte header length.
    #[error("{path}: safetensors file has {len} bytes, fewer than the 8-byte header length")]
    SafetensorsTooShort {
        /// The file.
        path: PathBuf,
        /// The file's length.
        len: u64,
    },

    /// The declared header length exceeds [`crate::Limits::max_safetensors_header`].
    #[error(
        "{path}: safetensors header declares {header_len} bytes, more than the limit of {limit}"
    )]
    SafetensorsHeaderTooLarge {
        /// The file.
        path: PathBuf,
        /// The declared header length.
        header_len: u64,
        /// The limit.
        limit: u64,
    },

    /// The declared header runs past the end of the file.
    #[error(
        "{path}: safetensors header declares {header_len} bytes but the file has only {file_len} \
         bytes (8 + header must fit)"
    )]
    SafetensorsHeaderBeyondFile {
        /// The file.
        path: PathBuf,
        /// The declared header length.
        header_len: u64,
        /// The file's length.
        file_len: u64,
    },

    /// The header is not UTF-8.
    #[error("{path}: safetensors header is not UTF-8 (valid up to byte {valid_up_to})")]
    SafetensorsHeaderNotUtf8 {
        /// The file.
        path: PathBuf,
        /// Length of the valid UTF-8 prefix.
        valid_up_to: usize,
    },

    /// The header is not JSON.
    #[error("{path}: safetensors header is not valid JSON: {message}")]
    SafetensorsHeaderNotJson {
        /// The file.
        path: PathBuf,
        /// The JSON parser's message, with line and column.
        message: String,
    },

    /// The header is JSON but not an object.
    #[error("{path}: safetensors header is not a JSON object")]
    SafetensorsHeaderNotObject {
        /// The file.
        path: PathBuf,
    },

    /// More tensors than [`crate::Limits::max_tensors`].
    #[error("{path}: safetensors header lists more than {limit} tensors")]
    SafetensorsTooManyTensors {
        /// The file.
        path: PathBuf,
        /// The limit.
        limit: u64,
    },

    /// Two entries have the same name (a JSON object with a repeated key).
    #[error("{path}: tensor {name:?} appears twice in the safetensors header")]
    SafetensorsDuplicateName {
        /// The file.
        path: PathBuf,
        /// The repeated name.
        name: String,
    },

    /// A tensor name is empty.
    #[error("{path}: safetensors header has a tensor with an empty name")]
    SafetensorsEmptyName {
        /// The file.
        path: PathBuf,
    },

    /// A tensor entry is not a JSON object.
    #[error("{path}: entry for tensor {tensor:?} is not a JSON object")]
    SafetensorsEntryNotObject {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
    },

    /// A tensor entry lacks `dtype`, `shape` or `data_offsets`.
    #[error("{path}: tensor {tensor:?} has no {field:?}")]
    SafetensorsMissingField {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The missing field.
        field: &'static str,
    },

    /// A tensor entry has a field other than `dtype`, `shape` and `data_offsets`.
    #[error("{path}: tensor {tensor:?} has an unknown field {field:?}")]
    SafetensorsUnknownField {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The unexpected field.
        field: String,
    },

    /// A tensor entry repeats a field (serde_json would silently keep the last).
    #[error("{path}: tensor {tensor:?} has field {field:?} twice")]
    SafetensorsDuplicateField {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The repeated field.
        field: String,
    },

    /// A field has the wrong JSON type (e.g. `dtype` not a string,
    /// `data_offsets` not two integers).
    #[error("{path}: tensor {tensor:?}: {field:?} must be {expected}")]
    SafetensorsFieldType {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The field.
        field: &'static str,
        /// What the field must be.
        expected: &'static str,
    },

    /// The dtype is not one safetensors defines.
    #[error("{path}: tensor {tensor:?} has unknown dtype {dtype:?}")]
    SafetensorsUnknownDtype {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype as written.
        dtype: String,
    },

    /// More dimensions than [`crate::Limits::max_dims`].
    #[error("{path}: tensor {tensor:?} has {dims} dimensions, more than the limit of {limit}")]
    SafetensorsTooManyDims {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The number of dimensions.
        dims: u64,
        /// The limit.
        limit: usize,
    },

    /// A dimension is negative, fractional or not a number.
    #[error("{path}: tensor {tensor:?}: dimension {index} is {value}, not a non-negative integer")]
    SafetensorsBadDim {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Which dimension.
        index: usize,
        /// The value as JSON.
        value: String,
    },

    /// Element count times dtype size does not fit in 64 bits.
    #[error(
        "{path}: tensor {tensor:?}: shape {shape:?} of {dtype} overflows 64-bit byte arithmetic"
    )]
    SafetensorsSizeOverflow {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype.
        dtype: &'static str,
        /// The shape.
        shape: Vec<u64>,
    },

    /// A sub-byte dtype whose elements do not fill whole bytes.
    #[error(
        "{path}: tensor {tensor:?}: {elements} elements of {dtype} are not a whole number of bytes"
    )]
    SafetensorsPartialByte {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype.
        dtype: &'static str,
        /// The element count.
        elements: u64,
    },

    /// `data_offsets` end before they begin.
    #[error("{path}: tensor {tensor:?}: data_offsets [{begin}, {end}] end before they begin")]
    SafetensorsOffsetsReversed {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Declared begin.
        begin: u64,
        /// Declared end.
        end: u64,
    },

    /// `data_offsets` span a different number of bytes than dtype and shape need.
    #[error(
        "{path}: tensor {tensor:?}: {dtype} {shape:?} needs {expected} bytes but data_offsets \
         span {actual}"
    )]
    SafetensorsByteLenMismatch {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype.
        dtype: &'static str,
        /// The shape.
        shape: Vec<u64>,
        /// Bytes implied by dtype and shape.
        expected: u64,
        /// Bytes spanned by data_offsets.
        actual: u64,
    },

    /// A tensor's bytes lie past the end of the data section.
    #[error(
        "{path}: tensor {tensor:?}: data_offsets [{begin}, {end}] run past the data section of \
         {data_len} bytes"
    )]
    SafetensorsOutOfBounds {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Declared begin.
        begin: u64,
        /// Declared end.
        end: u64,
        /// Length of the data section (file length - 8 - header length).
        data_len: u64,
    },

    /// Two tensors share bytes.
    #[error(
        "{path}: tensors {first:?} (ends at {first_end}) and {second:?} (begins at \
         {second_begin}) overlap"
    )]
    SafetensorsOverlap {
        /// The file.
        path: PathBuf,
        /// The tensor that begins first.
        first: String,
        /// Where it ends.
        first_end: u64,
        /// The tensor that overlaps it.
        second: String,
        /// Where that one begins.
        second_begin: u64,
    },

    /// Bytes between two tensors (or before the first) belong to no tensor.
    #[error(
        "{path}: data bytes [{gap_begin}, {gap_end}) before tensor {before:?} belong to no \
         tensor (safetensors requires the data section fully covered)"
    )]
    SafetensorsGap {
        /// The file.
        path: PathBuf,
        /// The tensor that ends where the gap begins, if any.
        after: Option<String>,
        /// The tensor that begins where the gap ends.
        before: String,
        /// First unused byte (relative to the data section).
        gap_begin: u64,
        /// One past the last unused byte.
        gap_end: u64,
    },

    /// Bytes after the last tensor belong to no tensor.
    #[error(
        "{path}: data section has {data_len} bytes but tensors cover only the first {covered} \
         (safetensors requires the data section fully covered)"
    )]
    SafetensorsTrailingBytes {
        /// The file.
        path: PathBuf,
        /// Where the last tensor ends.
        covered: u64,
        /// Length of the data section.
        data_len: u64,
    },

    /// `__metadata__` is not an object of string values, or repeats a key.
    #[error("{path}: safetensors __metadata__ must map strings to strings: {detail}")]
    SafetensorsBadMetadata {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },

    // ---- GGUF --------------------------------------------------------------
    /// The file does not start with `GGUF`.
    #[error("{path}: not a GGUF file (magic {found:02x?}, expected \"GGUF\")")]
    GgufBadMagic {
        /// The file.
        path: PathBuf,
        /// The first four bytes.
        found: [u8; 4],
    },

    /// A GGUF version other than 2 and 3.
    #[error("{path}: unsupported GGUF version {version} (2 and 3 are supported)")]
    GgufUnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version field.
        version: u32,
    },

    /// The tensor count exceeds [`crate::Limits::max_tensors`].
    #[error("{path}: GGUF header claims {count} tensors, more than the limit of {limit}")]
    GgufTooManyTensors {
        /// The file.
        path: PathBuf,
        /// The claimed count.
        count: u64,
        /// The limit.
        limit: u64,
    },

    /// The metadata count exceeds [`crate::Limits::max_kvs`].
    #[error("{path}: GGUF header claims {count} metadata entries, more than the limit of {limit}")]
    GgufTooManyKvs {
        /// The file.
        path: PathBuf,
        /// The claimed count.
        count: u64,
        /// The limit.
        limit: u64,
    },

    /// The counts need more bytes than the rest of the file holds.
    #[error(
        "{path}: GGUF header claims {tensor_count} tensors and {kv_count} metadata entries, \
         which need at least {min_bytes} bytes, but only {remaining} remain"
    )]
    GgufCountsExceedFile {
        /// The file.
        path: PathBuf,
        /// The claimed tensor count.
        tensor_count: u64,
        /// The claimed metadata count.
        kv_count: u64,
        /// Bytes the smallest possible entries would take (saturating).
        min_bytes: u64,
        /// Bytes left after the fixed header.
        remaining: u64,
    },

    /// The file ends (or a length field points) past its end.
    #[error("{path}: GGUF file truncated: {what} at byte {offset} needs {needed} bytes, {remaining} remain")]
    GgufTruncated {
        /// The file.
        path: PathBuf,
        /// What was being read.
        what: &'static str,
        /// Where it starts.
        offset: u64,
        /// Bytes it needs (saturating).
        needed: u64,
        /// Bytes left in the file.
        remaining: u64,
    },

    /// A string is longer than [`crate::Limits::max_string_len`].
    #[error("{path}: {what} at byte {offset} claims {len} bytes, more than the limit of {limit}")]
    GgufStringTooLong {
        /// The file.
        path: PathBuf,
        /// What string it is (key, value, tensor name).
        what: &'static str,
        /// Where its length field starts.
        offset: u64,
        /// The claimed length.
        len: u64,
        /// The limit.
        limit: u64,
    },

    /// A string is not UTF-8.
    #[error("{path}: {what} at byte {offset} is not UTF-8")]
    GgufStringNotUtf8 {
        /// The file.
        path: PathBuf,
        /// What string it is.
        what: &'static str,
        /// Where its length field starts.
        offset: u64,
    },

    /// A metadata key or tensor name is empty.
    #[error("{path}: empty {what} at byte {offset}")]
    GgufEmptyName {
        /// The file.
        path: PathBuf,
        /// "metadata key" or "tensor name".
        what: &'static str,
        /// Where its length field starts.
        offset: u64,
    },

    /// A metadata value (or array element) type outside 0..=12.
    #[error("{path}: metadata {key:?} has unknown value type {value_type}")]
    GgufUnknownValueType {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The type id.
        value_type: u32,
    },

    /// An array longer than [`crate::Limits::max_array_len`].
    #[error(
        "{path}: metadata {key:?} is an array of {len} elements, more than the limit of {limit}"
    )]
    GgufArrayTooLong {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The claimed length.
        len: u64,
        /// The limit.
        limit: u64,
    },

    /// Metadata kept by `read_gguf` beyond
    /// [`crate::Limits::max_metadata_bytes`].
    #[error("{path}: metadata {key:?} takes the metadata kept past the limit of {limit} bytes")]
    GgufMetadataTooLarge {
        /// The file.
        path: PathBuf,
        /// The key being read.
        key: String,
        /// The limit.
        limit: u64,
    },

    /// Arrays nested more than one level (an array of arrays of arrays).
    #[error("{path}: metadata {key:?} nests arrays more than one level deep")]
    GgufNestedArray {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
    },

    /// A metadata key appears twice.
    #[error("{path}: metadata key {key:?} appears twice")]
    GgufDuplicateKey {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
    },

    /// `general.alignment` is not a u32.
    #[error("{path}: general.alignment has value type {value_type}, expected 4 (u32)")]
    GgufAlignmentType {
        /// The file.
        path: PathBuf,
        /// The type id found.
        value_type: u32,
    },

    /// `general.alignment` is zero or not a power of two.
    #[error("{path}: general.alignment is {alignment}, not a non-zero power of two")]
    GgufBadAlignment {
        /// The file.
        path: PathBuf,
        /// The value found.
        alignment: u32,
    },

    /// A tensor name appears twice.
    #[error("{path}: tensor {name:?} appears twice")]
    GgufDuplicateTensor {
        /// The file.
        path: PathBuf,
        /// The name.
        name: String,
    },

    /// A tensor with no dimensions or more than [`crate::Limits::max_dims`].
    #[error("{path}: tensor {tensor:?} has {n_dims} dimensions; 1 to {limit} are allowed")]
    GgufBadDimCount {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its dimension count.
        n_dims: u32,
        /// The limit.
        limit: usize,
    },

    /// A dimension is zero.
    #[error("{path}: tensor {tensor:?} has a zero dimension in {shape:?}")]
    GgufZeroDim {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its shape (ggml order, fastest-varying first).
        shape: Vec<u64>,
    },

    /// The element count or byte size does not fit in a signed 64-bit value
    /// (ggml's `int64_t`).
    #[error("{path}: tensor {tensor:?}: shape {shape:?} overflows 64-bit size arithmetic")]
    GgufShapeOverflow {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<u64>,
    },

    /// A ggml type this crate does not know (see [`crate::GgmlType`]).
    #[error("{path}: tensor {tensor:?} has unsupported tensor type {ggml_type}")]
    GgufUnsupportedType {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The type id.
        ggml_type: u32,
    },

    /// The first dimension is not a multiple of the type's block size, so rows
    /// (and the element count) do not split into whole blocks.
    #[error(
        "{path}: tensor {tensor:?}: first dimension {ne0} is not a multiple of {ggml_type}'s \
         block size {block_size}"
    )]
    GgufBlockMismatch {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The type's name.
        ggml_type: &'static str,
        /// The first (row) dimension.
        ne0: u64,
        /// The block size.
        block_size: u64,
    },

    /// A tensor's offset is not a multiple of the alignment.
    #[error(
        "{path}: tensor {tensor:?} offset {offset} is not a multiple of the alignment {alignment}"
    )]
    GgufUnalignedOffset {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its offset relative to the data section.
        offset: u64,
        /// The alignment.
        alignment: u64,
    },

    /// A tensor's bytes run past the end of the file.
    #[error(
        "{path}: tensor {tensor:?} occupies bytes [{start}, {end}) of the file but the file has \
         {file_len} bytes"
    )]
    GgufTensorBeyondFile {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Absolute start (saturating).
        start: u64,
        /// Absolute end (saturating).
        end: u64,
        /// The file's length.
        file_len: u64,
    },

    /// Two tensors share bytes.
    #[error(
        "{path}: tensors {first:?} (ends at data offset {first_end}) and {second:?} (begins at \
         {second_start}) overlap"
    )]
    GgufOverlap {
        /// The file.
        path: PathBuf,
        /// The tensor that begins first.
        first: String,
        /// Where it ends (relative to the data section).
        first_end: u64,
        /// The tensor that overlaps it.
        second: String,
        /// Where that one begins.
        second_start: u64,
    },
}

impl GuardError {
    pub(crate) fn io<'a>(
        path: &'a Path,
        action: &'static str,
    ) -> impl FnOnce(std::io::Error) -> Self + 'a {
        move |source| Self::Io {
            path: path.to_path_buf(),
            action,
            source,
        }
    }
}
