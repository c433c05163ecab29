//! Suffix decoding through the real serve loop on a tiny model: lossless,
//! and the provider's global tree makes a repeated request draft more.

use std::ops::ControlFlow;

use draft_suffix::{SuffixConfig, SuffixProvider};
use serve_loop::{AdaptiveConfig, Output, Request, SpecConfig, Speculation};
use spec_core::{DraftProvider, GreedySampler, Target};
use spec_models::{load_model, LoadOptions};

fn run(target: &dyn Target, prompt: &[u32], provider: Option<&dyn DraftProvider>) -> Output {
    let mut sampler = GreedySampler;
    let speculation = provider.map(|provider| Speculation {
        provider,
        config: SpecConfig {
            num_draft: 8,
            adaptive: AdaptiveConfig::off(),
            ..SpecConfig::default()
        },
    });
    let request = Request {
        prompt,
        max_tokens: 32,
        is_eos: &|_| false,
        sampler: &mut sampler,
        processors: &mut [],
        speculation,
        cancel: None,
    };
    serve_loop::generate(target, request, |_| ControlFlow::Continue(())).expect("generate")
}

#[test]
fn a_repeated_request_drafts_more_from_the_global_tree_and_stays_lossless() {
    let dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_llama(dir.path(), 7).expect("write model");
    let model = load_model(dir.path(), &LoadOptions::default()).expect("load");
    let prompt = [3, 17, 42, 8, 55, 21, 9];
    let plain = run(&model, &prompt, None);

    let provider = SuffixProvider::new(SuffixConfig::default()).expect("valid");
    let first = run(&model, &prompt, Some(&provider));
    assert_eq!(provider.global().read().requests(), 1, "the first joined");
    let second = run(&model, &prompt, Some(&provider));
    assert_eq!(first.tokens, plain.tokens, "lossless");
    assert_eq!(second.tokens, plain.tokens, "lossless");
    let (a, b) = (&first.stats, &second.stats);
    eprintln!(
        "first: {} accepted in {} forwards ({:.2}/forward); second: {} in {} ({:.2})",
        a.accepted,
        a.target_calls,
        a.tokens_per_forward(),
        b.accepted,
        b.target_calls,
        b.tokens_per_forward()
    );
    assert!(
        b.accepted > a.accepted && b.tokens_per_forward() > a.tokens_per_forward(),
        "first {a:?}, second {b:?}"
    );
    assert!(b.tokens_per_forward() >= 2.0, "second {b:?}");
}
