//! Small crafted files claiming huge counts, lengths and shapes are refused
//! quickly and without allocating for the claim. A counting global allocator
//! measures the peak bytes live during each check.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{st_file, GgufBuilder, Kv, TensorSpec};
use weights_guard::{
    check_gguf, check_gguf_bytes, check_safetensors, check_safetensors_bytes, GuardError, Limits,
};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: defers to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Tests in this binary run one at a time so the peak is ours alone.
static SERIAL: Mutex<()> = Mutex::new(());

const MAX_PEAK: usize = 2 << 20;
const MAX_TIME: Duration = Duration::from_secs(1);

/// Runs `check`, asserting it fails within the time and allocation budget,
/// and returns the error.
fn refused_cheaply<T: std::fmt::Debug>(
    what: &str,
    check: impl FnOnce() -> Result<T, GuardError>,
) -> GuardError {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let start = Instant::now();
    let result = check();
    let elapsed = start.elapsed();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    let err = result.expect_err(what);
    assert!(
        peak < MAX_PEAK,
        "{what}: peak allocation {peak} bytes ({err})"
    );
    assert!(elapsed < MAX_TIME, "{what}: took {elapsed:?} ({err})");
    err
}

/// Limits that let every claim through to the file-size checks.
fn unlimited() -> Limits {
    Limits {
        max_safetensors_header: u64::MAX,
        max_tensors: u64::MAX,
        max_kvs: u64::MAX,
        max_string_len: u64::MAX,
        max_array_len: u64::MAX,
        max_dims: usize::MAX,
        max_metadata_bytes: u64::MAX,
    }
}

/// A GGUF header padded to 1 KiB.
fn kib(mut bytes: Vec<u8>) -> Vec<u8> {
    assert!(bytes.len() <= 1024);
    bytes.resize(1024, 0);
    bytes
}

fn empty_gguf() -> GgufBuilder {
    let mut b = GgufBuilder::valid();
    b.kvs.clear();
    b.tensors.clear();
    b
}

#[test]
fn gguf_claiming_2_pow_60_tensors() {
    let mut b = empty_gguf();
    b.tensor_count = Some(1 << 60);
    b.kv_count = Some(1 << 60);
    let bytes = kib(b.header());
    let err = refused_cheaply("default limits", || {
        check_gguf_bytes(&bytes, &Limits::default())
    });
    assert!(
        matches!(err, GuardError::GgufTooManyTensors { .. }),
        "{err}"
    );
    let err = refused_cheaply("no limits", || check_gguf_bytes(&bytes, &unlimited()));
    assert!(
        matches!(err, GuardError::GgufCountsExceedFile { .. }),
        "{err}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.gguf");
    std::fs::write(&path, &bytes).expect("write");
    let err = refused_cheaply("from disk", || check_gguf(&path, &unlimited()));
    assert!(
        matches!(err, GuardError::GgufCountsExceedFile { .. }),
        "{err}"
    );
}

#[test]
fn gguf_claiming_a_huge_string() {
    let mut b = empty_gguf();
    b.kv_count = Some(1);
    let mut bytes = b.header();
    bytes.extend((1_u64 << 62).to_le_bytes());
    let bytes = kib(bytes);
    let err = refused_cheaply("default limits", || {
        check_gguf_bytes(&bytes, &Limits::default())
    });
    assert!(matches!(err, GuardError::GgufStringTooLong { .. }), "{err}");
    let err = refused_cheaply("no limits", || check_gguf_bytes(&bytes, &unlimited()));
    assert!(matches!(err, GuardError::GgufTruncated { .. }), "{err}");
}

#[test]
fn gguf_claiming_a_huge_array() {
    for elem in [0_u32, 8, 9] {
        let mut raw = elem.to_le_bytes().to_vec();
        raw.extend((1_u64 << 61).to_le_bytes());
        let b = empty_gguf().kv("tokenizer.ggml.tokens", Kv::Raw(9, raw));
        let bytes = kib(b.header());
        let err = refused_cheaply("default limits", || {
            check_gguf_bytes(&bytes, &Limits::default())
        });
        assert!(matches!(err, GuardError::GgufArrayTooLong { .. }), "{err}");
        let err = refused_cheaply("no limits", || check_gguf_bytes(&bytes, &unlimited()));
        assert!(
            matches!(err, GuardError::GgufTruncated { .. }),
            "{elem}: {err}"
        );
    }
}

#[test]
fn gguf_claiming_a_huge_shape() {
    let mut b = empty_gguf();
    b.tensors
        .push(TensorSpec::new("big", &[1 << 31, 1 << 31, 1 << 31], 0));
    let bytes = kib(b.header());
    let err = refused_cheaply("overflowing", || check_gguf_bytes(&bytes, &unlimited()));
    assert!(matches!(err, GuardError::GgufShapeOverflow { .. }), "{err}");

    let mut b = empty_gguf();
    b.tensors
        .push(TensorSpec::new("big", &[1 << 20, 1 << 20, 1 << 10], 0));
    let bytes = kib(b.header());
    let err = refused_cheaply("4 PiB tensor", || check_gguf_bytes(&bytes, &unlimited()));
    assert!(
        matches!(err, GuardError::GgufTensorBeyondFile { .. }),
        "{err}"
    );

    // 2^32 - 1 dimensions claimed.
    let mut b = empty_gguf();
    b.tensor_count = Some(1);
    let mut bytes = b.header();
    common::write_str(&mut bytes, b"t");
    bytes.extend(u32::MAX.to_le_bytes());
    let bytes = kib(bytes);
    let err = refused_cheaply("default limits", || {
        check_gguf_bytes(&bytes, &Limits::default())
    });
    assert!(matches!(err, GuardError::GgufBadDimCount { .. }), "{err}");
    let err = refused_cheaply("no limits", || check_gguf_bytes(&bytes, &unlimited()));
    assert!(matches!(err, GuardError::GgufTruncated { .. }), "{err}");
}

#[test]
fn safetensors_claiming_a_huge_header() {
    let mut bytes = st_file("{}", 0);
    bytes[..8].copy_from_slice(&(u64::MAX - 7).to_le_bytes());
    let bytes = kib(bytes);
    let err = refused_cheaply("default limits", || {
        check_safetensors_bytes(&bytes, &Limits::default())
    });
    assert!(
        matches!(err, GuardError::SafetensorsHeaderTooLarge { .. }),
        "{err}"
    );
    let err = refused_cheaply("no limits", || {
        check_safetensors_bytes(&bytes, &unlimited())
    });
    assert!(
        matches!(err, GuardError::SafetensorsHeaderBeyondFile { .. }),
        "{err}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.safetensors");
    std::fs::write(&path, &bytes).expect("write");
    let err = refused_cheaply("from disk", || check_safetensors(&path, &unlimited()));
    assert!(
        matches!(err, GuardError::SafetensorsHeaderBeyondFile { .. }),
        "{err}"
    );
}

#[test]
fn safetensors_claiming_a_huge_tensor() {
    let header = r#"{"big":{"dtype":"F32","shape":[1099511627776,1024],"data_offsets":[0,4503599627370496]}}"#;
    let bytes = kib(st_file(header, 0));
    let err = refused_cheaply("4 PiB tensor", || {
        check_safetensors_bytes(&bytes, &Limits::default())
    });
    assert!(
        matches!(err, GuardError::SafetensorsOutOfBounds { .. }),
        "{err}"
    );

    let header = r#"{"big":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}}"#;
    let bytes = kib(st_file(header, 0));
    let err = refused_cheaply("overflowing", || {
        check_safetensors_bytes(&bytes, &Limits::default())
    });
    assert!(
        matches!(err, GuardError::SafetensorsSizeOverflow { .. }),
        "{err}"
    );
}

#[test]
fn the_counter_sees_a_large_allocation() {
    // Guards the guard: the measurement above must be able to fail.
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let big = std::hint::black_box(vec![1_u8; 8 << 20]);
    drop(big);
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    // Other threads of the test harness may free a little between reading
    // `base` and the allocation (seen: 117 bytes), hence the slack.
    assert!(peak >= (8 << 20) - (64 << 10), "peak {peak}");
}
