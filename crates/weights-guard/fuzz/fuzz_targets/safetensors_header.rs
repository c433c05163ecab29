//! Any bytes as a whole safetensors file: the checker never panics, and what
//! it accepts tiles its data section exactly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weights_guard::{check_safetensors_bytes, Limits};

fuzz_target!(|data: &[u8]| {
    if let Ok(summary) = check_safetensors_bytes(data, &Limits::default()) {
        let covered: u64 = summary.tensors.iter().map(|t| t.byte_len()).sum();
        assert_eq!(covered, summary.data_len);
        assert_eq!(8 + summary.header_len + summary.data_len, data.len() as u64);
    }
});
