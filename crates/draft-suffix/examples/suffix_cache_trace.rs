//! Runs recorded request histories through one `SuffixProvider` the way the
//! serve loop drives its sources (greedy acceptance against each request's
//! recorded output) and prints every proposal, one JSON object a line, for
//! gate `suffix` to compare with ArcticInference's `SuffixDecodingCache`.
//!
//! Input lines: `config DEPTH BUDGET FACTOR OFFSET MIN_PROB NUM_DRAFT`
//! (a new provider), then `request P... | T...` (prompt, recorded output;
//! requests run one after another, each completing before the next).
//! Output: `{"req":R,"pos":N,"max":M,"tokens":[..]}` for each draft (N
//! output tokens committed before it, at most M proposed), and after each
//! request `{"req":R,"cached":[..]}`: the requests the global tree holds.

use std::io::{BufRead, Write};

use draft_suffix::{SuffixConfig, SuffixProvider, SuffixSource};
use mlx_rs::Array;
use spec_core::{CommitInfo, DraftRequest, DraftSource, GreedySampler, RequestOutcome, SpecError};

fn numbers<T: std::str::FromStr>(words: &[&str], line: usize) -> Result<Vec<T>, String> {
    words
        .iter()
        .map(|w| {
            w.parse()
                .map_err(|_| format!("line {line}: bad number `{w}`"))
        })
        .collect()
}

/// Runs one request to its end; returns one JSON line per draft.
fn run_request(
    source: &mut SuffixSource,
    id: usize,
    prompt: &[u32],
    truth: &[u32],
    num_draft: usize,
) -> Result<Vec<String>, SpecError> {
    let hidden = Array::from_slice(&[0.0f32], &[1, 1, 1]);
    source.prefill(prompt, None)?;
    let mut history = prompt.to_vec();
    let mut feed: Vec<u32> = prompt.last().map(|&t| vec![t]).unwrap_or_default();
    let mut lines = Vec::new();
    let mut emitted = 0;
    while emitted < truth.len() {
        // The round's verify forward emits one token past the accepted draft.
        let max = num_draft.min(truth.len() - emitted - 1);
        let request = DraftRequest {
            feed: &feed,
            max_tokens: max,
            anchor_hidden: None,
            history: &history,
            target_caches: None,
        };
        let draft = source.draft(request, &mut GreedySampler)?.tokens;
        let accepted = draft
            .iter()
            .zip(&truth[emitted..])
            .take_while(|(d, t)| d == t)
            .count();
        let next = truth[emitted + accepted];
        lines.push(format!(
            "{{\"req\":{id},\"pos\":{emitted},\"max\":{max},\"tokens\":{draft:?}}}"
        ));
        source.commit(CommitInfo {
            drafted: draft.len(),
            accepted,
            accepted_tokens: &draft[..accepted],
            next,
            verified_taps: None,
            verified_hidden: &hidden,
        })?;
        history.extend_from_slice(&draft[..accepted]);
        history.push(next);
        feed = match draft.last() {
            Some(&last) if accepted == draft.len() => vec![last, next],
            _ => vec![next],
        };
        emitted += accepted + 1;
    }
    source.finish(RequestOutcome::Completed);
    Ok(lines)
}

fn main() -> Result<(), String> {
    let mut provider: Option<(SuffixProvider, usize)> = None;
    // Each joined request's id and output, in the order they joined.
    let mut joined: Vec<(usize, Vec<u32>)> = Vec::new();
    let mut requests = 0;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for (n, line) in std::io::stdin().lock().lines().enumerate() {
        let line = line.map_err(|e| e.to_string())?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [] => {}
            ["config", depth, budget, factor, offset, min_prob, num_draft] => {
                let config = SuffixConfig {
                    max_depth: numbers(&[depth], n)?[0],
                    max_tree_tokens: numbers(&[budget], n)?[0],
                    max_spec_factor: numbers(&[factor], n)?[0],
                    max_spec_offset: numbers(&[offset], n)?[0],
                    min_token_prob: numbers(&[min_prob], n)?[0],
                    ..SuffixConfig::default()
                };
                let p = SuffixProvider::new(config).map_err(|e| format!("line {n}: {e}"))?;
                provider = Some((p, numbers(&[num_draft], n)?[0]));
                joined.clear();
                requests = 0;
            }
            ["request", rest @ ..] => {
                let (p, num_draft) = provider
                    .as_ref()
                    .ok_or(format!("line {n}: a request before any config"))?;
                let split = rest
                    .iter()
                    .position(|w| *w == "|")
                    .ok_or(format!("line {n}: no `|` between prompt and output"))?;
                let prompt = numbers::<u32>(&rest[..split], n)?;
                let truth = numbers::<u32>(&rest[split + 1..], n)?;
                if prompt.is_empty() || truth.is_empty() {
                    return Err(format!("line {n}: empty prompt or output"));
                }
                let id = requests;
                requests += 1;
                let mut source = p.source();
                let lines = run_request(&mut source, id, &prompt, &truth, *num_draft)
                    .map_err(|e| format!("line {n}: {e}"))?;
                joined.push((id, truth));
                // The global tree keeps join order: match its requests to
                // the joined ones in that order.
                let global = p.global().read();
                let mut candidates = joined.iter();
                let mut cached = Vec::new();
                for tokens in global.cached() {
                    let (id, _) = candidates
                        .by_ref()
                        .find(|(_, t)| t.as_slice() == tokens)
                        .ok_or(format!("line {n}: a cached request that never joined"))?;
                    cached.push(*id);
                }
                for l in lines {
                    writeln!(out, "{l}").map_err(|e| e.to_string())?;
                }
                writeln!(out, "{{\"req\":{id},\"cached\":{cached:?}}}")
                    .map_err(|e| e.to_string())?;
            }
            _ => return Err(format!("line {n}: cannot read `{line}`")),
        }
    }
    Ok(())
}
