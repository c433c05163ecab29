//! The Gemma-4 target on tiny random checkpoints (both the plain
//! `gemma4_text`, the `gemma4` wrapper with KV-shared layers, per-layer
//! inputs and k_eq_v, and a mixture-of-experts model): incremental decoding against one-shot forwards past
//! the sliding window, exact rollback past the window, speculative greedy
//! output equal to plain output, donor views and taps.

use std::ops::ControlFlow;

use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use mlx_spec_scenarios::{write_tiny_gemma4, Gemma4Variant};
use serve_loop::{AdaptiveConfig, Output, ProviderChoice, Request, SpecConfig, VerifyMode};
use spec_core::{
    CommitInfo, Draft, DraftProvider, DraftRequest, DraftSource, PrefillMode, Sampler, SpecError,
    Target,
};
use spec_models::gemma4::{donor_views, LayerKind, Model as Gemma4, RopeSpec};
use spec_models::{load_model, LoadOptions, LoadedModel};

const WINDOW: usize = 6;
const VARIANTS: [Gemma4Variant; 3] = [
    Gemma4Variant::Text,
    Gemma4Variant::Shared,
    Gemma4Variant::Moe,
];

fn model(variant: Gemma4Variant) -> (tempfile::TempDir, LoadedModel) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_tiny_gemma4(dir.path(), 5, variant, WINDOW).expect("write model");
    let model = load_model(dir.path(), &LoadOptions::default()).expect("load");
    (dir, model)
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

/// Deterministic tokens of the tiny vocabulary (96).
fn tokens(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(37).wrapping_add(seed * 11) ^ (i / 3)) % 96)
        .collect()
}

fn values(a: &Array) -> Vec<f32> {
    a.flatten(None, None)
        .expect("flatten")
        .as_slice::<f32>()
        .to_vec()
}

fn max_diff(a: &Array, b: &Array) -> f32 {
    assert_eq!(a.shape(), b.shape());
    values(a)
        .iter()
        .zip(values(b))
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Logits `[L, vocab]` of running `chunks` one after another through fresh caches.
fn chunked_logits(model: &dyn Target, all: &[u32], chunks: &[usize]) -> Array {
    let mut caches = model.make_caches();
    let mut rows = Vec::new();
    let mut at = 0;
    for &n in chunks {
        let out = model
            .forward(&ids(&all[at..at + n]), &mut caches, &[])
            .expect("forward");
        rows.push(
            model
                .logits(&out.hidden)
                .expect("logits")
                .index((0, .., ..)),
        );
        at += n;
    }
    assert_eq!(at, all.len());
    assert_eq!(caches.offset(), all.len());
    concatenate(&rows, 0).expect("concatenate")
}

#[test]
fn incremental_decoding_matches_one_shot_forward_past_the_window() {
    for variant in VARIANTS {
        let (_d, model) = model(variant);
        let all = tokens(24, 1);
        let one_shot = chunked_logits(&model, &all, &[24]);
        for chunks in [
            vec![1; 24],
            vec![3, 1, 1, 4, 1, 9, 1, 2, 2],
            vec![7, 1, 1, 1, 1, 1, 1, 11],
        ] {
            let d = max_diff(&one_shot, &chunked_logits(&model, &all, &chunks));
            assert!(d < 1e-3, "{variant:?} {chunks:?}: logits differ by {d}");
        }
    }
}

#[test]
fn rollback_past_the_window_equals_never_having_seen_the_rejected_tokens() {
    for variant in VARIANTS {
        let (_d, model) = model(variant);
        let mut caches = model.make_caches();
        let mut kept = tokens(10, 2);
        model
            .forward(&ids(&kept), &mut caches, &[])
            .expect("prefill");
        // Verify windows of 1 + 3 tokens, keeping 1..=4 of them: the
        // dropped ones are junk a correct rollback must forget.
        for round in 0..12u32 {
            let window = tokens(4, 100 + round);
            let keep = 1 + (round as usize * 7) % 4;
            assert!(
                caches.can_trim_after(4, 3),
                "{variant:?}: a round must stay rollback-able past the window"
            );
            model
                .forward(&ids(&window), &mut caches, &[])
                .expect("verify");
            caches.trim(4 - keep).expect("rollback past the window");
            kept.extend_from_slice(&window[..keep]);
            assert_eq!(caches.offset(), kept.len());
        }
        // Single-token steps right after a rollback take the ring path.
        let probe = [5u32, 9];
        let rows: Vec<Array> = probe
            .iter()
            .map(|t| {
                let out = model.forward(&ids(&[*t]), &mut caches, &[]).expect("probe");
                model.logits(&out.hidden).expect("logits")
            })
            .collect();
        let rolled = concatenate(&rows, 1).expect("concatenate");
        kept.extend_from_slice(&probe);
        let fresh = chunked_logits(&model, &kept, &[kept.len()]);
        let n = fresh.shape()[0];
        let d = max_diff(&rolled.index((0, .., ..)), &fresh.index((n - 2.., ..)));
        assert!(d < 1e-3, "{variant:?}: after rollbacks the logits differ by {d} from a run without the rejected tokens");
    }
}

/// Drafts the plain continuation with every third token corrupted, so
/// rounds end in rejections and rollbacks.
#[derive(Clone)]
struct Scripted {
    reference: Vec<u32>,
    prompt_len: usize,
}

struct ScriptedSource(Scripted);

impl DraftSource for ScriptedSource {
    fn prefill_mode(&self) -> PrefillMode {
        PrefillMode::TailSplit
    }
    fn prefill(&mut self, _prompt: &[u32], _taps: Option<&Array>) -> Result<(), SpecError> {
        Ok(())
    }
    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        _sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        let done = request.history.len() - self.0.prompt_len;
        let tokens = self
            .0
            .reference
            .iter()
            .enumerate()
            .skip(done)
            .take(request.max_tokens)
            .map(|(i, &t)| if i % 3 == 2 { (t + 1) % 96 } else { t })
            .collect();
        Ok(Draft {
            tokens,
            probs: None,
        })
    }
    fn commit(&mut self, _info: CommitInfo<'_>) -> Result<(), SpecError> {
        Ok(())
    }
}

impl DraftProvider for Scripted {
    fn id(&self) -> &str {
        "scripted"
    }
    fn open<'a>(&self, _target: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(ScriptedSource(self.clone())))
    }
}

fn generate(
    target: &dyn Target,
    prompt: &[u32],
    max_tokens: usize,
    provider: Option<&dyn DraftProvider>,
) -> Output {
    let config = SpecConfig {
        num_draft: 3,
        verify: VerifyMode::ExactMatch,
        adaptive: AdaptiveConfig::off(),
        seed: 0,
    };
    let request = Request {
        speculation: provider.map(|provider| ProviderChoice::new(provider.id(), config)),
        ..Request::new(prompt.to_vec(), max_tokens)
    };
    let providers = provider.as_slice();
    serve_loop::generate(target, providers, request, |_| ControlFlow::Continue(()))
        .expect("generate")
}

#[test]
fn speculative_greedy_output_equals_plain_output_past_the_window() {
    for variant in VARIANTS {
        let (_d, model) = model(variant);
        let prompt = tokens(3 * WINDOW, 3);
        let plain = generate(&model, &prompt, 40, None).tokens;
        let scripted = Scripted {
            reference: plain.clone(),
            prompt_len: prompt.len(),
        };
        let spec = generate(&model, &prompt, 40, Some(&scripted));
        assert_eq!(spec.tokens, plain, "{variant:?}");
        let s = &spec.stats;
        assert!(
            !s.untrimmable_fallback,
            "{variant:?}: speculation must continue past the window: {s:?}"
        );
        assert!(
            s.accepted > 0 && s.rejected > 0 && s.target_calls < 40,
            "{variant:?}: {s:?}"
        );
    }
}

#[test]
fn donor_views_are_time_ordered_and_outlive_later_updates() {
    for variant in VARIANTS {
        let (_d, model) = model(variant);
        let gemma = model
            .as_any()
            .downcast_ref::<Gemma4>()
            .expect("a gemma4 model");
        let (sliding, full) = gemma.donor_layers();
        let expected = match variant {
            Gemma4Variant::Text => (Some(3), Some(2)),
            Gemma4Variant::Shared => (Some(2), Some(1)),
            Gemma4Variant::Moe => (Some(2), Some(1)),
        };
        assert_eq!(
            (sliding, full),
            expected,
            "{variant:?}: the last non-shared layer of each kind"
        );
        let all = tokens(20, 4);
        let mut once = model.make_caches();
        model.forward(&ids(&all), &mut once, &[]).expect("prefill");
        let mut stepwise = model.make_caches();
        for t in &all {
            model
                .forward(&ids(&[*t]), &mut stepwise, &[])
                .expect("step");
        }
        let a = donor_views(gemma, &once).expect("views");
        let b = donor_views(gemma, &stepwise).expect("views");
        let (sa, sb) = (
            a.sliding.expect("sliding view"),
            b.sliding.expect("sliding view"),
        );
        let (fa, fb) = (a.full.expect("full view"), b.full.expect("full view"));
        assert_eq!(
            (sa.offset, sb.offset, fa.offset, fb.offset),
            (20, 20, 20, 20)
        );
        assert_eq!(
            sb.keys.shape()[2],
            WINDOW as i32,
            "the ring holds the window"
        );
        assert_eq!(sa.keys.shape()[2], 20, "a one-shot prefill keeps every key");
        assert_eq!(fa.keys.shape()[2], 20);
        // The ring, unrolled, holds the last positions in time order.
        let tail = |a: &Array| a.index((.., .., 20 - WINDOW as i32.., ..));
        assert!(
            max_diff(&tail(&sa.keys), &sb.keys) < 1e-4
                && max_diff(&tail(&sa.values), &sb.values) < 1e-4,
            "{variant:?}"
        );
        assert!(
            max_diff(&fa.keys, &fb.keys) < 1e-4 && max_diff(&fa.values, &fb.values) < 1e-4,
            "{variant:?}"
        );
        // A view read before more decoding is unchanged by it.
        let before = values(&sb.keys);
        for t in tokens(5, 6) {
            model.forward(&ids(&[t]), &mut stepwise, &[]).expect("step");
        }
        assert_eq!(values(&sb.keys), before, "{variant:?}: views are snapshots");
        let later = donor_views(gemma, &stepwise)
            .expect("views")
            .sliding
            .expect("sliding");
        assert_eq!(later.offset, 25);
        assert_ne!(values(&later.keys), before);
    }
}

#[test]
fn taps_are_layer_outputs_of_the_same_pass_in_the_requested_order() {
    for variant in VARIANTS {
        let (_d, model) = model(variant);
        let all = tokens(9, 7);
        let run = |taps: &[usize]| {
            let mut caches = model.make_caches();
            model
                .forward(&ids(&all), &mut caches, taps)
                .expect("forward")
        };
        let plain = run(&[]);
        assert!(plain.taps.is_none());
        let both = run(&[2, 0]);
        let (t3, t0) = (run(&[2]).taps.expect("tap"), run(&[0]).taps.expect("tap"));
        let taps = both.taps.expect("taps");
        assert_eq!(taps.shape(), &[1, 9, 128]);
        assert_eq!(
            values(&taps.index((.., .., ..64))),
            values(&t3),
            "{variant:?}"
        );
        assert_eq!(
            values(&taps.index((.., .., 64..))),
            values(&t0),
            "{variant:?}"
        );
        assert_ne!(values(&t3), values(&t0));
        assert_eq!(
            values(&both.hidden),
            values(&plain.hidden),
            "taps do not change the forward"
        );
        let mut caches = model.make_caches();
        assert!(
            model.forward(&ids(&all), &mut caches, &[9]).is_err(),
            "a tap past the last layer is an error"
        );
        assert!(
            model.forward(&ids(&[]), &mut caches, &[]).is_err(),
            "an empty window is an error"
        );
        assert_eq!(caches.offset(), 0, "failed forwards leave the caches alone");
    }
}

#[test]
fn broken_gemma4_checkpoints_are_typed_errors_naming_the_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_tiny_gemma4(dir.path(), 5, Gemma4Variant::Shared, WINDOW).expect("write model");
    let path = dir.path().join("config.json");
    let original: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
    let with = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut c = original.clone();
        edit(&mut c);
        std::fs::write(&path, c.to_string()).expect("write");
        load_model(dir.path(), &LoadOptions::default())
            .map(|_| ())
            .expect_err("must fail")
            .to_string()
    };
    // One shared layer fewer: layer 3 now owns a cache, and its MLP in the
    // file is the double-wide one of a shared layer.
    let err = with(&|c| c["text_config"]["num_kv_shared_layers"] = 1.into());
    assert!(err.contains("layers.3.mlp.gate_proj"), "{err}");
    let err = with(&|c| c["text_config"]["enable_moe_block"] = true.into());
    assert!(
        err.contains("enable_moe_block needs a positive num_experts"),
        "{err}"
    );
    let err = with(&|c| c["text_config"]["hidden_size_per_layer_input"] = 0.into());
    assert!(
        err.contains("unexpected tensors") && err.contains("per_layer"),
        "{err}"
    );
}

#[test]
fn quantized_experts_run_through_gather_qmm_like_their_dequantized_weights() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_tiny_gemma4(dir.path(), 5, Gemma4Variant::Moe, WINDOW).expect("write model");
    let float = load_model(dir.path(), &LoadOptions::default()).expect("load float");
    // Rewrite the checkpoint in mlx-lm's saved layout with 4-bit experts
    // and 8-bit routers (what `quantize_model` gives a gemma4 MoE).
    let mut tensors = Array::load_safetensors(dir.path().join("model.safetensors")).expect("read");
    let qdir = tempfile::tempdir().expect("tempdir");
    let quantize = |tensors: &mut std::collections::HashMap<String, Array>,
                    module: &str,
                    w: Array,
                    group: i32,
                    bits: i32| {
        let (q, scales, biases) = mlx_rs::ops::quantize(&w, group, bits).expect("quantize");
        tensors.insert(format!("{module}.weight"), q);
        tensors.insert(format!("{module}.scales"), scales);
        tensors.insert(format!("{module}.biases"), biases);
    };
    let mut overrides = serde_json::Map::new();
    for i in 0..3 {
        let p = format!("model.layers.{i}");
        let fused = tensors
            .remove(&format!("{p}.experts.gate_up_proj"))
            .expect("fused experts");
        let down = tensors
            .remove(&format!("{p}.experts.down_proj"))
            .expect("down experts");
        quantize(
            &mut tensors,
            &format!("{p}.experts.switch_glu.gate_proj"),
            fused.index((.., ..32, ..)),
            32,
            4,
        );
        quantize(
            &mut tensors,
            &format!("{p}.experts.switch_glu.up_proj"),
            fused.index((.., 32.., ..)),
            32,
            4,
        );
        quantize(
            &mut tensors,
            &format!("{p}.experts.switch_glu.down_proj"),
            down,
            32,
            4,
        );
        let router = tensors
            .remove(&format!("{p}.router.proj.weight"))
            .expect("router");
        quantize(&mut tensors, &format!("{p}.router.proj"), router, 64, 8);
        overrides.insert(
            format!("{p}.router.proj"),
            serde_json::json!({"group_size": 64, "bits": 8}),
        );
    }
    Array::save_safetensors(&tensors, None, qdir.path().join("model.safetensors")).expect("write");
    let text = std::fs::read_to_string(dir.path().join("config.json")).expect("read");
    let mut config: serde_json::Value = serde_json::from_str(&text).expect("json");
    let mut block = serde_json::json!({"group_size": 32, "bits": 4, "mode": "affine"});
    block.as_object_mut().expect("object").extend(overrides);
    config["quantization"] = block;
    std::fs::write(qdir.path().join("config.json"), config.to_string()).expect("write");

    let keep = load_model(
        qdir.path(),
        &LoadOptions {
            dtype: spec_models::DtypePolicy::Keep,
            ..LoadOptions::default()
        },
    )
    .expect("load quantized");
    let dequantized = load_model(qdir.path(), &LoadOptions::default()).expect("load dequantized");
    // 70 tokens: the one-shot pass sorts its 140 expert picks, the steps do not.
    let all = tokens(70, 8);
    let chunks: Vec<usize> = std::iter::once(66).chain([1; 4]).collect();
    let (q, d, f) = (
        chunked_logits(&keep, &all, &chunks),
        chunked_logits(&dequantized, &all, &chunks),
        chunked_logits(&float, &all, &chunks),
    );
    let (same_weights, quantization_error) = (max_diff(&q, &d), max_diff(&q, &f));
    assert!(
        same_weights < 1e-3,
        "gather_qmm vs gather_mm over the same dequantized weights: {same_weights}"
    );
    assert!(
        quantization_error > 10.0 * same_weights.max(1e-6),
        "the quantized weights must matter: {quantization_error} vs {same_weights}"
    );
}

#[test]
fn full_layers_rotate_only_their_proportional_share_of_dimensions() {
    let (_d, model) = model(Gemma4Variant::Text);
    let gemma = model
        .as_any()
        .downcast_ref::<Gemma4>()
        .expect("a gemma4 model");
    let RopeSpec::Proportional { rotated, .. } = gemma.config().rope_full else {
        panic!("full layers use proportional RoPE")
    };
    assert_eq!(rotated, 8, "a quarter of the 32-wide full heads");
    let x = mlx_rs::random::normal::<f32>(
        &[1, 1, 1, 32],
        None,
        None,
        &mlx_rs::random::key(3).expect("key"),
    )
    .expect("normal");
    let before = values(&x);
    let after = values(&gemma.rope(LayerKind::Full).apply(&x, 5).expect("rope"));
    // Halves layout: dimension i pairs with i + 16; pairs 4..16 stay put.
    let moved: Vec<usize> = (0..32)
        .filter(|&i| (before[i] - after[i]).abs() > 1e-6)
        .collect();
    assert_eq!(moved, [0, 1, 2, 3, 16, 17, 18, 19]);
    let x16 = x.index((.., .., .., ..16));
    let sliding = values(&gemma.rope(LayerKind::Sliding).apply(&x16, 5).expect("rope"));
    assert!(
        sliding
            .iter()
            .zip(&before[..16])
            .all(|(a, b)| (a - b).abs() > 1e-7),
        "sliding layers rotate every dimension"
    );
}
