//! `cargo xtask bench eagle3`: the `eagle3` provider with the gate's
//! synthetic EAGLE-3 head on a near-bigram copy of its four-layer llama
//! target (attention outputs x 0.01, as `bench dspark`'s llama), random and
//! trained on the target's own greedy text by SpecForge's own
//! `LlamaForCausalLMEagle3` under torch (`xtask/python/fit_eagle3.py`, in the
//! reference environment): acceptance per draft position, tokens per target
//! forward and wall time against plain greedy decoding of the same prompts
//! in the same process (`spec_run`), at fixed chain lengths.
//!
//! Options: `--prompts N` (default 24), `--max-tokens N` (default 64),
//! `--steps N` (training steps, default 400).

use std::path::Path;

use anyhow::{bail, Context, Result};

use super::fitted::{self, Options};
use run_protocol::providers::EAGLE3;
use run_protocol::spec::{Prompt, SpecRequest, PLAIN};
use run_protocol::Dtype;
use spec_fixtures::eagle3::GATE;

use super::spec::{summarize, tps};
use crate::gate::suite;
use crate::{reference_env, shell, synth, synth_eagle3, venv};

const FIT_SCRIPT: &str = "xtask/python/fit_eagle3.py";
const LOCAL_SCRIPT: &str = "xtask/python/synth_dspark.py";
/// Chain lengths measured (drafts a round, fixed).
const CHAINS: [usize; 3] = [2, 4, 6];

pub fn run(args: &[String]) -> Result<()> {
    let o = fitted::parse(args, 400)?;
    let python = venv::ensure()?;
    let reference = reference_env::ensure()?;
    let (target, heads) = synth_eagle3::ensure()?;
    let head = heads
        .iter()
        .find(|(name, _)| name == "eagle3-head")
        .map(|(_, dir)| dir.clone())
        .context("the gate's eagle3 head is missing")?;
    let local = synth::derived(
        &python,
        LOCAL_SCRIPT,
        "eagle3-target-local",
        &target,
        &[],
        &[
            "local-target".into(),
            "--suffix".into(),
            "self_attn.o_proj.weight".into(),
            "--scale".into(),
            "0.01".into(),
        ],
    )?;
    let fit = synth::derived(
        &reference,
        FIT_SCRIPT,
        "eagle3-head-fit",
        &head,
        &[&local],
        &[
            "--target".into(),
            local.display().to_string(),
            "--steps".into(),
            o.steps.to_string(),
        ],
    )?;
    suite::build_runner()?;
    let work = shell::root().join("target").join("bench-eagle3");
    let prompts: Vec<Prompt> = suite::id_prompts(GATE.vocab as u64, o.prompts)
        .into_iter()
        .map(Prompt::Ids)
        .collect();
    println!(
        "\neagle3 on the near-bigram synthetic four-layer llama (hidden 64, vocab 320; head: draft vocabulary {}), {} prompts x {} tokens, greedy, fixed chains",
        GATE.draft_vocab, o.prompts, o.max_tokens
    );
    println!(
        "{:<20} {:>6} {:>8} {:>11} {:>14} {:>10}  accepted / drafted per position",
        "head", "chain", "drafted", "acceptance", "tok / forward", "vs plain"
    );
    let trained = format!("trained {} steps", o.steps);
    for (label, dir) in [("random", &head), (trained.as_str(), &fit)] {
        for chain in CHAINS {
            measure(&local, dir, label, chain, &prompts, &o, &work)?;
        }
    }
    Ok(())
}

fn measure(
    target: &Path,
    head: &Path,
    label: &str,
    chain: usize,
    prompts: &[Prompt],
    o: &Options,
    work: &Path,
) -> Result<()> {
    let mut request = SpecRequest::new(
        target.to_owned(),
        Dtype::F32,
        prompts.to_vec(),
        o.max_tokens,
        vec![PLAIN.to_owned(), EAGLE3.to_owned()],
    );
    request.option(EAGLE3, "model", head.display().to_string());
    request.num_draft = Some(chain);
    request.adaptive = false;
    let file = format!("{}-{chain}", label.replace(' ', "-"));
    let results = suite::spec_run(&request, work, &file, &[])?;
    let (plain, ours) = (results.alone(PLAIN), results.alone(EAGLE3));
    let (p, s) = (summarize(plain), summarize(ours));
    if p.tokens == 0 {
        bail!("no plain runs");
    }
    let identical = plain.iter().zip(ours).all(|(a, b)| a.tokens == b.tokens);
    let per_position: Vec<String> = (0..chain)
        .map(|m| {
            let sum = |f: fn(&run_protocol::spec::Generation) -> &Vec<usize>| -> usize {
                ours.iter().filter_map(|g| f(g).get(m)).sum()
            };
            format!(
                "{}/{}",
                sum(|g| &g.accepted_by_pos),
                sum(|g| &g.drafted_by_pos)
            )
        })
        .collect();
    println!(
        "{label:<20} {chain:>6} {:>8} {:>10.1}% {:>14.2} {:>9.2}x  {}{}",
        s.drafted,
        100.0 * s.accepted as f64 / s.drafted.max(1) as f64,
        s.tokens as f64 / s.target_calls.max(1) as f64,
        tps(&s) / tps(&p),
        per_position.join(" "),
        if identical {
            ""
        } else {
            "  (OUTPUT DIFFERS FROM PLAIN)"
        }
    );
    Ok(())
}
