//! Hand-made bad safetensors files: each test starts from the valid layout,
//! breaks one thing, and expects that thing's own error variant.

mod common;

use common::{st_file, st_header, st_valid, ST_TENSORS};
use weights_guard::{
    check_safetensors, check_safetensors_bytes, GuardError, Limits, SafetensorsDtype,
};

/// The error `bytes` gets with `limits`; panics (failing the test) if it passes.
fn refuse_with(bytes: &[u8], limits: &Limits) -> GuardError {
    match check_safetensors_bytes(bytes, limits) {
        Ok(summary) => panic!("accepted a broken file: {summary:?}"),
        Err(e) => e,
    }
}

fn refuse(bytes: &[u8]) -> GuardError {
    refuse_with(bytes, &Limits::default())
}

/// The error for the valid tensors with `extra` JSON members added.
fn refuse_header(json: &str, data_len: u64) -> GuardError {
    refuse(&st_file(json, data_len))
}

/// A one-tensor header whose entry body is `entry` (raw JSON).
fn one_entry(entry: &str) -> String {
    format!(r#"{{"t":{entry}}}"#)
}

#[test]
fn valid_file_passes_and_lists_tensors() {
    let summary = check_safetensors_bytes(&st_valid(), &Limits::default()).expect("valid");
    let listed: Vec<(&str, SafetensorsDtype, &[u64])> = summary
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t.dtype, t.shape.as_slice()))
        .collect();
    let expected: Vec<(&str, SafetensorsDtype, &[u64])> = ST_TENSORS
        .iter()
        .map(|(n, d, s)| (*n, SafetensorsDtype::from_name(d).expect("dtype"), *s))
        .collect();
    assert_eq!(listed, expected, "tensors in data order");
    assert_eq!(
        summary.metadata.get("format").map(String::as_str),
        Some("pt")
    );
    assert_eq!(summary.data_len, 48 + 6 + 8 + 8 + 4);
    assert_eq!(summary.tensors[0].byte_len(), 48);

    // Through a file, with trailing-space padding after the JSON (allowed by
    // the format) and no metadata.
    let (mut header, data_len) = st_header(&ST_TENSORS, "");
    header.push_str("    ");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("model.safetensors");
    std::fs::write(&path, st_file(&header, data_len)).expect("write");
    let summary = check_safetensors(&path, &Limits::default()).expect("valid file");
    assert_eq!(summary.tensors.len(), ST_TENSORS.len());
    assert!(summary.metadata.is_empty());
    let via_dispatch = weights_guard::check_model_file(&path).expect("dispatch");
    assert_eq!(via_dispatch.tensor_count(), ST_TENSORS.len());
}

#[test]
fn empty_header_object_with_no_data_passes() {
    let summary = check_safetensors_bytes(&st_file("{}", 0), &Limits::default()).expect("valid");
    assert!(summary.tensors.is_empty());
}

/// Regression: MLX's `save_safetensors` writes `"__metadata__": null` for a
/// file without metadata (the safetensors reference parser accepts it), and
/// the first version of the guard refused every such file.
#[test]
fn null_metadata_as_mlx_writes_it_is_empty_metadata() {
    let (json, data_len) = st_header(&ST_TENSORS, r#","__metadata__":null"#);
    let summary =
        check_safetensors_bytes(&st_file(&json, data_len), &Limits::default()).expect("valid");
    assert!(summary.metadata.is_empty());
    assert_eq!(summary.tensors.len(), ST_TENSORS.len());
}

#[test]
fn file_shorter_than_8_bytes() {
    for len in 0..8 {
        let err = refuse(&vec![0_u8; len]);
        assert!(
            matches!(err, GuardError::SafetensorsTooShort { len: l, .. } if l == len as u64),
            "{err}"
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("short.safetensors");
    std::fs::write(&path, [1, 2, 3]).expect("write");
    let err = check_safetensors(&path, &Limits::default()).expect_err("short");
    assert!(
        matches!(err, GuardError::SafetensorsTooShort { len: 3, .. }),
        "{err}"
    );
}

#[test]
fn header_length_beyond_the_limit() {
    let mut bytes = st_valid();
    bytes[..8].copy_from_slice(&(1_u64 << 40).to_le_bytes());
    let err = refuse(&bytes);
    assert!(
        matches!(err, GuardError::SafetensorsHeaderTooLarge { header_len, limit: 100_000_000, .. } if header_len == 1 << 40),
        "{err}"
    );
    let small = Limits {
        max_safetensors_header: 16,
        ..Limits::default()
    };
    let err = refuse_with(&st_valid(), &small);
    assert!(
        matches!(err, GuardError::SafetensorsHeaderTooLarge { limit: 16, .. }),
        "{err}"
    );
}

#[test]
fn header_length_beyond_the_file() {
    let mut bytes = st_valid();
    let claimed = bytes.len() as u64; // 8 + claimed > file length
    bytes[..8].copy_from_slice(&claimed.to_le_bytes());
    let err = refuse(&bytes);
    assert!(
        matches!(err, GuardError::SafetensorsHeaderBeyondFile { .. }),
        "{err}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("beyond.safetensors");
    std::fs::write(&path, &bytes).expect("write");
    let err = check_safetensors(&path, &Limits::default()).expect_err("beyond");
    assert!(
        matches!(err, GuardError::SafetensorsHeaderBeyondFile { .. }),
        "{err}"
    );
}

#[test]
fn header_not_utf8() {
    let mut bytes = st_file(r#"{"a":"xx"}"#, 0);
    bytes[8 + 6] = 0xff;
    let err = refuse(&bytes);
    assert!(
        matches!(
            err,
            GuardError::SafetensorsHeaderNotUtf8 { valid_up_to: 6, .. }
        ),
        "{err}"
    );
}

#[test]
fn header_not_json() {
    for json in [
        "{not json",
        r#"{"t": }"#,
        "",
        "   ",
        r#"{"t":{"dtype":"F32"}} trailing"#,
    ] {
        let err = refuse_header(json, 0);
        assert!(
            matches!(err, GuardError::SafetensorsHeaderNotJson { .. }),
            "{json:?}: {err}"
        );
    }
}

#[test]
fn deeply_nested_json_is_refused_without_overflowing_the_stack() {
    // Nested values the checks do not need are skipped iteratively, however
    // deep; the entry is then refused for what it is.
    let deep =
        |open: &str, close: &str| format!("{}1{}", open.repeat(100_000), close.repeat(100_000));
    let entry = format!(
        r#"{{"dtype":"F32","shape":{},"data_offsets":[0,0]}}"#,
        deep("[", "]")
    );
    let err = refuse_header(&one_entry(&entry), 0);
    assert!(
        matches!(err, GuardError::SafetensorsBadDim { index: 0, .. }),
        "{err}"
    );

    let entry = format!(
        r#"{{"dtype":"F32","shape":{{"a":{}}},"data_offsets":[0,0]}}"#,
        deep(r#"{"a":"#, "}")
    );
    let err = refuse_header(&one_entry(&entry), 0);
    assert!(
        matches!(err, GuardError::SafetensorsFieldType { field: "shape", .. }),
        "{err}"
    );

    let json = format!(r#"{{"__metadata__":{{"k":{}}}}}"#, deep("[", "]"));
    let err = refuse_header(&json, 0);
    assert!(
        matches!(err, GuardError::SafetensorsBadMetadata { .. }),
        "{err}"
    );

    let err = refuse_header(&one_entry(&deep("[", "]")), 0);
    assert!(
        matches!(err, GuardError::SafetensorsEntryNotObject { .. }),
        "{err}"
    );
}

#[test]
fn header_not_an_object() {
    for json in ["[1,2]", "\"str\"", "42", "null"] {
        let err = refuse_header(json, 0);
        assert!(
            matches!(err, GuardError::SafetensorsHeaderNotObject { .. }),
            "{json}: {err}"
        );
    }
}

#[test]
fn entry_not_an_object() {
    for entry in ["[]", "1", "\"F32\"", "null", "true"] {
        let err = refuse_header(&one_entry(entry), 0);
        assert!(
            matches!(err, GuardError::SafetensorsEntryNotObject { ref tensor, .. } if tensor == "t"),
            "{entry}: {err}"
        );
    }
}

#[test]
fn entry_missing_a_field() {
    let cases = [
        (r#"{"shape":[1],"data_offsets":[0,4]}"#, "dtype"),
        (r#"{"dtype":"F32","data_offsets":[0,4]}"#, "shape"),
        (r#"{"dtype":"F32","shape":[1]}"#, "data_offsets"),
    ];
    for (entry, missing) in cases {
        let err = refuse_header(&one_entry(entry), 4);
        assert!(
            matches!(err, GuardError::SafetensorsMissingField { ref tensor, field, .. } if tensor == "t" && field == missing),
            "{entry}: {err}"
        );
    }
}

#[test]
fn entry_with_an_unknown_field() {
    let entry = r#"{"dtype":"F32","shape":[1],"data_offsets":[0,4],"offset":0}"#;
    let err = refuse_header(&one_entry(entry), 4);
    assert!(
        matches!(err, GuardError::SafetensorsUnknownField { ref field, .. } if field == "offset"),
        "{err}"
    );
}

#[test]
fn entry_repeating_a_field() {
    // serde_json would keep the second dtype and accept the entry.
    let entry = r#"{"dtype":"F64","shape":[1],"data_offsets":[0,4],"dtype":"F32"}"#;
    let err = refuse_header(&one_entry(entry), 4);
    assert!(
        matches!(err, GuardError::SafetensorsDuplicateField { ref field, .. } if field == "dtype"),
        "{err}"
    );
}

#[test]
fn field_of_the_wrong_type() {
    let cases = [
        (r#"{"dtype":4,"shape":[1],"data_offsets":[0,4]}"#, "dtype"),
        (
            r#"{"dtype":"F32","shape":"1","data_offsets":[0,4]}"#,
            "shape",
        ),
        (
            r#"{"dtype":"F32","shape":{"0":1},"data_offsets":[0,4]}"#,
            "shape",
        ),
        (
            r#"{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}"#,
            "data_offsets",
        ),
        (
            r#"{"dtype":"F32","shape":[1],"data_offsets":[4]}"#,
            "data_offsets",
        ),
        (
            r#"{"dtype":"F32","shape":[1],"data_offsets":[-1,4]}"#,
            "data_offsets",
        ),
        (
            r#"{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}"#,
            "data_offsets",
        ),
        (
            r#"{"dtype":"F32","shape":[1],"data_offsets":{"begin":0}}"#,
            "data_offsets",
        ),
    ];
    for (entry, bad) in cases {
        let err = refuse_header(&one_entry(entry), 4);
        assert!(
            matches!(err, GuardError::SafetensorsFieldType { field, .. } if field == bad),
            "{entry}: {err}"
        );
    }
}

#[test]
fn unknown_dtype() {
    for dtype in ["Q4_0", "f32", "F128", ""] {
        let entry = format!(r#"{{"dtype":"{dtype}","shape":[1],"data_offsets":[0,4]}}"#);
        let err = refuse_header(&one_entry(&entry), 4);
        assert!(
            matches!(err, GuardError::SafetensorsUnknownDtype { dtype: ref d, .. } if d == dtype),
            "{dtype}: {err}"
        );
    }
}

#[test]
fn more_than_8_dims() {
    let entry = r#"{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}"#;
    let err = refuse_header(&one_entry(entry), 4);
    assert!(
        matches!(
            err,
            GuardError::SafetensorsTooManyDims {
                dims: 9,
                limit: 8,
                ..
            }
        ),
        "{err}"
    );
    // A long shape is counted, not stored.
    let long = format!(
        r#"{{"dtype":"F32","shape":[{}],"data_offsets":[0,4]}}"#,
        vec!["1"; 100_000].join(",")
    );
    let err = refuse_header(&one_entry(&long), 4);
    assert!(
        matches!(
            err,
            GuardError::SafetensorsTooManyDims { dims: 100_000, .. }
        ),
        "{err}"
    );
}

#[test]
fn negative_or_non_integer_dims() {
    for (dim, index) in [
        ("-1", 1),
        ("2.5", 0),
        ("\"3\"", 1),
        ("null", 0),
        ("[2]", 1),
        ("1e30", 0),
    ] {
        let shape = if index == 0 {
            format!("[{dim},1]")
        } else {
            format!("[1,{dim}]")
        };
        let entry = format!(r#"{{"dtype":"F32","shape":{shape},"data_offsets":[0,4]}}"#);
        let err = refuse_header(&one_entry(&entry), 4);
        assert!(
            matches!(err, GuardError::SafetensorsBadDim { index: i, .. } if i == index),
            "{shape}: {err}"
        );
    }
}

#[test]
fn shape_product_overflows() {
    let entry = r#"{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}"#;
    let err = refuse_header(&one_entry(entry), 4);
    assert!(
        matches!(err, GuardError::SafetensorsSizeOverflow { .. }),
        "{err}"
    );
    // Elements fit in 64 bits, bits do not.
    let entry = r#"{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,4]}"#;
    let err = refuse_header(&one_entry(entry), 4);
    assert!(
        matches!(err, GuardError::SafetensorsSizeOverflow { .. }),
        "{err}"
    );
}

#[test]
fn sub_byte_dtype_not_filling_whole_bytes() {
    let entry = r#"{"dtype":"F4","shape":[3],"data_offsets":[0,2]}"#;
    let err = refuse_header(&one_entry(entry), 2);
    assert!(
        matches!(err, GuardError::SafetensorsPartialByte { elements: 3, .. }),
        "{err}"
    );
}

#[test]
fn data_offsets_end_before_they_begin() {
    let entry = r#"{"dtype":"F32","shape":[1],"data_offsets":[4,0]}"#;
    let err = refuse_header(&one_entry(entry), 4);
    assert!(
        matches!(
            err,
            GuardError::SafetensorsOffsetsReversed {
                begin: 4,
                end: 0,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn byte_length_differs_from_dtype_and_shape() {
    let entry = r#"{"dtype":"F32","shape":[2],"data_offsets":[0,4]}"#;
    let err = refuse_header(&one_entry(entry), 4);
    assert!(
        matches!(
            err,
            GuardError::SafetensorsByteLenMismatch {
                expected: 8,
                actual: 4,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn offsets_beyond_the_data_section() {
    let entry = r#"{"dtype":"F32","shape":[2],"data_offsets":[4,12]}"#;
    let err = refuse_header(&one_entry(entry), 8);
    assert!(
        matches!(
            err,
            GuardError::SafetensorsOutOfBounds {
                end: 12,
                data_len: 8,
                ..
            }
        ),
        "{err}"
    );
    // Same with the data section cut from a valid file.
    let mut bytes = st_valid();
    bytes.truncate(bytes.len() - 1);
    let err = refuse(&bytes);
    assert!(
        matches!(err, GuardError::SafetensorsOutOfBounds { .. }),
        "{err}"
    );
}

#[test]
fn overlapping_tensors() {
    let json = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                   "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let err = refuse_header(json, 12);
    assert!(
        matches!(err, GuardError::SafetensorsOverlap { ref first, ref second, first_end: 8, second_begin: 4, .. }
            if first == "a" && second == "b"),
        "{err}"
    );
    // Two names for the same bytes.
    let json = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                   "b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let err = refuse_header(json, 8);
    assert!(
        matches!(err, GuardError::SafetensorsOverlap { .. }),
        "{err}"
    );
}

#[test]
fn gap_between_tensors() {
    let json = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
                   "b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#;
    let err = refuse_header(json, 12);
    assert!(
        matches!(err, GuardError::SafetensorsGap { after: Some(ref a), ref before, gap_begin: 4, gap_end: 8, .. }
            if a == "a" && before == "b"),
        "{err}"
    );
    // A gap before the first tensor.
    let entry = r#"{"dtype":"F32","shape":[1],"data_offsets":[4,8]}"#;
    let err = refuse_header(&one_entry(entry), 8);
    assert!(
        matches!(
            err,
            GuardError::SafetensorsGap {
                after: None,
                gap_begin: 0,
                gap_end: 4,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn unused_trailing_bytes() {
    let mut bytes = st_valid();
    bytes.extend([0; 5]);
    let err = refuse(&bytes);
    assert!(
        matches!(
            err,
            GuardError::SafetensorsTrailingBytes {
                covered: 74,
                data_len: 79,
                ..
            }
        ),
        "{err}"
    );
    // Data but no tensors.
    let err = refuse_header("{}", 3);
    assert!(
        matches!(
            err,
            GuardError::SafetensorsTrailingBytes {
                covered: 0,
                data_len: 3,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn duplicate_tensor_names() {
    // serde_json would keep only the second entry, and the file would pass
    // with the first tensor's bytes unaccounted for, or aliased.
    let json = r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
                   "w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
    let err = refuse_header(json, 8);
    assert!(
        matches!(err, GuardError::SafetensorsDuplicateName { ref name, .. } if name == "w"),
        "{err}"
    );
}

#[test]
fn empty_tensor_name() {
    let json = r#"{"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let err = refuse_header(json, 4);
    assert!(
        matches!(err, GuardError::SafetensorsEmptyName { .. }),
        "{err}"
    );
}

#[test]
fn metadata_not_a_string_map() {
    let cases = [
        r#""__metadata__":{"format":1}"#,
        r#""__metadata__":{"nested":{"a":"b"}}"#,
        r#""__metadata__":["format","pt"]"#,
        r#""__metadata__":"pt""#,
        r#""__metadata__":{"k":"a","k":"b"}"#,
        r#""__metadata__":{},"__metadata__":{}"#,
    ];
    for extra in cases {
        let (json, data_len) = st_header(&ST_TENSORS, &format!(",{extra}"));
        let err = refuse_header(&json, data_len);
        assert!(
            matches!(err, GuardError::SafetensorsBadMetadata { .. }),
            "{extra}: {err}"
        );
    }
}

#[test]
fn more_tensors_than_the_limit() {
    let limits = Limits {
        max_tensors: 2,
        ..Limits::default()
    };
    let err = refuse_with(&st_valid(), &limits);
    assert!(
        matches!(err, GuardError::SafetensorsTooManyTensors { limit: 2, .. }),
        "{err}"
    );
}
