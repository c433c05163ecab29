//! Streamed experts against resident ones, bit for bit, in every layout
//! and form; the tier's counters and budget; bad shards.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use mlx_ext::quant::{Packed, QuantMode, QuantParams};
use mlx_rs::{Array, Dtype};

use super::{ExpertStore, TIER_OPTION};
use crate::config::Quantization;
use crate::layers::Activation;
use crate::switch_glu::SwitchGlu;
use crate::weights::testing::random;
use crate::weights::Weights;
use crate::{DtypePolicy, ModelError};

const EXPERTS: i32 = 6;
const HIDDEN: i32 = 64;
const WIDTH: i32 = 32;

/// How the checkpoint stores the experts.
#[derive(Debug, Clone, Copy)]
enum Layout {
    Stacked(Option<QuantParams>, Dtype),
    PerExpert,
    Fused,
}

/// Writes one layer's experts under `mlp.` in `layout` into `dir`; returns
/// the quantization block that describes them.
fn write(dir: &Path, layout: Layout) -> Quantization {
    let mut t: HashMap<String, Array> = HashMap::new();
    let proj = |seed: u64, out: i32, inp: i32| random(&[EXPERTS, out, inp], seed);
    let (gate, up, down) = (
        proj(1, WIDTH, HIDDEN),
        proj(2, WIDTH, HIDDEN),
        proj(3, HIDDEN, WIDTH),
    );
    let mut block = None;
    match layout {
        Layout::Stacked(params, dtype) => {
            for (m, w) in [("gate_proj", &gate), ("up_proj", &up), ("down_proj", &down)] {
                let name = format!("mlp.switch_mlp.{m}");
                match params {
                    None => {
                        t.insert(format!("{name}.weight"), w.as_dtype(dtype).expect("cast"));
                    }
                    Some(p) => {
                        let w = w.as_dtype(dtype).expect("cast");
                        let (weight, scales, biases) =
                            Packed::quantize(&w, p).expect("quantize").into_parts();
                        t.insert(format!("{name}.weight"), weight);
                        t.insert(format!("{name}.scales"), scales);
                        if let Some(b) = biases {
                            t.insert(format!("{name}.biases"), b);
                        }
                        block = Some(serde_json::json!({
                            "group_size": p.group_size, "bits": p.bits, "mode": p.mode.as_str()
                        }));
                    }
                }
            }
        }
        Layout::PerExpert => {
            for (m, w) in [("gate_proj", &gate), ("up_proj", &up), ("down_proj", &down)] {
                for e in 0..EXPERTS {
                    let one = w.take_axis(Array::from_int(e), 0).expect("expert");
                    t.insert(format!("mlp.experts.{e}.{m}.weight"), one);
                }
            }
        }
        Layout::Fused => {
            let gate_up = mlx_rs::ops::concatenate(&[&gate, &up], 1).expect("fuse");
            t.insert("mlp.experts.gate_up_proj".into(), gate_up);
            t.insert("mlp.experts.down_proj".into(), down);
        }
    }
    Array::save_safetensors(&t, None, dir.join("model.safetensors")).expect("save");
    Quantization::parse(block.as_ref(), Path::new("config.json")).expect("block")
}

/// The resident layer, as the loaders build it (Hugging Face layouts
/// stacked first, as `glm::layout` does).
fn resident(dir: &Path, quant: &Quantization, policy: DtypePolicy) -> SwitchGlu {
    let w = Weights::from_dir(dir).expect("weights");
    let vb = w.view(quant, policy).pp("mlp");
    if vb.contains("experts.gate_up_proj") {
        let gate_up = vb.take("experts.gate_up_proj").expect("fused");
        let halves = mlx_rs::ops::split_equal(&gate_up, 2, 1).expect("split");
        vb.insert("switch_mlp.gate_proj.weight", halves[0].clone());
        vb.insert("switch_mlp.up_proj.weight", halves[1].clone());
        let down = vb.take("experts.down_proj").expect("down");
        vb.insert("switch_mlp.down_proj.weight", down);
    } else if vb.contains("experts.0.gate_proj.weight") {
        for m in ["gate_proj", "up_proj", "down_proj"] {
            let all: Vec<Array> = (0..EXPERTS)
                .map(|e| vb.take(&format!("experts.{e}.{m}.weight")).expect("expert"))
                .collect();
            let stacked = mlx_rs::ops::stack(&all, 0).expect("stack");
            vb.insert(&format!("switch_mlp.{m}.weight"), stacked);
        }
    }
    let glu = SwitchGlu::load(
        &vb.pp("switch_mlp"),
        EXPERTS,
        WIDTH,
        HIDDEN,
        Activation::Silu,
    )
    .expect("resident");
    w.finish().expect("every tensor taken");
    glu
}

fn streamed(
    dir: &Path,
    quant: &Quantization,
    policy: DtypePolicy,
    capacity: usize,
) -> Result<(Arc<ExpertStore>, SwitchGlu), ModelError> {
    let store = ExpertStore::open(dir, capacity)?;
    let w = Weights::from_dir(dir)?;
    let glu = SwitchGlu::streamed(
        &store,
        &w.view(quant, policy).pp("mlp"),
        "switch_mlp",
        EXPERTS,
        WIDTH,
        HIDDEN,
        Activation::Silu,
    )?;
    w.finish()?;
    Ok((store, glu))
}

/// `tokens` tokens' picks, `k` each, cycling through the experts from
/// `start` in steps that skip some (never all experts at once).
fn picks(tokens: i32, k: i32, start: u32) -> Array {
    let ids: Vec<u32> = (0..tokens * k)
        .map(|i| (start + (i as u32 * 5) % 7) % EXPERTS as u32)
        .collect();
    Array::from_slice(&ids, &[1, tokens, k])
}

fn bits(a: &Array) -> Vec<u32> {
    let f = a.as_dtype(Dtype::Float32).expect("f32");
    f.eval().expect("eval");
    f.as_slice::<f32>().iter().map(|v| v.to_bits()).collect()
}

/// One expert's bytes under `policy`, from the error a zero-byte tier gives.
fn expert_bytes(dir: &Path, quant: &Quantization, policy: DtypePolicy) -> usize {
    match streamed(dir, quant, policy, 0) {
        Err(ModelError::ExpertTier { needed, .. }) => needed as usize,
        other => panic!("a zero-byte tier must be refused: {other:?}"),
    }
}

#[test]
fn streamed_experts_equal_resident_ones_bit_for_bit_in_every_layout_and_form() {
    let affine = QuantParams::affine(32, 4);
    let mxfp4 = QuantMode::Mxfp4.default_params();
    let cases = [
        (Layout::Stacked(None, Dtype::Float32), DtypePolicy::Keep),
        (Layout::Stacked(None, Dtype::Bfloat16), DtypePolicy::Float32),
        (
            Layout::Stacked(Some(affine), Dtype::Float32),
            DtypePolicy::Keep,
        ),
        (
            Layout::Stacked(Some(mxfp4), Dtype::Float32),
            DtypePolicy::Keep,
        ),
        (
            Layout::Stacked(Some(affine), Dtype::Float32),
            DtypePolicy::Float32,
        ),
        (Layout::PerExpert, DtypePolicy::Keep),
        (Layout::Fused, DtypePolicy::Keep),
    ];
    for (layout, policy) in cases {
        let dir = tempfile::tempdir().expect("dir");
        let quant = write(dir.path(), layout);
        let want = resident(dir.path(), &quant, policy);
        let one = expert_bytes(dir.path(), &quant, policy);
        // One expert (evicting within a forward), three, all of them.
        for capacity in [one, 3 * one, EXPERTS as usize * one] {
            let (store, got) = streamed(dir.path(), &quant, policy, capacity).expect("streamed");
            // Unsorted (2 tokens) and sorted (16 tokens x 4 = 64 picks).
            for (tokens, k, sort) in [(2, 2, false), (16, 4, true), (16, 4, false)] {
                let x = random(&[1, tokens, HIDDEN], 7 + tokens as u64);
                let p = picks(tokens, k, tokens as u32);
                assert_eq!(SwitchGlu::sorts(p.size()), sort || tokens == 16);
                let a = want.forward(&x, &p, sort).expect("resident");
                let b = got.forward(&x, &p, sort).expect("streamed");
                assert_eq!(a.shape(), b.shape());
                assert!(
                    bits(&a) == bits(&b),
                    "{layout:?} {policy:?} tier {capacity}: {tokens} tokens, sort {sort}"
                );
            }
            let stats = store.stats();
            assert!(stats.misses > 0 && stats.resident_bytes as usize <= capacity);
        }
    }
}

#[test]
fn the_tier_counts_hits_misses_and_bytes_and_reads_an_expert_once_while_it_fits() {
    let dir = tempfile::tempdir().expect("dir");
    let quant = write(dir.path(), Layout::Stacked(None, Dtype::Float32));
    let one = expert_bytes(dir.path(), &quant, DtypePolicy::Keep);
    let (store, glu) = streamed(
        dir.path(),
        &quant,
        DtypePolicy::Keep,
        EXPERTS as usize * one,
    )
    .expect("store");
    let x = random(&[1, 2, HIDDEN], 1);
    let p = Array::from_slice(&[4u32, 1, 1, 2], &[1, 2, 2]);
    glu.forward(&x, &p, false).expect("first");
    let first = store.stats();
    assert_eq!(
        (first.misses, first.hits),
        (3, 0),
        "experts 1, 2, 4: one read each"
    );
    assert_eq!(first.bytes_read as usize, 3 * one);
    assert_eq!(first.resident_bytes as usize, 3 * one);
    assert!(first.read_seconds > 0.0 && first.wait_seconds > 0.0);
    glu.forward(&x, &p, false).expect("second");
    let second = store.stats();
    assert_eq!((second.misses, second.hits), (3, 3));
    assert_eq!(second.bytes_read, first.bytes_read);
    // A tier of one expert keeps the last read and reads again the two
    // it evicted (a forward looks every pick up before reading any).
    let (small, glu) = streamed(dir.path(), &quant, DtypePolicy::Keep, one).expect("store");
    glu.forward(&x, &p, false).expect("first");
    glu.forward(&x, &p, false).expect("second");
    let stats = small.stats();
    assert_eq!((stats.misses, stats.hits), (5, 1));
    assert_eq!(stats.resident_bytes as usize, one);
}

#[test]
fn a_tier_smaller_than_one_expert_is_refused_naming_the_option() {
    let dir = tempfile::tempdir().expect("dir");
    let quant = write(dir.path(), Layout::Stacked(None, Dtype::Float32));
    let one = expert_bytes(dir.path(), &quant, DtypePolicy::Keep);
    // gate and up [32, 64] and down [64, 32] in float32.
    assert_eq!(one, 3 * 32 * 64 * 4);
    let err = streamed(dir.path(), &quant, DtypePolicy::Keep, one - 1)
        .expect_err("too small")
        .to_string();
    assert!(
        err.contains(TIER_OPTION) && err.contains("mlp") && err.contains(&one.to_string()),
        "{err}"
    );
}

#[test]
fn a_shard_truncated_while_serving_fails_the_read_naming_file_and_tensor_and_the_tier_recovers() {
    let dir = tempfile::tempdir().expect("dir");
    let quant = write(dir.path(), Layout::Stacked(None, Dtype::Float32));
    let one = expert_bytes(dir.path(), &quant, DtypePolicy::Keep);
    let want = resident(dir.path(), &quant, DtypePolicy::Keep);
    let (_store, glu) = streamed(dir.path(), &quant, DtypePolicy::Keep, 4 * one).expect("store");
    let x = random(&[1, 1, HIDDEN], 2);
    let early = Array::from_slice(&[0u32, 1], &[1, 1, 2]);
    glu.forward(&x, &early, false).expect("resident now");
    let file = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&file).expect("read");
    std::fs::write(&file, &bytes[..bytes.len() / 2]).expect("truncate");
    let late = Array::from_slice(&[5u32, 0], &[1, 1, 2]);
    let err = glu
        .forward(&x, &late, false)
        .expect_err("truncated")
        .to_string();
    assert!(
        err.contains("model.safetensors")
            && err.contains("mlp.switch_mlp.")
            && err.contains("bytes"),
        "{err}"
    );
    // What is resident still serves; the file restored, the rest reads.
    glu.forward(&x, &early, false).expect("hits only");
    std::fs::write(&file, &bytes).expect("restore");
    let got = glu.forward(&x, &late, false).expect("read again");
    assert!(bits(&got) == bits(&want.forward(&x, &late, false).expect("resident")));
}

#[test]
fn expert_tensors_that_disagree_with_the_config_are_named() {
    let dir = tempfile::tempdir().expect("dir");
    let quant = write(dir.path(), Layout::Stacked(None, Dtype::Float32));
    let store = ExpertStore::open(dir.path(), 1 << 20).expect("store");
    let w = Weights::from_dir(dir.path()).expect("weights");
    // The config says 8 experts; the file holds 6.
    let err = SwitchGlu::streamed(
        &store,
        &w.view(&quant, DtypePolicy::Keep).pp("mlp"),
        "switch_mlp",
        8,
        WIDTH,
        HIDDEN,
        Activation::Silu,
    )
    .expect_err("mismatch")
    .to_string();
    assert!(
        err.contains("mlp.switch_mlp.gate_proj.weight") && err.contains("[8, 32, 64]"),
        "{err}"
    );
}

/// An adapter's LoRA updates of the stacks (mlx-lm's `LoRASwitchLinear`,
/// kept resident and gathered by expert id) change the layer, and streamed
/// experts under them still equal resident ones bit for bit, sorted and
/// not, through a tier of one expert.
#[test]
fn adapted_experts_stream_as_they_run_resident() {
    use crate::adapter::{Adapter, CONFIG_FILE, TENSORS_FILE};
    let dir = tempfile::tempdir().expect("dir");
    let quant = write(dir.path(), Layout::Stacked(None, Dtype::Float32));
    let adapter = tempfile::tempdir().expect("adapter dir");
    let rank = 4;
    let mut t: HashMap<String, Array> = HashMap::new();
    let scaled = |shape: &[i32], seed: u64| {
        random(shape, seed)
            .multiply(Array::from_f32(0.1))
            .expect("scale")
    };
    for (seed, (m, out, inp)) in [
        ("gate_proj", WIDTH, HIDDEN),
        ("up_proj", WIDTH, HIDDEN),
        ("down_proj", HIDDEN, WIDTH),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("mlp.switch_mlp.{m}");
        let seed = 40 + 2 * seed as u64;
        t.insert(
            format!("{name}.lora_a"),
            scaled(&[EXPERTS, rank, inp], seed),
        );
        t.insert(
            format!("{name}.lora_b"),
            scaled(&[EXPERTS, out, rank], seed + 1),
        );
    }
    Array::save_safetensors(&t, None, adapter.path().join(TENSORS_FILE)).expect("save");
    let config = serde_json::json!({"num_layers": 1,
        "lora_parameters": {"rank": rank, "dropout": 0.0, "scale": 3.0}});
    std::fs::write(adapter.path().join(CONFIG_FILE), config.to_string()).expect("config");
    let adapted = |w: &mut Weights| {
        Adapter::load(adapter.path())
            .expect("adapter")
            .apply(w, 1)
            .expect("applied")
    };

    let mut w = Weights::from_dir(dir.path()).expect("weights");
    adapted(&mut w);
    let vb = w.view(&quant, DtypePolicy::Keep).pp("mlp");
    let resident_glu = SwitchGlu::load(
        &vb.pp("switch_mlp"),
        EXPERTS,
        WIDTH,
        HIDDEN,
        Activation::Silu,
    )
    .expect("resident");
    w.finish().expect("every tensor taken, the adapter's too");
    let plain = resident(dir.path(), &quant, DtypePolicy::Keep);

    let one = expert_bytes(dir.path(), &quant, DtypePolicy::Keep);
    let store = ExpertStore::open(dir.path(), one).expect("store");
    let mut w = Weights::from_dir(dir.path()).expect("weights");
    adapted(&mut w);
    let streamed_glu = SwitchGlu::streamed(
        &store,
        &w.view(&quant, DtypePolicy::Keep).pp("mlp"),
        "switch_mlp",
        EXPERTS,
        WIDTH,
        HIDDEN,
        Activation::Silu,
    )
    .expect("streamed");
    w.finish().expect("every tensor taken, the adapter's too");

    for (tokens, k, sort) in [(2, 2, false), (16, 4, true)] {
        let x = random(&[1, tokens, HIDDEN], 50 + tokens as u64);
        let p = picks(tokens, k, 1);
        let a = resident_glu.forward(&x, &p, sort).expect("resident");
        let b = streamed_glu.forward(&x, &p, sort).expect("streamed");
        assert!(bits(&a) == bits(&b), "{tokens} tokens, sort {sort}");
        let base = plain.forward(&x, &p, sort).expect("plain");
        assert!(bits(&a) != bits(&base), "the adapter changes the experts");
    }
}
