//! Hand-made bad GGUF files: each test starts from the valid builder, breaks
//! one thing, and expects that thing's own error variant.

mod common;

use std::io::Cursor;

use common::{GgufBuilder, Kv, TensorSpec};
use weights_guard::{
    check_gguf, check_gguf_bytes, check_gguf_reader, read_gguf, read_gguf_bytes, GgmlType,
    GgufValue, GuardError, Limits,
};

/// The checker's error; reading every value refuses the file alike.
fn refuse_with(bytes: &[u8], limits: &Limits) -> GuardError {
    let error = match check_gguf_bytes(bytes, limits) {
        Ok(summary) => panic!("accepted a broken file: {summary:?}"),
        Err(e) => e,
    };
    match read_gguf_bytes(bytes, limits) {
        Ok((summary, _)) => panic!("read a broken file: {summary:?}"),
        Err(e) => assert_eq!(e.to_string(), error.to_string()),
    }
    error
}

#[test]
fn read_gguf_keeps_every_value_as_stored() {
    let builder = GgufBuilder::valid();
    let bytes = builder.build();
    let (summary, metadata) = read_gguf_bytes(&bytes, &Limits::default()).expect("valid");
    assert_eq!(
        summary,
        check_gguf_bytes(&bytes, &Limits::default()).expect("valid")
    );
    assert_eq!(metadata.len(), builder.kvs.len());
    let s = |v: &str| GgufValue::String(v.to_owned());
    for (key, want) in [
        ("general.architecture", s("llama")),
        ("general.alignment", GgufValue::U32(32)),
        ("test.i8", GgufValue::I8(-7)),
        ("test.u16", GgufValue::U16(700)),
        ("test.i16", GgufValue::I16(-700)),
        ("test.i32", GgufValue::I32(-70_000)),
        ("test.f32", GgufValue::F32(0.5)),
        ("test.bool", GgufValue::Bool(true)),
        ("test.u64", GgufValue::U64(1 << 40)),
        ("test.i64", GgufValue::I64(-(1 << 40))),
        ("test.f64", GgufValue::F64(0.25)),
        ("test.empty_string", s("")),
        (
            "tokenizer.ggml.tokens",
            GgufValue::Array(vec![s("<s>"), s("é"), s("")]),
        ),
        (
            "tokenizer.ggml.scores",
            GgufValue::Array(vec![GgufValue::F32(0.0), GgufValue::F32(-1.0)]),
        ),
    ] {
        assert_eq!(metadata.get(key), Some(&want), "{key}");
    }
    let nested = metadata["test.nested"].as_array().expect("array");
    assert_eq!(
        nested[0],
        GgufValue::Array(vec![GgufValue::I8(1), GgufValue::I8(2)])
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, &bytes).expect("write");
    let (from_path, kept) = read_gguf(&path, &Limits::default()).expect("path");
    assert_eq!(from_path.tensors, summary.tensors);
    assert_eq!(kept, metadata);
}

#[test]
fn metadata_kept_past_the_limit_is_refused_naming_the_key() {
    let bytes = GgufBuilder::valid().build();
    let limits = Limits {
        max_metadata_bytes: 32 * 5,
        ..Limits::default()
    };
    // The checker keeps nothing, so no limit applies to it. Kept: the
    // architecture (32 + 5), the name (32 + 15), the alignment and `test.u8`
    // (32 each): 148 bytes, and `test.i8` passes 160.
    check_gguf_bytes(&bytes, &limits).expect("checked");
    let err = read_gguf_bytes(&bytes, &limits).expect_err("over the limit");
    assert!(
        matches!(err, GuardError::GgufMetadataTooLarge { ref key, limit: 160, .. } if key == "test.i8"),
        "{err}"
    );
}

fn refuse(builder: &GgufBuilder) -> GuardError {
    refuse_with(&builder.build(), &Limits::default())
}

fn with_tensor(spec: TensorSpec) -> GgufBuilder {
    let mut b = GgufBuilder::valid();
    b.tensors.push(spec);
    b
}

#[test]
fn valid_file_passes_and_lists_tensors() {
    let builder = GgufBuilder::valid();
    let bytes = builder.build();
    let summary = check_gguf_bytes(&bytes, &Limits::default()).expect("valid");
    assert_eq!(summary.version, 3);
    assert_eq!(summary.alignment, 32);
    assert_eq!(summary.architecture.as_deref(), Some("llama"));
    assert_eq!(summary.metadata_keys.len(), builder.kvs.len());
    assert_eq!(
        summary.data_offset,
        (builder.header().len() as u64).next_multiple_of(32)
    );
    let listed: Vec<(&str, GgmlType, &[u64], u64)> = summary
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t.ggml_type, t.shape.as_slice(), t.byte_len))
        .collect();
    assert_eq!(
        listed,
        [
            ("token_embd.weight", GgmlType::Q4_1, &[64, 10][..], 20 * 20),
            ("output_norm.weight", GgmlType::F32, &[64][..], 256),
            ("tiny", GgmlType::F16, &[3][..], 6),
            (
                "blk.0.attn_q.weight",
                GgmlType::Q8_0,
                &[64, 64][..],
                128 * 34
            ),
            (
                "blk.0.ffn_down.weight",
                GgmlType::Q6_K,
                &[256, 2, 1][..],
                2 * 210
            ),
            ("blk.0.attn_k.weight", GgmlType::Q4_0, &[32, 4][..], 4 * 18),
        ]
    );
    assert_eq!(
        summary.tensors.iter().map(|t| t.offset).collect::<Vec<_>>(),
        builder.offsets()
    );

    // The reader and path entry points agree.
    let from_reader = check_gguf_reader(Cursor::new(&bytes), &Limits::default()).expect("reader");
    assert_eq!(from_reader, summary);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, &bytes).expect("write");
    assert_eq!(
        check_gguf(&path, &Limits::default()).expect("path"),
        summary
    );
    let via_dispatch = weights_guard::check_model_file(&path).expect("dispatch");
    assert_eq!(via_dispatch.tensor_count(), summary.tensors.len());
}

#[test]
fn version_2_and_other_alignments_pass() {
    let mut b = GgufBuilder::valid();
    b.version = 2;
    check_gguf_bytes(&b.build(), &Limits::default()).expect("v2");

    let mut b = GgufBuilder::valid().set_kv("general.alignment", Kv::U32(64));
    b.layout_alignment = 64;
    let summary = check_gguf_bytes(&b.build(), &Limits::default()).expect("align 64");
    assert_eq!(summary.alignment, 64);
    assert_eq!(summary.data_offset % 64, 0);

    // No alignment key: the default 32; no tensors at all.
    let mut b = GgufBuilder::valid();
    b.kvs.retain(|(k, _)| k != b"general.alignment");
    b.tensors.clear();
    let summary = check_gguf_bytes(&b.build(), &Limits::default()).expect("no tensors");
    assert_eq!(summary.alignment, 32);
}

#[test]
fn bad_magic() {
    let mut b = GgufBuilder::valid();
    b.magic = *b"GGML";
    let err = refuse(&b);
    assert!(
        matches!(err, GuardError::GgufBadMagic { found, .. } if &found == b"GGML"),
        "{err}"
    );
}

#[test]
fn unsupported_version() {
    // 1 used 32-bit lengths; 0x03000000 is version 3 written big-endian.
    for version in [0, 1, 4, 0x0300_0000] {
        let mut b = GgufBuilder::valid();
        b.version = version;
        let err = refuse(&b);
        assert!(
            matches!(err, GuardError::GgufUnsupportedVersion { version: v, .. } if v == version),
            "{version}: {err}"
        );
    }
}

#[test]
fn tensor_count_beyond_the_limit() {
    let mut b = GgufBuilder::valid();
    b.tensor_count = Some(1 << 60);
    let err = refuse(&b);
    assert!(
        matches!(err, GuardError::GgufTooManyTensors { count, .. } if count == 1 << 60),
        "{err}"
    );
}

#[test]
fn kv_count_beyond_the_limit() {
    let mut b = GgufBuilder::valid();
    b.kv_count = Some(1_000_001);
    let err = refuse(&b);
    assert!(
        matches!(
            err,
            GuardError::GgufTooManyKvs {
                count: 1_000_001,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn counts_impossible_for_the_file_size() {
    let mut b = GgufBuilder::valid();
    b.tensor_count = Some(500_000);
    let err = refuse(&b);
    assert!(
        matches!(
            err,
            GuardError::GgufCountsExceedFile {
                tensor_count: 500_000,
                ..
            }
        ),
        "{err}"
    );
    let mut b = GgufBuilder::valid();
    b.kv_count = Some(900_000);
    let err = refuse(&b);
    assert!(
        matches!(
            err,
            GuardError::GgufCountsExceedFile {
                kv_count: 900_000,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn truncated_anywhere() {
    let builder = GgufBuilder::valid();
    let bytes = builder.build();
    let header_len = builder.header().len();
    for cut in 0..bytes.len() {
        let err = refuse_with(&bytes[..cut], &Limits::default());
        let ok = if cut < header_len {
            matches!(
                err,
                GuardError::GgufTruncated { .. } | GuardError::GgufCountsExceedFile { .. }
            )
        } else {
            matches!(err, GuardError::GgufTensorBeyondFile { .. })
        };
        assert!(ok, "cut at {cut}: {err}");
    }
}

#[test]
fn string_longer_than_the_limit() {
    // A key claiming 2^40 bytes.
    let mut bytes = GgufBuilder::valid().build();
    bytes[24..32].copy_from_slice(&(1_u64 << 40).to_le_bytes());
    let err = refuse_with(&bytes, &Limits::default());
    assert!(
        matches!(err, GuardError::GgufStringTooLong { len, offset: 24, what: "metadata key", .. } if len == 1 << 40),
        "{err}"
    );
    // A value over a small limit.
    let limits = Limits {
        max_string_len: 32, // longer than every key
        ..Limits::default()
    };
    let b = GgufBuilder::valid().set_kv("general.architecture", Kv::Str("a".repeat(33)));
    let err = refuse_with(&b.build(), &limits);
    assert!(
        matches!(
            err,
            GuardError::GgufStringTooLong {
                len: 33,
                limit: 32,
                what: "metadata string value",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn string_longer_than_the_file() {
    let b = GgufBuilder::valid().set_kv(
        "general.name",
        Kv::Raw(8, (100_000_u64).to_le_bytes().to_vec()),
    );
    let err = refuse(&b);
    assert!(
        matches!(
            err,
            GuardError::GgufTruncated {
                needed: 100_000,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn string_not_utf8() {
    for (key, value) in [
        ("general.name", Kv::RawStr(vec![b'a', 0xff, 0xfe])),
        ("x", Kv::Array(8, vec![Kv::RawStr(vec![0xc3])])),
    ] {
        let b = GgufBuilder::valid().set_kv(key, value);
        let err = refuse(&b);
        assert!(
            matches!(err, GuardError::GgufStringNotUtf8 { .. }),
            "{key}: {err}"
        );
    }
    let mut b = GgufBuilder::valid();
    b.kvs[0].0 = vec![b'k', 0x80];
    let err = refuse(&b);
    assert!(
        matches!(
            err,
            GuardError::GgufStringNotUtf8 {
                what: "metadata key",
                ..
            }
        ),
        "{err}"
    );
    let mut b = GgufBuilder::valid();
    b.tensors[1].name = vec![0xed, 0xa0, 0x80]; // a UTF-16 surrogate
    let err = refuse(&b);
    assert!(
        matches!(
            err,
            GuardError::GgufStringNotUtf8 {
                what: "tensor name",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn empty_key_or_tensor_name() {
    let b = GgufBuilder::valid().kv("", Kv::U8(1));
    let err = refuse(&b);
    assert!(
        matches!(
            err,
            GuardError::GgufEmptyName {
                what: "metadata key",
                ..
            }
        ),
        "{err}"
    );
    let err = refuse(&with_tensor(TensorSpec::new("", &[32], 0)));
    assert!(
        matches!(
            err,
            GuardError::GgufEmptyName {
                what: "tensor name",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn unknown_value_type() {
    let b = GgufBuilder::valid().kv("x", Kv::Raw(13, vec![0; 8]));
    let err = refuse(&b);
    assert!(
        matches!(err, GuardError::GgufUnknownValueType { ref key, value_type: 13, .. } if key == "x"),
        "{err}"
    );
    // As an array's element type.
    let b = GgufBuilder::valid().kv("y", Kv::Array(77, vec![]));
    let err = refuse(&b);
    assert!(
        matches!(err, GuardError::GgufUnknownValueType { value_type: 77, .. }),
        "{err}"
    );
}

#[test]
fn array_longer_than_the_limit() {
    let limits = Limits {
        max_array_len: 2,
        ..Limits::default()
    };
    let b = GgufBuilder::valid().kv("x", Kv::Array(0, vec![Kv::U8(1); 3]));
    let err = refuse_with(&b.build(), &limits);
    assert!(
        matches!(
            err,
            GuardError::GgufArrayTooLong {
                len: 3,
                limit: 2,
                ..
            }
        ),
        "{err}"
    );
    // Past the default limit, claimed in a small file.
    let mut raw = 4_u32.to_le_bytes().to_vec();
    raw.extend(10_000_001_u64.to_le_bytes());
    let b = GgufBuilder::valid().kv("z", Kv::Raw(9, raw));
    let err = refuse(&b);
    assert!(
        matches!(
            err,
            GuardError::GgufArrayTooLong {
                len: 10_000_001,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn array_longer_than_the_file() {
    let mut raw = 6_u32.to_le_bytes().to_vec(); // f32 elements
    raw.extend(1_000_000_u64.to_le_bytes());
    let b = GgufBuilder::valid().kv("z", Kv::Raw(9, raw));
    let err = refuse(&b);
    assert!(
        matches!(
            err,
            GuardError::GgufTruncated {
                needed: 4_000_000,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn arrays_nested_deeper_than_one_level() {
    let inner = Kv::Array(9, vec![Kv::Array(0, vec![Kv::U8(1)])]);
    let b = GgufBuilder::valid().kv("deep", Kv::Array(9, vec![inner]));
    let err = refuse(&b);
    assert!(
        matches!(err, GuardError::GgufNestedArray { ref key, .. } if key == "deep"),
        "{err}"
    );
}

#[test]
fn duplicate_metadata_key() {
    let b = GgufBuilder::valid().kv("general.name", Kv::Str("again".into()));
    let err = refuse(&b);
    assert!(
        matches!(err, GuardError::GgufDuplicateKey { ref key, .. } if key == "general.name"),
        "{err}"
    );
}

#[test]
fn alignment_of_the_wrong_type() {
    let b = GgufBuilder::valid().set_kv("general.alignment", Kv::U64(32));
    let err = refuse(&b);
    assert!(
        matches!(err, GuardError::GgufAlignmentType { value_type: 10, .. }),
        "{err}"
    );
}

#[test]
fn alignment_zero_or_not_a_power_of_two() {
    for alignment in [0, 3, 48, u32::MAX] {
        let b = GgufBuilder::valid().set_kv("general.alignment", Kv::U32(alignment));
        let err = refuse(&b);
        assert!(
            matches!(err, GuardError::GgufBadAlignment { alignment: a, .. } if a == alignment),
            "{alignment}: {err}"
        );
    }
}

#[test]
fn duplicate_tensor_name() {
    let err = refuse(&with_tensor(TensorSpec::new("tiny", &[32], 0)));
    assert!(
        matches!(err, GuardError::GgufDuplicateTensor { ref name, .. } if name == "tiny"),
        "{err}"
    );
}

#[test]
fn too_many_or_no_dims() {
    let err = refuse(&with_tensor(TensorSpec::new("t", &[1; 9], 0)));
    assert!(
        matches!(
            err,
            GuardError::GgufBadDimCount {
                n_dims: 9,
                limit: 8,
                ..
            }
        ),
        "{err}"
    );
    let err = refuse(&with_tensor(TensorSpec::new("t", &[], 0)));
    assert!(
        matches!(err, GuardError::GgufBadDimCount { n_dims: 0, .. }),
        "{err}"
    );
}

#[test]
fn zero_dim() {
    let err = refuse(&with_tensor(TensorSpec::new("t", &[32, 0], 0)));
    assert!(
        matches!(err, GuardError::GgufZeroDim { ref shape, .. } if shape == &[32, 0]),
        "{err}"
    );
}

#[test]
fn overflowing_dims() {
    // Element count past u64.
    let err = refuse(&with_tensor(TensorSpec::new(
        "t",
        &[1 << 32, 1 << 32, 2],
        0,
    )));
    assert!(matches!(err, GuardError::GgufShapeOverflow { .. }), "{err}");
    // Past ggml's int64_t.
    let err = refuse(&with_tensor(TensorSpec::new("t", &[1 << 63], 0)));
    assert!(matches!(err, GuardError::GgufShapeOverflow { .. }), "{err}");
    // Elements fit, bytes do not.
    let err = refuse(&with_tensor(TensorSpec::new("t", &[1 << 61], 0)));
    assert!(matches!(err, GuardError::GgufShapeOverflow { .. }), "{err}");
}

#[test]
fn unsupported_tensor_type() {
    // 4 and 5 were removed from ggml; 16 (IQ2_XXS) is real but not supported here.
    for ty in [4, 16, 31, 99, u32::MAX] {
        let err = refuse(&with_tensor(TensorSpec::new("t", &[256], ty)));
        assert!(
            matches!(err, GuardError::GgufUnsupportedType { ggml_type, .. } if ggml_type == ty),
            "{ty}: {err}"
        );
    }
}

#[test]
fn elements_not_a_multiple_of_the_block_size() {
    // Q4_0 blocks hold 32 weights; 48 per row is a block and a half.
    let err = refuse(&with_tensor(TensorSpec::new("t", &[48, 2], 2)));
    assert!(
        matches!(
            err,
            GuardError::GgufBlockMismatch {
                ne0: 48,
                block_size: 32,
                ggml_type: "q4_0",
                ..
            }
        ),
        "{err}"
    );
    // Q6_K super-blocks hold 256: 64 x 4 is 256 elements but rows of 64.
    let err = refuse(&with_tensor(TensorSpec::new("t", &[64, 4], 14)));
    assert!(
        matches!(
            err,
            GuardError::GgufBlockMismatch {
                block_size: 256,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn unaligned_tensor_offset() {
    let mut spec = TensorSpec::new("t", &[8], 0);
    spec.offset = Some(8);
    let err = refuse(&with_tensor(spec));
    assert!(
        matches!(
            err,
            GuardError::GgufUnalignedOffset {
                offset: 8,
                alignment: 32,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn tensor_data_beyond_the_end_of_the_file() {
    let mut spec = TensorSpec::new("far", &[8], 0);
    spec.offset = Some(1 << 40);
    let err = refuse(&with_tensor(spec));
    assert!(
        matches!(err, GuardError::GgufTensorBeyondFile { ref tensor, .. } if tensor == "far"),
        "{err}"
    );
    // Offset plus size wraps around u64.
    let mut spec = TensorSpec::new("wrap", &[64], 0);
    spec.offset = Some(u64::MAX - 31);
    let err = refuse(&with_tensor(spec));
    assert!(
        matches!(err, GuardError::GgufTensorBeyondFile { end: u64::MAX, .. }),
        "{err}"
    );
}

#[test]
fn overlapping_tensors() {
    let mut b = GgufBuilder::valid();
    b.tensors[3].offset = Some(0); // blk.0.attn_q.weight over token_embd.weight
    let err = refuse(&b);
    assert!(
        matches!(err, GuardError::GgufOverlap { ref first, ref second, .. }
            if [first.as_str(), second.as_str()].contains(&"blk.0.attn_q.weight")),
        "{err}"
    );
}
