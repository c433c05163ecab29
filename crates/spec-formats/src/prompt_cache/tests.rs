//! Prompt-cache files on tiny random models: a saved and reloaded cache
//! continues exactly as the caches it was saved from, and every bad file is
//! a clear error (interoperation with mlx-lm is gate `prompt-cache`'s job).

use std::collections::BTreeMap;
use std::path::Path;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use spec_core::{CacheSet, Target};
use spec_fixtures::gemma4::GATE_TEXT;
use spec_fixtures::glm::Glm;
use spec_fixtures::llama::Llama;

use super::layout::{Entry, KV_CACHE};
use super::tree::{self, Node};
use super::*;
use spec_models::{load_model, LoadOptions, LoadedModel};

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

pub(super) struct Fixture {
    pub(super) dir: tempfile::TempDir,
    pub(super) model: LoadedModel,
    pub(super) identity: ModelIdentity,
}

pub(super) fn fixture(write: impl FnOnce(&Path)) -> Fixture {
    fixture_with(write, &LoadOptions::default())
}

pub(super) fn fixture_with(write: impl FnOnce(&Path), options: &LoadOptions) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let model_dir = dir.path().join("model");
    std::fs::create_dir(&model_dir).expect("mkdir");
    write(&model_dir);
    let model = load_model(&model_dir, options).expect("load");
    let identity = ModelIdentity::new("tiny".into(), &model_dir, DtypePolicy::Float32, None)
        .expect("identity");
    Fixture {
        dir,
        model,
        identity,
    }
}

fn llama(seed: u64) -> Fixture {
    fixture(|d| Llama::tiny(seed).write(d).expect("write"))
}

/// Runs `tokens` in chunks of `chunk` (the last token alone, as a full
/// prefill does) and returns the caches.
pub(super) fn prefill(model: &dyn Target, tokens: &[u32], chunk: usize) -> CacheSet {
    let mut caches = model.make_caches();
    let (body, last) = tokens.split_at(tokens.len() - 1);
    for c in body.chunks(chunk).chain([last]) {
        model
            .forward(&ids(c), &mut caches, &[])
            .expect("forward")
            .hidden
            .eval()
            .expect("eval");
    }
    caches
}

/// Logits of every position of `tokens` run on `caches`, then of 3 more
/// single tokens (the decode path).
pub(super) fn continue_logits(
    model: &dyn Target,
    caches: &mut CacheSet,
    tokens: &[u32],
) -> Vec<f32> {
    let mut out = Vec::new();
    let mut run = |t: &[u32], caches: &mut CacheSet| {
        let h = model.forward(&ids(t), caches, &[]).expect("forward").hidden;
        let l = model.logits(&h.index((.., .., ..))).expect("logits");
        l.eval().expect("eval");
        out.extend_from_slice(l.as_slice::<f32>());
    };
    run(tokens, caches);
    for t in [5u32, 17, 3] {
        run(&[t], caches);
    }
    out
}

pub(super) fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7 + 3) % 90).collect()
}

/// Saves the caches of `prompt`, loads them back and checks that the
/// loaded caches continue bit for bit as the saved ones and as a cold run.
pub(super) fn round_trip(f: &Fixture, prompt: &[u32]) {
    let model = f.model.as_ref();
    let caches = prefill(model, prompt, 5);
    let file = f.dir.path().join("cache.safetensors");
    let meta = BTreeMap::from([("tokenizer_config".to_owned(), "{}".to_owned())]);
    save_prompt_cache(&file, &caches, prompt, &f.identity, &meta).expect("save");
    let loaded = load_prompt_cache(&file, model, &f.identity).expect("load");
    assert_eq!(loaded.tokens.as_deref(), Some(prompt));
    assert_eq!(
        loaded.metadata.get("model").map(String::as_str),
        Some("tiny")
    );
    assert_eq!(loaded.fingerprint.as_ref(), Some(&f.identity.fingerprint));
    let mut loaded = loaded.caches;
    assert_eq!(loaded.offset(), prompt.len());
    let suffix = [11u32, 12, 13];
    let got = continue_logits(model, &mut loaded, &suffix);
    let mut cold = prefill(model, prompt, 1000);
    let want = continue_logits(model, &mut cold, &suffix);
    assert_eq!(got, want, "a loaded cache continues as a cold prefill");
}

#[test]
fn llama_caches_round_trip_bit_for_bit() {
    round_trip(&llama(1), &prompt(23));
}

#[test]
fn sliding_llama_caches_round_trip_past_the_window() {
    let f = fixture(|d| {
        Llama {
            sliding_window: Some(6),
            ..Llama::tiny(2)
        }
        .write(d)
        .expect("write")
    });
    round_trip(&f, &prompt(4));
    round_trip(&f, &prompt(19));
}

/// Caches bounded to 10 positions (`--max-kv-size`: mlx-lm's
/// `RotatingKVCache` keeping 4), full layers and a sliding one: a loaded
/// file continues bit for bit before and after the window moved; an
/// unbounded model refuses the file naming the class.
#[test]
fn bounded_caches_round_trip_past_the_bound() {
    let options = LoadOptions {
        max_kv_size: Some(10),
        ..LoadOptions::default()
    };
    for sliding_window in [None, Some(6)] {
        let write = |d: &Path| {
            Llama {
                sliding_window,
                ..Llama::tiny(5)
            }
            .write(d)
            .expect("write")
        };
        let f = fixture_with(write, &options);
        round_trip(&f, &prompt(7));
        round_trip(&f, &prompt(23));
        let file = f.dir.path().join("bounded.safetensors");
        let caches = prefill(f.model.as_ref(), &prompt(23), 5);
        save_prompt_cache(&file, &caches, &prompt(23), &f.identity, &BTreeMap::new())
            .expect("save");
        let wide = fixture(write);
        let err =
            load_prompt_cache(&file, wide.model.as_ref(), &wide.identity).expect_err("unbounded");
        assert!(err.to_string().contains("RotatingKVCache"), "{err}");
    }
}

/// A llama (head dimension 32) whose keys and values are kept in `bits`
/// bits, groups of 32, from position `start`.
fn kv_llama(seed: u64, bits: i32, start: usize) -> Fixture {
    let options = LoadOptions {
        kv_quantization: Some(
            spec_runtime::cache::KvQuantization::new(bits, 32, start).expect("params"),
        ),
        ..LoadOptions::default()
    };
    let write = |d: &Path| {
        Llama {
            head_dim: Some(32),
            ..Llama::tiny(seed)
        }
        .write(d)
        .expect("write")
    };
    fixture_with(write, &options)
}

/// Quantized caches (`--kv-bits`) in mlx-lm's `QuantizedKVCache` form
/// (from the start on; before it, the float `KVCache` mlx-lm holds until it
/// converts): a loaded file continues bit for bit; a float model, or one
/// keeping another width, refuses it naming the difference.
#[test]
fn quantized_kv_caches_round_trip_and_other_widths_are_refused() {
    let f = kv_llama(4, 4, 0);
    round_trip(&f, &prompt(23));
    let late = kv_llama(4, 4, 10);
    round_trip(&late, &prompt(7));
    round_trip(&late, &prompt(23));
    let model = f.model.as_ref();
    let file = f.dir.path().join("kv4.safetensors");
    let caches = prefill(model, &prompt(9), 5);
    save_prompt_cache(&file, &caches, &prompt(9), &f.identity, &BTreeMap::new()).expect("save");
    let wider = kv_llama(4, 8, 0);
    let err = load_prompt_cache(&file, wider.model.as_ref(), &wider.identity).expect_err("8 bits");
    assert!(
        err.to_string()
            .contains("4 bits, groups of 32; the model's cache keeps 8 bits"),
        "{err}"
    );
    let float = fixture(|d| {
        Llama {
            head_dim: Some(32),
            ..Llama::tiny(4)
        }
        .write(d)
        .expect("write")
    });
    let err = load_prompt_cache(&file, float.model.as_ref(), &float.identity).expect_err("float");
    assert!(err.to_string().contains("QuantizedKVCache"), "{err}");
}

#[test]
fn gemma4_sliding_caches_round_trip_past_the_window() {
    let f = fixture(|d| GATE_TEXT.tiny(3, 4).write(d).expect("write"));
    round_trip(&f, &prompt(3));
    round_trip(&f, &prompt(17));
}

#[test]
fn glm_latent_and_indexer_caches_round_trip() {
    let f = fixture(|d| Glm::default().write(d).expect("write"));
    round_trip(&f, &prompt(21));
    let f = fixture(|d| Glm::glm52_tiny().write(d).expect("write"));
    round_trip(&f, &prompt(21));
}

/// A file as mlx-lm writes one (no fingerprint, no tokens) from `entries`.
pub(super) fn write_raw(path: &Path, entries: &[Entry]) {
    let states: Vec<Node> = entries.iter().map(|e| e.state.clone()).collect();
    let classes: Vec<&str> = entries.iter().map(|e| e.class.as_str()).collect();
    let (tensors, scalars) = tree::flatten(&states).expect("flatten");
    let user = BTreeMap::from([("model".to_owned(), "elsewhere".to_owned())]);
    let meta = tree::metadata(&user, &classes, &scalars);
    let pairs: Vec<(&str, &Array)> = tensors.iter().map(|(k, a)| (k.as_str(), a)).collect();
    Array::save_safetensors(pairs, &meta, path).expect("save");
}

/// The entries of the tiny llama's caches after `n` tokens.
fn llama_entries(f: &Fixture, n: usize) -> Vec<Entry> {
    let caches = prefill(f.model.as_ref(), &prompt(n), 4);
    layout::entries_of(&caches).expect("entries")
}

pub(super) fn load_err(f: &Fixture, file: &Path) -> PromptCacheError {
    load_prompt_cache(file, f.model.as_ref(), &f.identity).expect_err("a bad file must be refused")
}

/// Replaces item `item` of entry `entry`'s state.
fn set(entries: &mut [Entry], entry: usize, item: usize, node: Node) {
    match &mut entries[entry].state {
        Node::List(items) => items[item] = node,
        other => panic!("state {other:?}"),
    }
}

#[test]
fn a_file_without_fingerprint_loads_when_it_fits() {
    let f = llama(1);
    let file = f.dir.path().join("mlx-lm.safetensors");
    write_raw(&file, &llama_entries(&f, 9));
    let loaded = load_prompt_cache(&file, f.model.as_ref(), &f.identity).expect("load");
    assert_eq!(loaded.caches.offset(), 9);
    assert!(loaded.tokens.is_none() && loaded.fingerprint.is_none());
}

/// An adapter changes the model: its config and tensors are part of the
/// fingerprint, so one model's caches with and without it (or with
/// another adapter) never stand in for each other.
#[test]
fn an_adapter_is_part_of_the_fingerprint() {
    use spec_fixtures::adapter::LoraAdapter;
    let f = llama(1);
    let model_dir = f.dir.path().join("model");
    let adapters: Vec<_> = [1, 2]
        .iter()
        .map(|seed| {
            let d = f.dir.path().join(format!("adapter{seed}"));
            std::fs::create_dir(&d).expect("mkdir");
            LoraAdapter::lora(1, *seed)
                .write(&d, &Llama::tiny(1))
                .expect("adapter");
            d
        })
        .collect();
    let id = |adapter: Option<&Path>| {
        ModelIdentity::new("tiny".into(), &model_dir, DtypePolicy::Float32, adapter)
            .expect("identity")
            .fingerprint
    };
    let (plain, one, two) = (id(None), id(Some(&adapters[0])), id(Some(&adapters[1])));
    assert_eq!(plain, f.identity.fingerprint);
    assert!(one.starts_with(&plain) && one.contains("adapter"), "{one}");
    assert_ne!(one, two);
    assert_eq!(one, id(Some(&adapters[0])));
    let missing = ModelIdentity::new(
        "tiny".into(),
        &model_dir,
        DtypePolicy::Float32,
        Some(&f.dir.path().join("none")),
    )
    .expect_err("no adapter there");
    assert!(
        missing.to_string().contains("adapter_config.json"),
        "{missing}"
    );
}

#[test]
fn another_models_file_is_refused_naming_both() {
    let (a, b) = (llama(1), llama(2));
    let file = a.dir.path().join("a.safetensors");
    let caches = prefill(a.model.as_ref(), &prompt(6), 4);
    let other = ModelIdentity {
        name: "model-a".into(),
        ..a.identity.clone()
    };
    save_prompt_cache(&file, &caches, &prompt(6), &other, &BTreeMap::new()).expect("save");
    let err = load_err(&b, &file);
    let message = err.to_string();
    assert!(
        matches!(err, PromptCacheError::OtherModel { .. }),
        "{message}"
    );
    assert!(
        message.contains("model-a") && message.contains("`tiny`"),
        "{message}"
    );
    assert!(
        message.contains(&a.identity.fingerprint) && message.contains(&b.identity.fingerprint),
        "{message}"
    );
    assert_ne!(a.identity.fingerprint, b.identity.fingerprint);
    let early = check_model(&file, &b.identity).expect_err("the header alone tells");
    assert!(
        matches!(early, PromptCacheError::OtherModel { .. }),
        "{early}"
    );
    check_model(&file, &a.identity).expect("its own model");
}

#[test]
fn another_dtype_is_refused() {
    let f = llama(1);
    let mut entries = llama_entries(&f, 5);
    let Node::List(items) = &entries[1].state else {
        panic!("state")
    };
    let Node::Array(k) = &items[0] else {
        panic!("keys")
    };
    let half = k.as_dtype(Dtype::Float16).expect("cast");
    set(&mut entries, 1, 0, Node::Array(half.clone()));
    set(&mut entries, 1, 1, Node::Array(half));
    let file = f.dir.path().join("f16.safetensors");
    write_raw(&file, &entries);
    let err = load_err(&f, &file);
    assert!(
        matches!(err, PromptCacheError::Dtype { entry: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("Float16"), "{err}");
}

#[test]
fn another_architecture_is_refused() {
    let f = llama(1);
    let g = fixture(|d| GATE_TEXT.tiny(3, 4).write(d).expect("write"));
    let file = f.dir.path().join("gemma.safetensors");
    let caches = prefill(g.model.as_ref(), &prompt(5), 4);
    write_raw(&file, &layout::entries_of(&caches).expect("entries"));
    let err = load_err(&f, &file);
    assert!(matches!(err, PromptCacheError::Mismatch { .. }), "{err}");
}

#[test]
fn lying_offsets_are_errors() {
    let f = llama(1);
    type Change = Box<dyn Fn(&mut Vec<Entry>)>;
    let cases: [(&str, Change); 4] = [
        (
            "past the stored rows",
            Box::new(|e| set(e, 0, 2, Node::Int(100_000))),
        ),
        ("negative", Box::new(|e| set(e, 0, 2, Node::Int(-1)))),
        ("between layers", Box::new(|e| set(e, 1, 2, Node::Int(3)))),
        (
            "a layer missing",
            Box::new(|e| {
                e.pop();
            }),
        ),
    ];
    for (what, change) in cases {
        let mut entries = llama_entries(&f, 7);
        change(&mut entries);
        let file = f.dir.path().join("lie.safetensors");
        write_raw(&file, &entries);
        let err = load_err(&f, &file);
        let ok = match what {
            "a layer missing" => matches!(err, PromptCacheError::Mismatch { .. }),
            _ => matches!(err, PromptCacheError::Offsets { .. }),
        };
        assert!(ok, "{what}: {err}");
    }
}

#[test]
fn recorded_tokens_must_match_the_offset() {
    let f = llama(1);
    let caches = prefill(f.model.as_ref(), &prompt(6), 4);
    let file = f.dir.path().join("t.safetensors");
    assert!(save_prompt_cache(&file, &caches, &prompt(5), &f.identity, &BTreeMap::new()).is_err());
}

#[test]
fn recorded_tokens_that_do_not_parse_keep_the_parser_error() {
    let f = llama(1);
    let entries = llama_entries(&f, 5);
    let states: Vec<Node> = entries.iter().map(|e| e.state.clone()).collect();
    let classes: Vec<&str> = entries.iter().map(|e| e.class.as_str()).collect();
    let (tensors, scalars) = tree::flatten(&states).expect("flatten");
    let user = BTreeMap::from([
        (MODEL_KEY.to_owned(), f.identity.name.clone()),
        (TOKENS_KEY.to_owned(), "[1, 2, \"three\"]".to_owned()),
    ]);
    let file = f.dir.path().join("tokens.safetensors");
    let pairs: Vec<(&str, &Array)> = tensors.iter().map(|(k, a)| (k.as_str(), a)).collect();
    Array::save_safetensors(pairs, &tree::metadata(&user, &classes, &scalars), &file)
        .expect("save");
    match load_err(&f, &file) {
        PromptCacheError::Tokens { path, source } => {
            assert_eq!(path, file);
            assert!(source.is_data(), "{source}");
        }
        other => panic!("expected a token-list error, got {other}"),
    }
}

#[test]
fn truncated_and_corrupt_files_are_refused_by_the_guard() {
    let f = llama(1);
    let file = f.dir.path().join("ok.safetensors");
    write_raw(&file, &llama_entries(&f, 5));
    let bytes = std::fs::read(&file).expect("read");
    let bad = f.dir.path().join("bad.safetensors");
    for cut in [bytes.len() - 1, bytes.len() / 2, 12, 3] {
        std::fs::write(&bad, &bytes[..cut]).expect("write");
        let err = load_err(&f, &bad);
        assert!(
            matches!(err, PromptCacheError::Read(_)),
            "cut at {cut}: {err}"
        );
    }
    let mut corrupt = bytes.clone();
    corrupt[0] = 0xFF;
    corrupt[5] = 0x7F;
    std::fs::write(&bad, &corrupt).expect("write");
    assert!(matches!(load_err(&f, &bad), PromptCacheError::Read(_)));
    let missing = f.dir.path().join("missing.safetensors");
    assert!(matches!(load_err(&f, &missing), PromptCacheError::Read(_)));
}

#[test]
fn metadata_round_trips_in_mlx_lm_layout() {
    let user = BTreeMap::from([("model".to_owned(), "m".to_owned())]);
    let scalars = vec![("0.2".to_owned(), "scalar"), ("1.0.1".to_owned(), "string")];
    let meta = tree::metadata(&user, &[KV_CACHE, "CacheList"], &scalars);
    assert_eq!(meta.get("0.model").map(String::as_str), Some("m"));
    assert_eq!(meta.get("1.1").map(String::as_str), Some("CacheList"));
    assert_eq!(meta.get("2.0").map(String::as_str), Some(""));
    assert_eq!(meta.get("2.2.0").map(String::as_str), Some("1.0.1"));
    assert_eq!(meta.get("2.2.1").map(String::as_str), Some("string"));
    let header = tree::parse_metadata(&meta.into_iter().collect()).expect("parse");
    assert_eq!(header.classes, [KV_CACHE, "CacheList"]);
    assert_eq!(header.scalars[1], ("1.0.1".to_owned(), "string".to_owned()));
    let bad = BTreeMap::from([("9.x".to_owned(), String::new())]);
    assert!(tree::parse_metadata(&bad).is_err());
}

/// A cache type of another crate: no file form.
#[derive(Debug)]
struct Foreign;

impl spec_core::LayerCache for Foreign {
    fn offset(&self) -> usize {
        1
    }
    fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), spec_core::SpecError> {
        Ok((keys.clone(), values.clone()))
    }
    fn can_trim(&self, _: usize) -> bool {
        false
    }
    fn trim(&mut self, n: usize) -> Result<(), spec_core::SpecError> {
        Err(spec_core::SpecError::Trim {
            requested: n,
            reason: "never".into(),
        })
    }
    fn nbytes(&self) -> usize {
        0
    }
    fn contents(&self) -> Option<(Array, Array)> {
        None
    }
}

#[test]
fn caches_without_a_file_form_are_refused() {
    let f = llama(1);
    let file = f.dir.path().join("foreign.safetensors");
    let caches = CacheSet::new(vec![Box::new(Foreign)]);
    let err = save_prompt_cache(&file, &caches, &[1], &f.identity, &BTreeMap::new())
        .expect_err("no file form");
    assert!(matches!(err, PromptCacheError::Unsupported(_)), "{err}");
    assert!(err.to_string().contains("cache 0 (offset 1"), "{err}");
    assert!(!file.exists());
}

/// The file [`EncodedPromptCache::write`] writes from another thread holds
/// what MLX's own safetensors writer writes for the same caches: the same
/// tensors (names, dtypes, shapes, bytes) and the same metadata.
#[test]
fn encoded_file_written_on_another_thread_equals_mlx_writers_file() {
    let f = fixture(|d| {
        Llama {
            sliding_window: Some(6),
            ..Llama::tiny(4)
        }
        .write(d)
        .expect("write")
    });
    let tokens = prompt(11);
    let caches = prefill(f.model.as_ref(), &tokens, 4);
    let ours = f.dir.path().join("ours.safetensors");
    let meta = BTreeMap::from([("k".to_owned(), "v".to_owned())]);
    let encoded = encode_prompt_cache(&ours, &caches, &tokens, &f.identity, &meta).expect("encode");
    std::thread::spawn(move || encoded.write().expect("write"))
        .join()
        .expect("writer thread");
    assert!(!partial_path(&ours).exists(), "the partial file is renamed");

    // MLX's writer, given the same flattened tree.
    let entries = layout::entries_of(&caches).expect("entries");
    let states: Vec<_> = entries.iter().map(|e| e.state.clone()).collect();
    let classes: Vec<&str> = entries.iter().map(|e| e.class.as_str()).collect();
    let (tensors, scalars) = tree::flatten(&states).expect("flatten");
    let mut user = meta.clone();
    user.insert(MODEL_KEY.into(), f.identity.name.clone());
    user.insert(FINGERPRINT_KEY.into(), f.identity.fingerprint.clone());
    user.insert(
        TOKENS_KEY.into(),
        serde_json::to_string(&tokens).expect("json"),
    );
    let theirs = f.dir.path().join("mlx.safetensors");
    let pairs: Vec<(&str, &Array)> = tensors.iter().map(|(k, a)| (k.as_str(), a)).collect();
    Array::save_safetensors(pairs, &tree::metadata(&user, &classes, &scalars), &theirs)
        .expect("mlx save");

    assert_eq!(
        file_metadata(&ours).expect("ours"),
        file_metadata(&theirs).expect("theirs")
    );
    let a = Array::load_safetensors(&ours).expect("load ours");
    let b = Array::load_safetensors(&theirs).expect("load theirs");
    let mut names: Vec<_> = a.keys().collect();
    names.sort();
    let mut their_names: Vec<_> = b.keys().collect();
    their_names.sort();
    assert_eq!(names, their_names);
    assert!(!names.is_empty());
    for name in names {
        let (x, y) = (&a[name], &b[name]);
        assert_eq!((x.dtype(), x.shape()), (y.dtype(), y.shape()), "{name}");
        let bits = |t: &Array| -> Vec<u8> {
            let view = safetensors::tensor::TensorView::try_from(t).expect("view");
            view.data().to_vec()
        };
        assert_eq!(bits(x), bits(y), "{name}");
    }
    // And it loads as a prompt cache holding the same rows.
    let loaded = load_prompt_cache(&ours, f.model.as_ref(), &f.identity).expect("load");
    assert_eq!(loaded.tokens.as_deref(), Some(&tokens[..]));
}
