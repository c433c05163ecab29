//! How large a header the checkers accept before refusing a file.

/// Bounds on what a header may claim. Every count read from a file is checked
/// against these and against the bytes left in the file before anything is
/// allocated for it, so raising a limit never lets a small file claim a large
/// allocation.
///
/// ```
/// let limits = weights_guard::Limits { max_dims: 4, ..Default::default() };
/// assert_eq!(limits.max_tensors, 1_000_000);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest safetensors JSON header, in bytes (default 100 MB, the bound the
    /// `safetensors` crate itself uses).
    pub max_safetensors_header: u64,
    /// Most tensors in one file, either format (default 1,000,000).
    pub max_tensors: u64,
    /// Most GGUF metadata entries (default 1,000,000).
    pub max_kvs: u64,
    /// Longest GGUF string (key, value, array element or tensor name), in bytes
    /// (default 1 MiB).
    pub max_string_len: u64,
    /// Longest GGUF metadata array, in elements (default 10,000,000).
    pub max_array_len: u64,
    /// Most dimensions of one tensor, either format (default 8).
    pub max_dims: usize,
    /// Most memory GGUF metadata kept by `read_gguf` may take, in bytes:
    /// 32 per value plus each string's length (default 512 MiB; a
    /// 256k-token vocabulary with its merges takes about 25 MB).
    pub max_metadata_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_safetensors_header: 100_000_000,
            max_tensors: 1_000_000,
            max_kvs: 1_000_000,
            max_string_len: 1 << 20,
            max_array_len: 10_000_000,
            max_dims: 8,
            max_metadata_bytes: 512 << 20,
        }
    }
}
