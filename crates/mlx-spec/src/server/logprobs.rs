//! Log-probabilities in OpenAI's shapes: what a request asks for (chat's
//! `logprobs` + `top_logprobs`, completions' `logprobs: N`), each token's
//! text and bytes, and the `logprobs` objects of answers and stream chunks
//! (chat's `content` list, the completions API's legacy columns).

use serde_json::{json, Map, Value};
use spec_text::Tokenizer;

use super::api::ApiError;

/// The most alternatives a request may ask for per token (OpenAI's 20).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// What OpenAI reports for a log-probability that is not a finite number
/// (a token a grammar refuses): JSON has no `-inf`.
const FLOOR: f64 = -9999.0;

/// One emitted token's log-probability and its position's most likely
/// tokens (most likely first), as the serve loop reports them.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// Chat's `logprobs` (a boolean) and `top_logprobs` (0 to 20; above 0
/// only with `logprobs: true`): `None` when not asked, else how many
/// alternatives.
pub fn chat_request(
    logprobs: Option<&Value>,
    top_logprobs: Option<&Value>,
) -> Result<Option<usize>, ApiError> {
    let on = match logprobs {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::invalid(
                "`logprobs` must be a boolean",
                Some("logprobs"),
            ))
        }
    };
    let top = match top_logprobs {
        None | Some(Value::Null) => None,
        Some(v) => Some(count(v, "top_logprobs")?),
    };
    match (on, top) {
        // Some clients send `top_logprobs: 0` beside `logprobs: false`.
        (false, None | Some(0)) => Ok(None),
        (false, Some(_)) => Err(ApiError::invalid(
            "`top_logprobs` needs `logprobs: true`",
            Some("top_logprobs"),
        )),
        (true, top) => Ok(Some(top.unwrap_or(0))),
    }
}

/// The completions API's `logprobs`: an integer from 0 to 20 (how many
/// alternatives per token), or absent.
pub fn completion_request(logprobs: Option<&Value>) -> Result<Option<usize>, ApiError> {
    match logprobs {
        None | Some(Value::Null) => Ok(None),
        Some(v) => count(v, "logprobs").map(Some),
    }
}

fn count(v: &Value, name: &'static str) -> Result<usize, ApiError> {
    match v.as_u64() {
        Some(n) if n as usize <= MAX_TOP_LOGPROBS => Ok(n as usize),
        _ => Err(ApiError::invalid(
            format!("`{name}` must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {v}"),
            Some(name),
        )),
    }
}

fn number(lp: f32) -> f64 {
    if lp.is_finite() {
        f64::from(lp)
    } else {
        FLOOR
    }
}

/// The bytes of one byte-level BPE character (GPT-2's printable stand-ins
/// for the bytes that are not printable themselves), if it is one.
fn byte_level_byte(c: char) -> Option<u8> {
    let c = c as u32;
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    if c < 256 && printable(c) {
        return Some(c as u8);
    }
    // The others (0-32, 127-160, 173) take 256, 257, ... in byte order.
    let index = c.checked_sub(256)?;
    (0u32..256)
        .filter(|&b| !printable(b))
        .nth(index as usize)
        .map(|b| b as u8)
}

/// A token's exact bytes: its decoded text when that is whole UTF-8, else
/// (a piece of a character) its vocabulary entry read as a byte fallback
/// (`<0xE2>`) or as byte-level BPE.
pub fn token_bytes(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    let text = tokenizer.decode(&[id], false).unwrap_or_default();
    let piece = tokenizer.id_to_token(id);
    if !text.contains('\u{FFFD}') {
        // A lone SentencePiece token loses its leading space in decoding.
        if piece.as_deref().is_some_and(|p| p.starts_with('\u{2581}')) && !text.starts_with(' ') {
            return [b" ", text.as_bytes()].concat();
        }
        return text.into_bytes();
    }
    let Some(piece) = piece else {
        return text.into_bytes();
    };
    if let Some(hex) = piece.strip_prefix("<0x").and_then(|p| p.strip_suffix('>')) {
        if let Ok(b) = u8::from_str_radix(hex, 16) {
            return vec![b];
        }
    }
    piece
        .chars()
        .map(byte_level_byte)
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| text.into_bytes())
}

/// A token as OpenAI shows it: its text (pieces of a character as U+FFFD)
/// and its bytes.
fn token_entry(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = token_bytes(tokenizer, id);
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Chat's `logprobs` object for `tokens`: `{"content": [{token, logprob,
/// bytes, top_logprobs: [{token, logprob, bytes}]}], "refusal": null}`;
/// each entry also carries the token's `id` (an extension mlx-lm's server
/// has too), which `logit_bias` takes.
pub fn chat_json(tokenizer: &Tokenizer, tokens: &[TokenLogprob]) -> Value {
    json!({"content": entries(tokenizer, tokens), "refusal": null})
}

/// The entries of chat's `logprobs.content` (the Responses API's
/// `output_text.logprobs` too), one per token.
pub fn entries(tokenizer: &Tokenizer, tokens: &[TokenLogprob]) -> Vec<Value> {
    tokens
        .iter()
        .map(|t| {
            let (text, bytes) = token_entry(tokenizer, t.token);
            let top: Vec<Value> = t
                .top
                .iter()
                .map(|&(id, lp)| {
                    let (text, bytes) = token_entry(tokenizer, id);
                    json!({"token": text, "logprob": number(lp), "bytes": bytes, "id": id})
                })
                .collect();
            json!({"token": text, "logprob": number(t.logprob), "bytes": bytes, "id": t.token, "top_logprobs": top})
        })
        .collect()
}

/// The completions API's legacy `logprobs` object for `tokens`: `{tokens,
/// token_logprobs, top_logprobs: [{text: logprob}], text_offset}`, and
/// our extension `token_ids` (the ids `logit_bias` takes). Offsets
/// count characters from `offset` (where these tokens' text starts in the
/// completion) and are advanced past them; a token holding part of a
/// character starts where that character does.
pub fn completion_json(
    tokenizer: &Tokenizer,
    tokens: &[TokenLogprob],
    offset: &mut CharOffset,
) -> Value {
    let rows = tokens
        .iter()
        .map(|t| (t.token, Some((t.logprob, t.top.as_slice()))));
    legacy_columns(tokenizer, rows, offset)
}

/// The legacy columns of an echoed prompt (`echo` with `logprobs`), the
/// answer's (`completion_json` from the same `offset`) to follow: the
/// first token has no log-probability (`null`, as OpenAI's), each later
/// one its `scores` entry (the target's own distribution at the position
/// before it).
pub fn prompt_json(
    tokenizer: &Tokenizer,
    prompt: &[u32],
    scores: &[serve_loop::PromptLogprob],
    offset: &mut CharOffset,
) -> Value {
    let rows = prompt.iter().enumerate().map(|(i, &id)| {
        let score = i.checked_sub(1).and_then(|k| scores.get(k));
        (id, score.map(|s| (s.logprob, s.top.as_slice())))
    });
    legacy_columns(tokenizer, rows, offset)
}

/// The legacy columns of `rows`: each a token and its log-probability and
/// alternatives (`null`s without them).
fn legacy_columns<'a>(
    tokenizer: &Tokenizer,
    rows: impl Iterator<Item = (u32, Option<(f32, &'a [(u32, f32)])>)>,
    offset: &mut CharOffset,
) -> Value {
    let (mut texts, mut lps, mut tops, mut offsets, mut ids) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (id, scored) in rows {
        let (text, bytes) = token_entry(tokenizer, id);
        offsets.push(offset.push(&bytes));
        texts.push(text);
        ids.push(id);
        match scored {
            None => {
                lps.push(Value::Null);
                tops.push(Value::Null);
            }
            Some((lp, alternatives)) => {
                lps.push(json!(number(lp)));
                let mut top = Map::new();
                for &(id, lp) in alternatives {
                    let (text, _) = token_entry(tokenizer, id);
                    top.entry(text).or_insert(json!(number(lp)));
                }
                tops.push(Value::Object(top));
            }
        }
    }
    json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets, "token_ids": ids})
}

/// Legacy columns `first` then `then` (an echoed prompt's, then its
/// answer's).
pub fn join_columns(mut first: Value, then: Value) -> Value {
    if let (Some(a), Value::Object(b)) = (first.as_object_mut(), then) {
        for (key, column) in b {
            if let (Some(Value::Array(a)), Value::Array(b)) = (a.get_mut(&key), column) {
                a.extend(b);
            }
        }
    }
    first
}

/// Where the next token's text starts, in characters of the completion.
#[derive(Debug, Default)]
pub struct CharOffset {
    chars: usize,
    /// Bytes of a character not yet complete.
    pending: Vec<u8>,
}

impl CharOffset {
    /// The offset of a token with these bytes; advances past them.
    fn push(&mut self, bytes: &[u8]) -> usize {
        let at = self.chars;
        self.pending.extend_from_slice(bytes);
        let complete = match std::str::from_utf8(&self.pending) {
            Ok(s) => s.len(),
            Err(e) if e.error_len().is_some() => self.pending.len(),
            Err(e) => e.valid_up_to(),
        };
        self.chars += String::from_utf8_lossy(&self.pending[..complete])
            .chars()
            .count();
        self.pending.drain(..complete);
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_asks_for_logprobs_with_a_boolean_and_up_to_20_alternatives() {
        let t = Value::Bool(true);
        assert_eq!(chat_request(None, None).expect("absent"), None);
        assert_eq!(chat_request(Some(&t), None).expect("on"), Some(0));
        let off = Value::Bool(false);
        assert_eq!(
            chat_request(Some(&off), Some(&Value::from(0))).expect("0 alternatives, off"),
            None
        );
        assert_eq!(
            chat_request(Some(&t), Some(&Value::from(20))).expect("20"),
            Some(20)
        );
        for (lp, top, param) in [
            (Some(t.clone()), Some(Value::from(21)), "top_logprobs"),
            (Some(t.clone()), Some(Value::from(-1)), "top_logprobs"),
            (Some(t.clone()), Some(Value::from(2.5)), "top_logprobs"),
            (None, Some(Value::from(3)), "top_logprobs"),
            (Some(Value::from(1)), None, "logprobs"),
        ] {
            let err = chat_request(lp.as_ref(), top.as_ref()).expect_err("must fail");
            assert_eq!(
                (err.status.as_u16(), err.param),
                (400, Some(param)),
                "{lp:?} {top:?}"
            );
        }
    }

    #[test]
    fn completions_ask_with_a_count_from_0_to_20() {
        assert_eq!(completion_request(None).expect("absent"), None);
        assert_eq!(
            completion_request(Some(&Value::from(0))).expect("0"),
            Some(0)
        );
        assert_eq!(
            completion_request(Some(&Value::from(5))).expect("5"),
            Some(5)
        );
        for bad in [
            Value::from(21),
            Value::from(-1),
            Value::Bool(true),
            Value::from("3"),
        ] {
            let err = completion_request(Some(&bad)).expect_err("must fail");
            assert_eq!(
                (err.status.as_u16(), err.param),
                (400, Some("logprobs")),
                "{bad}"
            );
        }
    }

    #[test]
    fn byte_level_characters_map_back_to_their_bytes() {
        assert_eq!(byte_level_byte('a'), Some(b'a'));
        assert_eq!(byte_level_byte('\u{0120}'), Some(b' '), "Ġ is a space");
        assert_eq!(byte_level_byte('\u{010A}'), Some(b'\n'), "Ċ is a newline");
        assert_eq!(byte_level_byte('\u{00E2}'), Some(0xE2));
        assert_eq!(byte_level_byte('\u{4E00}'), None);
    }

    #[test]
    fn text_offsets_count_whole_characters() {
        let mut at = CharOffset::default();
        // "a", the first two bytes of "€" (E2 82 AC), its last byte, "b".
        let offsets: Vec<usize> = [&b"a"[..], &[0xE2, 0x82], &[0xAC], b"b"]
            .iter()
            .map(|b| at.push(b))
            .collect();
        assert_eq!(offsets, [0, 1, 1, 2]);
    }

    /// A byte-level BPE tokenizer of four tokens: `a`, ` b`, the first two
    /// bytes of `€` and its last byte.
    fn byte_level() -> (tempfile::TempDir, Tokenizer) {
        let dir = tempfile::tempdir().expect("dir");
        let tokenizer = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "vocab": {"a": 0, "\u{0120}b": 1, "\u{00E2}\u{0124}": 2, "\u{00AC}": 3}, "merges": []},
        });
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, tokenizer.to_string()).expect("write");
        let tokenizer = Tokenizer::from_file(&path).expect("tokenizer");
        (dir, tokenizer)
    }

    fn lp(token: u32, logprob: f32, top: &[(u32, f32)]) -> TokenLogprob {
        TokenLogprob {
            token,
            logprob,
            top: top.to_vec(),
        }
    }

    #[test]
    fn chat_entries_carry_text_bytes_ids_and_alternatives() {
        let (_dir, tok) = byte_level();
        assert_eq!(token_bytes(&tok, 1), b" b");
        assert_eq!(token_bytes(&tok, 2), [0xE2, 0x82], "a piece of a character");
        let v = chat_json(
            &tok,
            &[
                lp(1, -0.5, &[(1, -0.5), (0, f32::NEG_INFINITY)]),
                lp(2, -1.0, &[]),
            ],
        );
        let first = &v["content"][0];
        assert_eq!(
            (first["token"].as_str(), first["id"].as_u64()),
            (Some(" b"), Some(1))
        );
        assert_eq!(first["bytes"], serde_json::json!([32, 98]));
        assert_eq!(
            first["top_logprobs"][1]["logprob"],
            serde_json::json!(FLOOR)
        );
        assert_eq!(v["content"][1]["token"], "\u{FFFD}");
        assert_eq!(v["content"][1]["bytes"], serde_json::json!([0xE2, 0x82]));
        assert!(v["refusal"].is_null());
    }

    #[test]
    fn completion_columns_line_up() {
        let (_dir, tok) = byte_level();
        let mut at = CharOffset::default();
        let v = completion_json(
            &tok,
            &[lp(0, -0.1, &[(0, -0.1), (1, -2.5)]), lp(2, -0.2, &[])],
            &mut at,
        );
        assert_eq!(v["tokens"], serde_json::json!(["a", "\u{FFFD}"]));
        assert_eq!(v["token_ids"], serde_json::json!([0, 2]));
        assert_eq!(
            v["top_logprobs"][0],
            serde_json::json!({"a": -0.1f32 as f64, " b": -2.5})
        );
        assert_eq!(v["text_offset"], serde_json::json!([0, 1]));
        // The stream goes on where the last chunk stopped: `€` completes.
        let next = completion_json(&tok, &[lp(3, -0.3, &[]), lp(1, -0.4, &[])], &mut at);
        assert_eq!(next["text_offset"], serde_json::json!([1, 2]));
    }

    #[test]
    fn logprobs_that_are_not_numbers_read_as_openais_floor() {
        assert_eq!(number(f32::NEG_INFINITY), FLOOR);
        assert_eq!(number(f32::NAN), FLOOR);
        assert_eq!(number(-0.5), -0.5);
    }
}
