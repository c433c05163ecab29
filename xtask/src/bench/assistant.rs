//! `cargo xtask bench assistant`: the `gemma4-assistant` provider on the
//! synthetic Gemma-4 pair (`gemma4-shared` + each synthetic assistant) in
//! each query position mode at gamma 1-4, fixed draft length: acceptance by
//! draft position, tokens per verify forward, and generation time against
//! plain decoding of the same prompts in the same process. Prints a markdown
//! table for docs/PERFORMANCE.md.

use anyhow::{bail, Context, Result};

use run_protocol::providers::GEMMA4_ASSISTANT;
use run_protocol::spec::{SpecRequest, PLAIN};
use run_protocol::Dtype;

use crate::gate::suite;
use crate::{shell, synth, synth_assistant, venv};

const MAX_TOKENS: usize = 48;
const PROMPTS: usize = 12;
const ASSISTANTS: [&str; 2] = ["gemma4-assistant", "gemma4-assistant-tied"];
/// The provider's `positions` values.
const POSITIONS: [&str; 3] = ["constant", "advancing", "advancing-from-last-cached"];

pub fn run(args: &[String]) -> Result<()> {
    if let Some(extra) = args.first() {
        bail!("bench assistant takes no arguments (got `{extra}`)");
    }
    let python = venv::ensure()?;
    let models = synth::ensure_with_assistants(&python)?;
    let dir_of = |name: &str| {
        models
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.dir.clone())
            .with_context(|| format!("no synthetic {name}"))
    };
    let target = dir_of(synth_assistant::TARGET)?;
    suite::build_runner()?;
    let prompts = suite::id_prompts(320, PROMPTS);
    let work = shell::root().join("target").join("bench-assistant");
    let mut rows = vec![
        "| assistant | positions | gamma | acceptance by position | accepted / drafted | tokens per verify forward | generation vs plain |".to_owned(),
        "|---|---|---|---|---|---|---|".to_owned(),
    ];
    for (name, positions) in ASSISTANTS
        .iter()
        .flat_map(|n| POSITIONS.iter().map(move |p| (*n, *p)))
    {
        let assistant = dir_of(name)?;
        for gamma in 1..=4usize {
            let mut request = SpecRequest::new(
                target.clone(),
                Dtype::F32,
                suite::ids(&prompts),
                MAX_TOKENS,
                vec![PLAIN.to_owned(), GEMMA4_ASSISTANT.to_owned()],
            );
            request
                .option(GEMMA4_ASSISTANT, "model", assistant.display().to_string())
                .option(GEMMA4_ASSISTANT, "positions", positions);
            request.adaptive = false;
            request.num_draft = Some(gamma);
            let label = format!("{name}-{positions}-gamma{gamma}");
            let results = suite::spec_run(&request, &work, &label, &[])?;
            let (plain, spec) = (results.alone(PLAIN), results.alone(GEMMA4_ASSISTANT));
            if plain.is_empty() || spec.is_empty() {
                bail!("spec_run returned no runs")
            }
            let mut drafted_by_pos = vec![0usize; gamma];
            let mut accepted_by_pos = vec![0usize; gamma];
            for r in spec {
                for (i, (d, a)) in r
                    .drafted_by_pos
                    .iter()
                    .zip(&r.accepted_by_pos)
                    .enumerate()
                    .take(gamma)
                {
                    drafted_by_pos[i] += d;
                    accepted_by_pos[i] += a;
                }
            }
            let by_pos: Vec<String> = drafted_by_pos
                .iter()
                .zip(&accepted_by_pos)
                .map(|(&d, &a)| format!("{:.0}%", 100.0 * a as f64 / d.max(1) as f64))
                .collect();
            let (drafted, accepted): (usize, usize) = spec
                .iter()
                .fold((0, 0), |(d, a), r| (d + r.drafted, a + r.accepted));
            let emitted: usize = spec.iter().map(|r| r.tokens.len()).sum();
            let calls: usize = spec.iter().map(|r| r.target_calls).sum();
            let (t_plain, t_spec): (f64, f64) = (
                plain.iter().map(|r| r.generation_seconds).sum(),
                spec.iter().map(|r| r.generation_seconds).sum(),
            );
            rows.push(format!(
                "| {name} | {positions} | {gamma} | {} | {accepted} / {drafted} ({:.1}%) | {:.2} | {:.2}x |",
                by_pos.join(" / "),
                100.0 * accepted as f64 / drafted.max(1) as f64,
                emitted as f64 / calls.max(1) as f64,
                t_plain / t_spec.max(1e-9)
            ));
        }
    }
    println!("{} prompts of random ids (3-43 tokens, half with repeats), {MAX_TOKENS} tokens each, greedy, sliding window {}:\n", PROMPTS, crate::synth_gemma4::SLIDING_WINDOW);
    println!("{}", rows.join("\n"));
    Ok(())
}
