//! A bounded, fixed-seed fuzz run on stable Rust: valid files are mutated
//! (bit flips, interesting bytes and length values, truncation, deleted and
//! duplicated ranges) a few thousand times; the checkers must never panic,
//! must return quickly, and whatever they accept must be self-consistent.
//! The coverage-guided targets live in `fuzz/` (cargo-fuzz, nightly).

mod common;

use std::collections::BTreeMap;
use std::io::Cursor;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use common::{st_valid, GgufBuilder};
use weights_guard::{
    check_gguf_bytes, check_gguf_reader, check_safetensors_bytes, GuardError, Limits,
};

const ITERATIONS: usize = 10_000;
const MAX_CALL: Duration = Duration::from_secs(2);

/// splitmix64: small, fixed-seed, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

const BYTES: [u8; 14] = [
    0, 1, 2, 8, 9, 0x7f, 0x80, 0xff, b'{', b'[', b'"', b'-', b'9', b',',
];
const U32S: [u32; 12] = [
    0,
    1,
    3,
    8,
    9,
    12,
    13,
    30,
    31,
    1 << 31,
    u32::MAX,
    0x0300_0000,
];

fn interesting_u64(rng: &mut Rng, len: usize) -> u64 {
    let len = len as u64;
    let values = [
        0,
        1,
        7,
        8,
        32,
        len,
        len.wrapping_sub(8),
        len + 1,
        1 << 32,
        1 << 60,
        u64::MAX,
        u64::MAX - 7,
        i64::MAX as u64,
    ];
    if rng.below(4) == 0 {
        rng.next()
    } else {
        rng.pick(&values)
    }
}

/// One to four random mutations of `base`.
fn mutate(rng: &mut Rng, base: &[u8]) -> Vec<u8> {
    let mut data = base.to_vec();
    for _ in 0..1 + rng.below(4) {
        if data.is_empty() {
            data.push(rng.next() as u8);
        }
        let len = data.len();
        let at = rng.below(len);
        match rng.below(8) {
            0 => data[at] ^= 1 << rng.below(8),
            1 => data[at] = rng.pick(&BYTES),
            2 if len >= 8 => {
                let at = rng.below(len - 7);
                let value = interesting_u64(rng, len);
                data[at..at + 8].copy_from_slice(&value.to_le_bytes());
            }
            3 if len >= 4 => {
                let at = rng.below(len - 3);
                data[at..at + 4].copy_from_slice(&rng.pick(&U32S).to_le_bytes());
            }
            4 => data.truncate(rng.below(len + 1)),
            5 => {
                let end = (at + 1 + rng.below(64)).min(len);
                data.drain(at..end);
            }
            6 => {
                let end = (at + 1 + rng.below(64)).min(len);
                let chunk = data[at..end].to_vec();
                let to = rng.below(len + 1);
                data.splice(to..to, chunk);
            }
            // The leading length/count fields, where claims matter most.
            _ if len >= 24 => {
                let at = rng.pick(&[0, 8, 16]);
                let value = interesting_u64(rng, len);
                data[at..at + 8].copy_from_slice(&value.to_le_bytes());
            }
            _ => data[at] = !data[at],
        }
    }
    data
}

/// The variant name of an error, for the coverage tally.
fn variant(err: &GuardError) -> String {
    let debug = format!("{err:?}");
    debug
        .split([' ', '{', '('])
        .next()
        .unwrap_or_default()
        .to_owned()
}

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .take(4096)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Runs `check` on `ITERATIONS` mutations of `base`; returns the tally of
/// outcomes by variant ("Ok" for accepted inputs).
fn run(
    seed: u64,
    base: &[u8],
    check: impl Fn(&[u8]) -> Result<(), GuardError>,
) -> BTreeMap<String, usize> {
    let mut rng = Rng(seed);
    let mut tally = BTreeMap::new();
    check(base).expect("the unmutated file is valid");
    for i in 0..ITERATIONS {
        let input = mutate(&mut rng, base);
        let start = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| check(&input)));
        let elapsed = start.elapsed();
        let Ok(result) = outcome else {
            panic!(
                "iteration {i} (seed {seed}) panicked on input {}",
                hex(&input)
            );
        };
        assert!(
            elapsed < MAX_CALL,
            "iteration {i} took {elapsed:?} on {}",
            hex(&input)
        );
        let key = match &result {
            Ok(()) => "Ok".to_owned(),
            Err(e) => variant(e),
        };
        *tally.entry(key).or_default() += 1;
    }
    tally
}

#[test]
fn safetensors_mutations_never_panic() {
    let tally = run(0x5afe_7e45, &st_valid(), |input| {
        let summary = check_safetensors_bytes(input, &Limits::default())?;
        // Accepted files tile their data section exactly.
        let covered: u64 = summary.tensors.iter().map(|t| t.byte_len()).sum();
        assert_eq!(covered, summary.data_len);
        assert_eq!(
            8 + summary.header_len + summary.data_len,
            input.len() as u64
        );
        Ok(())
    });
    eprintln!("safetensors outcomes: {tally:?}");
    assert!(
        tally.len() >= 10,
        "mutations reach too few checks: {tally:?}"
    );
}

#[test]
fn gguf_mutations_never_panic() {
    let tally = run(0x6767_7566, &GgufBuilder::valid().build(), |input| {
        let summary = check_gguf_bytes(input, &Limits::default())?;
        let from_reader = check_gguf_reader(Cursor::new(input), &Limits::default())?;
        assert_eq!(from_reader, summary);
        // Reading every value accepts the same files, with the same summary.
        let (read, metadata) = weights_guard::read_gguf_bytes(input, &Limits::default())
            .expect("read_gguf refuses a file check_gguf accepts");
        assert_eq!(read, summary);
        assert_eq!(metadata.len(), summary.metadata_keys.len());
        // Accepted files hold every tensor inside the file.
        for t in &summary.tensors {
            assert!(summary.data_offset + t.offset + t.byte_len <= input.len() as u64);
        }
        Ok(())
    });
    eprintln!("gguf outcomes: {tally:?}");
    assert!(
        tally.len() >= 10,
        "mutations reach too few checks: {tally:?}"
    );
}

/// Writes the valid files as seeds for the cargo-fuzz targets:
/// `cargo test -p weights-guard --test smoke_fuzz -- --ignored write_fuzz_seeds`.
#[test]
#[ignore = "writes into the source tree; run by hand to refresh fuzz/seeds"]
fn write_fuzz_seeds() {
    let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    for (target, name, bytes) in [
        ("safetensors_header", "valid.safetensors", st_valid()),
        ("gguf_header", "valid.gguf", GgufBuilder::valid().build()),
    ] {
        let dir = seeds.join(target);
        std::fs::create_dir_all(&dir).expect("create seeds dir");
        std::fs::write(dir.join(name), bytes).expect("write seed");
    }
}
