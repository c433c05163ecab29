//! Prints our suffix trie's proposals for a script read from stdin, one
//! JSON object per `spec` line, for `xtask/python/suffix_oracle.py` to
//! compare with ArcticInference's `SuffixTree`.
//!
//! Lines: `depth D` (a new, empty trie), `seq T...` (insert a sequence),
//! `rm K` (remove the K-th sequence inserted, from 0), `spec MAX FACTOR
//! OFFSET MIN_PROB | C...` (propose after context C).

use std::io::{BufRead, Write};

use draft_suffix::{SpecLimits, SuffixTrie};

fn numbers<T: std::str::FromStr>(words: &[&str], line: usize) -> Result<Vec<T>, String> {
    words
        .iter()
        .map(|w| {
            w.parse()
                .map_err(|_| format!("line {line}: bad number `{w}`"))
        })
        .collect()
}

fn main() -> Result<(), String> {
    let mut trie = SuffixTrie::new(1);
    let mut seqs: Vec<Vec<u32>> = Vec::new();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for (n, line) in std::io::stdin().lock().lines().enumerate() {
        let line = line.map_err(|e| e.to_string())?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [] => {}
            ["depth", d] => {
                trie = SuffixTrie::new(numbers::<usize>(&[d], n)?[0]);
                seqs.clear();
            }
            ["seq", tokens @ ..] => {
                let tokens = numbers::<u32>(tokens, n)?;
                trie.insert(&tokens);
                seqs.push(tokens);
            }
            ["rm", k] => {
                let k = numbers::<usize>(&[k], n)?[0];
                let seq = seqs.get(k).ok_or(format!("line {n}: no sequence {k}"))?;
                trie.remove(seq);
            }
            ["spec", max, factor, offset, min_prob, "|", context @ ..] => {
                let limits = SpecLimits {
                    max_tokens: numbers::<usize>(&[max], n)?[0],
                    max_spec_factor: numbers::<f32>(&[factor], n)?[0],
                    max_spec_offset: numbers::<f32>(&[offset], n)?[0],
                    min_token_prob: numbers::<f32>(&[min_prob], n)?[0],
                };
                let draft = trie.speculate(&numbers::<u32>(context, n)?, limits);
                let join = |v: Vec<String>| v.join(",");
                writeln!(
                    out,
                    "{{\"tokens\":[{}],\"probs\":[{}],\"score\":{:?},\"match_len\":{}}}",
                    join(draft.tokens.iter().map(u32::to_string).collect()),
                    join(draft.probs.iter().map(|p| format!("{p:?}")).collect()),
                    draft.score,
                    draft.match_len
                )
                .map_err(|e| e.to_string())?;
            }
            _ => return Err(format!("line {n}: cannot read `{line}`")),
        }
    }
    Ok(())
}
