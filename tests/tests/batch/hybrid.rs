//! Hybrid targets (`qwen3_next`, `qwen3_5`: Gated DeltaNet layers whose
//! recurrent states roll back by the states each position left): every
//! provider's speculative output equals plain decoding's, and batches of
//! rows with different providers, plain rows and seeded sampling give each
//! request what it gets alone (suffix decoding, whose drafts come from
//! every request's output, is checked against plain decoding only).

use spec_fixtures::qwen3_next::{Qwen3Next, GATE, GATE_QWEN3_5};

use super::*;

/// Drafts the plain greedy continuation of the prompts it knows, with every
/// third position of it changed: rounds accept some drafts and roll back the
/// rest, at every depth.
struct Echo {
    plain: Vec<(Vec<u32>, Vec<u32>)>,
}

impl DraftProvider for Echo {
    fn id(&self) -> &str {
        "echo"
    }
    fn open<'a>(&self, _: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(EchoSource {
            plain: self.plain.clone(),
            sequence: Vec::new(),
        }))
    }
}

struct EchoSource {
    plain: Vec<(Vec<u32>, Vec<u32>)>,
    /// The prompt and its plain continuation.
    sequence: Vec<u32>,
}

impl DraftSource for EchoSource {
    fn syncs_from_history(&self) -> bool {
        true
    }
    fn prefill(&mut self, prompt: &[u32], _: Option<&Array>) -> Result<(), SpecError> {
        let (p, cont) = self
            .plain
            .iter()
            .find(|(p, _)| p == prompt)
            .ok_or(SpecError::Internal("echo: an unknown prompt"))?;
        self.sequence = p.iter().chain(cont).copied().collect();
        Ok(())
    }
    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        _: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        let at = request.history.len();
        let tokens = (at..self.sequence.len().min(at + request.max_tokens))
            .map(|i| match i % 3 {
                0 => (self.sequence[i] + 1) % VOCAB,
                _ => self.sequence[i],
            })
            .collect();
        Ok(Draft {
            tokens,
            probs: None,
        })
    }
    fn commit(&mut self, _: CommitInfo<'_>) -> Result<(), SpecError> {
        Ok(())
    }
}

fn hybrid(spec: Qwen3Next) -> (tempfile::TempDir, LoadedModel) {
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("fixture");
    let model = load_model(dir.path(), &LoadOptions::default()).expect("load");
    (dir, model)
}

#[test]
fn hybrid_batches_of_every_provider_equal_plain_decoding_and_each_request_alone() {
    for (target, drafter) in [
        (GATE.tiny(11), GATE_QWEN3_5.tiny(12)),
        (GATE_QWEN3_5.tiny(13), GATE.tiny(11)),
    ] {
        let (_d, model) = hybrid(target);
        let (draft_dir, _) = hybrid(drafter);
        let lookup = build("prompt-lookup", &model, ProviderOptions::new());
        let suffix = build("suffix", &model, ProviderOptions::new());
        let drafter = build(
            "draft-model",
            &model,
            ProviderOptions::from([("model", draft_dir.path().to_string_lossy().into_owned())]),
        );
        let prompts: Vec<Vec<u32>> = (1..7).map(|i| prompt(i, 9 + 3 * i as usize)).collect();
        let echo = Echo {
            plain: prompts
                .iter()
                .map(|p| {
                    let plain = alone(&model, &[], &Spec::new(p.clone(), 30, None, 0));
                    (p.clone(), plain.expect("plain").tokens)
                })
                .collect(),
        };
        let providers: Vec<&dyn DraftProvider> = vec![lookup.as_ref(), drafter.as_ref(), &echo];
        let mut specs = vec![
            Spec::new(prompts[0].clone(), 24, None, 0),
            Spec::new(prompts[1].clone(), 20, Some(2), 0),
            Spec::new(prompts[2].clone(), 30, Some(1), 1),
            Spec::new(prompts[3].clone(), 16, Some(2), 2),
            Spec::new(prompts[4].clone(), 18, Some(0), 4),
            Spec::new(prompts[1].clone(), 20, Some(1), 5),
            Spec::new(prompts[5].clone(), 20, Some(2), 5),
            Spec::new(prompts[5].clone(), 20, Some(0), 6),
        ];
        specs[7].temperature = 0.8;
        specs[7].seed = 7;
        let out = check(&model, &providers, &specs);
        // Speculation changed nothing: each greedy request's tokens are
        // those of its prompt decoded plainly.
        for (spec, got) in specs.iter().zip(&out).filter(|(s, _)| s.temperature == 0.0) {
            let plain = alone(
                &model,
                &providers,
                &Spec {
                    provider: None,
                    ..spec.clone()
                },
            )
            .expect("plain");
            assert_eq!(
                got.as_ref().expect("ok").tokens,
                plain.tokens,
                "{:?}",
                spec.provider
            );
        }
        let suffix: Vec<&dyn DraftProvider> = vec![suffix.as_ref()];
        for spec in &specs[..3] {
            let plain = alone(
                &model,
                &suffix,
                &Spec {
                    provider: None,
                    ..spec.clone()
                },
            )
            .expect("plain");
            let got = alone(
                &model,
                &suffix,
                &Spec {
                    provider: Some(0),
                    ..spec.clone()
                },
            )
            .expect("suffix");
            assert_eq!(got.tokens, plain.tokens, "suffix");
        }
        let drafted: usize = out
            .iter()
            .map(|o| o.as_ref().expect("ok").stats.drafted)
            .sum();
        let accepted: usize = out
            .iter()
            .map(|o| o.as_ref().expect("ok").stats.accepted)
            .sum();
        assert!(
            accepted > 0 && accepted < drafted,
            "rounds must accept some drafts and roll back others ({accepted} of {drafted})"
        );
    }
}

/// `--max-kv-size 12` on the hybrid's attention layers (the first 4
/// positions and the last 8, the Gated DeltaNet layers unbounded as ever):
/// prompts and answers past the bound, rounds that accept and roll back,
/// batched as alone and speculated as plain; the bound changes the output.
#[test]
fn bounded_hybrid_batches_equal_plain_decoding_and_each_request_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    GATE.tiny(11).write(dir.path()).expect("fixture");
    let bounded = LoadOptions {
        max_kv_size: Some(12),
        ..LoadOptions::default()
    };
    let model = load_model(dir.path(), &bounded).expect("load");
    let unbounded = load_model(dir.path(), &LoadOptions::default()).expect("load");
    let prompts: Vec<Vec<u32>> = (1..5).map(|i| prompt(i, 6 + 5 * i as usize)).collect();
    let plain = |model: &LoadedModel, p: &[u32]| {
        alone(model, &[], &Spec::new(p.to_vec(), 24, None, 0))
            .expect("plain")
            .tokens
    };
    let echo = Echo {
        plain: prompts
            .iter()
            .map(|p| (p.clone(), plain(&model, p)))
            .collect(),
    };
    assert!(
        prompts
            .iter()
            .any(|p| plain(&model, p) != plain(&unbounded, p)),
        "the bound changes what the model sees"
    );
    let lookup = build("prompt-lookup", &model, ProviderOptions::new());
    let providers: Vec<&dyn DraftProvider> = vec![lookup.as_ref(), &echo];
    let specs = vec![
        Spec::new(prompts[0].clone(), 24, Some(1), 0),
        Spec::new(prompts[1].clone(), 24, None, 0),
        Spec::new(prompts[2].clone(), 24, Some(1), 1),
        Spec::new(prompts[3].clone(), 24, Some(0), 2),
        Spec::new(prompts[1].clone(), 24, Some(1), 3),
    ];
    let out = check(&model, &providers, &specs);
    for (spec, got) in specs.iter().zip(&out) {
        assert_eq!(
            got.as_ref().expect("ok").tokens,
            plain(&model, &spec.prompt),
            "{:?}",
            spec.provider
        );
    }
    let accepted: usize = out
        .iter()
        .map(|o| o.as_ref().expect("ok").stats.accepted)
        .sum();
    let rejected: usize = out
        .iter()
        .map(|o| o.as_ref().expect("ok").stats.rejected)
        .sum();
    assert!(
        accepted > 0 && rejected > 0,
        "{accepted} accepted, {rejected} rejected"
    );
}

#[test]
fn a_failing_row_rolls_the_hybrid_rows_of_its_step_back_exactly() {
    // Token 95 sits in the second chunk of request 1's prompt: its row fails
    // in a step shared with decoding rows that already advanced their
    // recurrent states; they roll back to the step's start and go on alone.
    let (_d, inner) = hybrid(GATE.tiny(11));
    let model = Poisoned { inner, poison: 95 };
    let first = prompt(1, 6);
    let plain = alone(&model, &[], &Spec::new(first.clone(), 30, None, 0)).expect("plain");
    let echo = Echo {
        plain: vec![(first.clone(), plain.tokens.clone())],
    };
    let providers: Vec<&dyn DraftProvider> = vec![&echo];
    let mut poisoned = prompt(2, 20);
    poisoned.iter_mut().for_each(|t| *t %= 90);
    poisoned[12] = 95;
    let specs = vec![
        Spec::new(first, 30, Some(0), 0),
        Spec::new(poisoned, 20, None, 3),
        Spec::new(prompt(3, 7), 30, None, 0),
    ];
    let out = check(&model, &providers, &specs);
    assert_eq!(out[0].as_ref().expect("ok").tokens, plain.tokens);
    assert!(out[2].is_ok());
    let err = out[1].as_ref().expect_err("the poisoned request fails");
    assert!(err.to_string().contains("injected fault"), "{err}");
}
