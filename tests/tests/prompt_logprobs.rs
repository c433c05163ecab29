//! Prompt scoring through the scheduler (`Request::prompt_logprobs`, what
//! the server's `echo` with `logprobs` reads): each prompt token after the
//! first gets exactly the log-probability and alternatives the target's own
//! one-shot forward over the prompt gives (float32 log-softmax of its
//! logits), across prefill chunks and beside another request in the batch;
//! a prompt the prefix cache holds is still run whole; scoring changes no
//! emitted token, plainly or with prompt lookup; a request bringing its own
//! cached prefix is refused; a prompt scored with `max_tokens` 0 generates
//! nothing.

use std::ops::ControlFlow;

use draft_prompt_lookup as _;
use mlx_rs::{Array, Dtype};
use serve_loop::{
    Output, PrefixCacheConfig, PromptLogprob, ProviderChoice, Request, ScheduleConfig, Scheduler,
    ServeError, SpecConfig,
};
use spec_core::{ProviderOptions, Target};
use spec_models::{load_model, LoadOptions};

const TOP: usize = 3;

/// The target's own scores of `prompt`: one forward over all of it.
fn oracle(target: &dyn Target, prompt: &[u32]) -> Vec<PromptLogprob> {
    let mut caches = target.make_caches();
    let tokens = Array::from_slice(prompt, &[1, prompt.len() as i32]);
    let out = target.forward(&tokens, &mut caches, &[]).expect("forward");
    let logits = target.logits(&out.hidden).expect("logits");
    let lp = mlx_ext::softmax::log_softmax(&logits.as_dtype(Dtype::Float32).expect("f32"))
        .expect("log-softmax");
    lp.eval().expect("eval");
    let values = lp.as_slice::<f32>();
    let vocab = values.len() / prompt.len();
    (0..prompt.len() - 1)
        .map(|i| {
            let row = &values[i * vocab..(i + 1) * vocab];
            let mut ids: Vec<u32> = (0..vocab as u32).collect();
            ids.sort_by(|a, b| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b)));
            PromptLogprob {
                logprob: row[prompt[i + 1] as usize],
                top: ids[..TOP]
                    .iter()
                    .map(|&id| (id, row[id as usize]))
                    .collect(),
            }
        })
        .collect()
}

fn run(scheduler: &mut Scheduler<'_>, requests: Vec<Request>) -> Vec<Output> {
    let mut ids = Vec::new();
    for r in requests {
        ids.push(
            scheduler
                .submit(r, |_| ControlFlow::Continue(()))
                .expect("submit"),
        );
    }
    let mut outputs: Vec<Option<Output>> = ids.iter().map(|_| None).collect();
    while !scheduler.is_idle() {
        for f in scheduler.step().finished {
            let at = ids
                .iter()
                .position(|&id| id == f.id)
                .expect("a submitted id");
            outputs[at] = Some(f.result.expect("request"));
        }
    }
    outputs.into_iter().map(|o| o.expect("finished")).collect()
}

#[test]
fn prompt_scores_are_the_targets_own_across_chunks_batches_and_the_prefix_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    spec_fixtures::llama::Llama::tiny(7)
        .write(dir.path())
        .expect("checkpoint");
    let model = load_model(dir.path(), &LoadOptions::default()).expect("load");
    let lookup = serve_loop::build_provider("prompt-lookup", &model, &ProviderOptions::new())
        .expect("lookup");
    let providers = [lookup.as_ref()];
    let config = ScheduleConfig {
        max_batch: 4,
        prefill_chunk: 4,
        prefill_budget: 4096,
    };
    let mut scheduler = Scheduler::new(&model, config)
        .expect("scheduler")
        .with_providers(&providers)
        .with_prefix_cache(PrefixCacheConfig::default());
    let prompt: Vec<u32> = [5, 9, 11, 5, 9, 11, 23, 5, 9, 11, 40].to_vec();
    let expected = oracle(&model, &prompt);

    // The prompt's first run leaves it in the prefix cache.
    let plain = run(&mut scheduler, vec![Request::new(prompt.clone(), 8)]);
    assert!(plain[0].prompt_logprobs.is_empty(), "not asked for");
    let again = run(&mut scheduler, vec![Request::new(prompt.clone(), 8)]);
    assert!(again[0].cached_tokens > 0, "the cache holds the prompt");

    let scored = |speculate: bool| Request {
        prompt_logprobs: Some(TOP),
        speculation: speculate.then(|| ProviderChoice::new("prompt-lookup", SpecConfig::default())),
        ..Request::new(prompt.clone(), 8)
    };
    let beside = Request::new(vec![3, 4, 5, 6, 7, 8, 9], 8);
    let outs = run(&mut scheduler, vec![scored(false), beside, scored(true)]);
    for out in [&outs[0], &outs[2]] {
        assert_eq!(out.cached_tokens, 0, "a scored prompt runs whole");
        assert_eq!(out.prompt_logprobs.len(), prompt.len() - 1);
        for (i, (got, want)) in out.prompt_logprobs.iter().zip(&expected).enumerate() {
            assert_eq!(
                got.logprob.to_bits(),
                want.logprob.to_bits(),
                "position {i}"
            );
            let bits = |t: &[(u32, f32)]| {
                t.iter()
                    .map(|&(id, lp)| (id, lp.to_bits()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(&got.top), bits(&want.top), "position {i}");
        }
        assert_eq!(out.tokens, plain[0].tokens, "scoring changes no token");
    }
    assert!(outs[1].prompt_logprobs.is_empty());
    // The batch neighbour is as alone.
    let alone = run(
        &mut scheduler,
        vec![Request::new(vec![3, 4, 5, 6, 7, 8, 9], 8)],
    );
    assert_eq!(outs[1].tokens, alone[0].tokens);
}

#[test]
fn a_request_with_its_own_cached_prefix_cannot_be_scored() {
    let dir = tempfile::tempdir().expect("tempdir");
    spec_fixtures::llama::Llama::tiny(7)
        .write(dir.path())
        .expect("checkpoint");
    let model = load_model(dir.path(), &LoadOptions::default()).expect("load");
    let mut prefix = model.make_caches();
    let tokens = Array::from_slice(&[5u32, 9], &[1, 2]);
    model.forward(&tokens, &mut prefix, &[]).expect("forward");
    let request = Request {
        prompt_logprobs: Some(0),
        ..Request::new(vec![5, 9, 11, 12], 4)
    };
    let config = ScheduleConfig::default();
    let refused = serve_loop::generate_with(&model, &[], request, &config, Some(prefix), |_| {
        ControlFlow::Continue(())
    });
    match refused {
        Err(ServeError::Config(message)) => {
            assert!(message.contains("prompt log-probabilities"), "{message}")
        }
        other => panic!("expected a refusal, got {:?}", other.map(|o| o.tokens)),
    }
}

/// `max_tokens: 0` with prompt scores (the legacy scoring request): the
/// prompt's scores, as a request that goes on to generate gets them, and
/// no token, plainly and with a source that runs the prompt's last token
/// in its prefill (GLM's MTP head: `PrefillMode::Full`).
#[test]
fn a_prompt_scored_alone_generates_nothing() {
    use draft_glm52_mtp as _;
    let dir = tempfile::tempdir().expect("tempdir");
    spec_fixtures::glm::Glm::default()
        .write(dir.path())
        .expect("checkpoint");
    let model = load_model(dir.path(), &LoadOptions::default()).expect("load");
    let mtp = serve_loop::build_provider("glm52-native-mtp", &model, &ProviderOptions::new())
        .expect("mtp");
    let providers = [mtp.as_ref()];
    let mut scheduler = Scheduler::new(&model, ScheduleConfig::default())
        .expect("scheduler")
        .with_providers(&providers);
    let prompt: Vec<u32> = [5, 9, 11, 5, 9, 11, 23, 5, 9].to_vec();
    for speculate in [false, true] {
        let scored = |max_tokens| Request {
            prompt_logprobs: Some(TOP),
            speculation: speculate
                .then(|| ProviderChoice::new("glm52-native-mtp", SpecConfig::default())),
            ..Request::new(prompt.clone(), max_tokens)
        };
        let outs = run(&mut scheduler, vec![scored(0), scored(4)]);
        let (alone, generating) = (&outs[0], &outs[1]);
        assert!(alone.tokens.is_empty(), "speculate {speculate}: no token");
        assert_eq!(alone.finish, serve_loop::Finish::MaxTokens);
        assert_eq!(generating.tokens.len(), 4);
        assert_eq!(alone.prompt_logprobs.len(), prompt.len() - 1);
        assert_eq!(
            alone.prompt_logprobs, generating.prompt_logprobs,
            "speculate {speculate}: the same scores"
        );
    }
}
