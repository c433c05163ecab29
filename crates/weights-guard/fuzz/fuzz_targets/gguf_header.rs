//! Any bytes as a whole GGUF file: the checker never panics, the slice and
//! reader entry points agree, `read_gguf` accepts exactly what it accepts,
//! and what it accepts keeps every tensor inside the file.
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use weights_guard::{check_gguf_bytes, check_gguf_reader, read_gguf_bytes, Limits};

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let from_slice = check_gguf_bytes(data, &limits);
    let from_reader = check_gguf_reader(Cursor::new(data), &limits);
    let read = read_gguf_bytes(data, &limits);
    match (from_slice, from_reader) {
        (Ok(summary), Ok(again)) => {
            assert_eq!(summary, again);
            match read {
                Ok((kept, _)) => assert_eq!(kept, summary),
                Err(e) => panic!("read_gguf refuses what check_gguf accepts: {e}"),
            }
            for t in &summary.tensors {
                assert!(summary.data_offset + t.offset + t.byte_len <= data.len() as u64);
                assert_eq!(t.offset % u64::from(summary.alignment), 0);
            }
        }
        (Err(_), Err(_)) => assert!(read.is_err(), "read_gguf accepts a refused file"),
        (a, b) => panic!("slice and reader disagree: {a:?} vs {b:?}"),
    }
});
