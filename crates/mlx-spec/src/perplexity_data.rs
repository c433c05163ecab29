//! The token rows `perplexity` scores, built as `mlx_lm.perplexity` builds
//! them: records of a local dataset in mlx-lm's formats, drawn in numpy's
//! `permutation` order for the seed, tokenized as mlx-lm's datasets
//! tokenize them, concatenated and cut into rows of the sequence length.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;
use spec_text::{ChatTemplate, Message, RenderOptions, Tokenizer};

/// How a dataset's records become tokens (mlx-lm's `create_dataset`
/// decides by the first record's keys).
enum Format {
    /// `{"prompt", "completion"}`: a user and an assistant turn through the
    /// chat template.
    Completions,
    /// `{"messages": [...]}` (and optional `tools`) through the template.
    Chat,
    /// `{"text"}`: the text with the tokenizer's special tokens, an
    /// end-of-sequence token appended unless it ends with one.
    Text,
}

/// A dataset's records and the tokenizer that reads them.
pub struct Dataset<'a> {
    records: Vec<Value>,
    format: Format,
    tokenizer: &'a Tokenizer,
    template: Option<ChatTemplate>,
    /// The tokenizer's end-of-sequence id, which text records end with.
    eos: Option<u32>,
    /// Where the records came from, for errors.
    file: PathBuf,
}

impl<'a> Dataset<'a> {
    /// Reads `path`: a JSONL file, or a directory holding `train.jsonl`
    /// (mlx-lm's local layout; the split `mlx_lm.perplexity` reads).
    pub fn open(path: &Path, tokenizer: &'a Tokenizer) -> Result<Dataset<'a>> {
        let file = if path.is_dir() {
            path.join("train.jsonl")
        } else {
            path.to_path_buf()
        };
        let text = std::fs::read_to_string(&file).with_context(|| {
            format!(
                "--data-path: reading {} (a JSONL file, or a directory holding train.jsonl)",
                file.display()
            )
        })?;
        let records = text
            .lines()
            .enumerate()
            .filter(|(_, line)| !line.trim().is_empty())
            .map(|(i, line)| {
                serde_json::from_str::<Value>(line)
                    .with_context(|| format!("{} line {}: not JSON", file.display(), i + 1))
            })
            .collect::<Result<Vec<_>>>()?;
        let Some(first) = records.first() else {
            bail!("{}: no records", file.display());
        };
        let has = |key: &str| first.get(key).is_some();
        let format = if has("prompt") && has("completion") {
            Format::Completions
        } else if has("messages") {
            Format::Chat
        } else if has("text") {
            Format::Text
        } else {
            bail!(
                "{}: the first record has none of `text`, `messages`, or `prompt` and `completion` (mlx-lm's dataset formats)",
                file.display()
            );
        };
        let template = match format {
            Format::Text => None,
            Format::Chat | Format::Completions => {
                Some(tokenizer.chat_template().with_context(|| {
                    format!(
                        "{}: chat records need the model's chat template",
                        file.display()
                    )
                })?)
            }
        };
        let eos = tokenizer.eos_token().and_then(|t| tokenizer.token_to_id(t));
        Ok(Dataset {
            records,
            format,
            tokenizer,
            template,
            eos,
            file,
        })
    }

    /// The records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Record `index`'s tokens.
    fn tokens(&self, index: usize) -> Result<Vec<u32>> {
        let record = &self.records[index];
        let named = || format!("{} record {}", self.file.display(), index + 1);
        let field = |key: &str| -> Result<String> {
            record
                .get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .with_context(|| format!("{}: `{key}` is not a string", named()))
        };
        let messages = match self.format {
            Format::Text => {
                let mut tokens = self.tokenizer.encode(&field("text")?, true)?;
                let eos = self.eos.with_context(|| {
                    format!("{}: the tokenizer names no end-of-sequence token", named())
                })?;
                if tokens.last() != Some(&eos) {
                    tokens.push(eos);
                }
                return Ok(tokens);
            }
            Format::Completions => vec![
                Message::user(field("prompt")?),
                Message::assistant(field("completion")?),
            ],
            Format::Chat => {
                let list = record.get("messages").cloned().unwrap_or(Value::Null);
                serde_json::from_value::<Vec<Message>>(list)
                    .with_context(|| format!("{}: `messages`", named()))?
            }
        };
        let tools = match record.get("tools") {
            Some(Value::Array(tools)) => Some(tools.as_slice()),
            _ => None,
        };
        let template = self.template.as_ref().context("no chat template")?;
        let options = RenderOptions {
            tools,
            ..RenderOptions::default()
        };
        let text = template
            .render_with(&messages, &options)
            .with_context(named)?;
        Ok(self.tokenizer.encode(&text, false)?)
    }

    /// `samples` rows of `length` tokens (`None`: as many as the records
    /// fill): records in the order `permutation(seed)` gives, each
    /// tokenized, concatenated until the rows are filled (or the records
    /// end), the remainder past the last whole row dropped.
    pub fn rows(&self, length: usize, samples: Option<usize>, seed: u32) -> Result<Vec<Vec<u32>>> {
        let wanted = samples.map(|n| n.saturating_mul(length));
        let mut data = Vec::new();
        for index in numpy_permutation(self.len(), seed) {
            if wanted.is_some_and(|w| data.len() >= w) {
                break;
            }
            data.extend(self.tokens(index)?);
        }
        let mut rows: Vec<Vec<u32>> = data.chunks_exact(length).map(<[u32]>::to_vec).collect();
        if let Some(n) = samples {
            rows.truncate(n);
        }
        Ok(rows)
    }
}

/// numpy's legacy `np.random.seed(seed); np.random.permutation(n)`: the
/// Mersenne Twister seeded by `init_genrand`, then a Fisher-Yates shuffle
/// of `0..n` drawing each index by masked rejection (`random_interval`).
pub fn numpy_permutation(n: usize, seed: u32) -> Vec<usize> {
    let mut mt = rand_mt::Mt::new(seed);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let max = i as u64;
        let mut mask = max;
        for shift in [1, 2, 4, 8, 16, 32] {
            mask |= mask >> shift;
        }
        let j = if max <= u64::from(u32::MAX) {
            loop {
                let value = u64::from(mt.next_u32()) & mask;
                if value <= max {
                    break value;
                }
            }
        } else {
            loop {
                let value = ((u64::from(mt.next_u32()) << 32) | u64::from(mt.next_u32())) & mask;
                if value <= max {
                    break value;
                }
            }
        };
        order.swap(i, j as usize);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    /// numpy 2.4 printed these: `np.random.seed(123);
    /// np.random.permutation(10)`, and the first 12 of `permutation(1000)`.
    #[test]
    fn the_permutation_is_numpys() {
        assert_eq!(numpy_permutation(10, 123), [4, 0, 7, 5, 8, 3, 1, 6, 9, 2]);
        assert_eq!(
            numpy_permutation(1000, 123)[..12],
            [131, 203, 50, 585, 138, 632, 328, 461, 924, 479, 195, 221]
        );
        assert!(numpy_permutation(0, 1).is_empty() && numpy_permutation(1, 1) == [0]);
    }
}
