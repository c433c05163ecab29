//! The per-layer schedules of `glm_moe_dsa` as transformers 5.24's
//! `GlmMoeDsaConfig` derives them: which layers run their own DSA indexer
//! (GLM-5.2's IndexShare) and which have a routed-expert MLP.
//!
//! Indexer schedule, first source present wins:
//! 1. `indexer_types`: one `"full"` / `"shared"` per decoder layer;
//! 2. `index_topk_pattern`: a string of `F` / `S`, or a list of those
//!    letters or of `"full"` / `"shared"`;
//! 3. `index_topk_freq` / `index_skip_topk_offset`: layer `i` is full when
//!    `max(i - offset + 1, 0) % freq == 0` (freq 1 and offset 2 when only one
//!    is given; with neither, every layer is full: GLM-5 / GLM-5.1).
//!
//! A shared layer reuses the top-k of the previous full layer, so layer 0
//! must be full.

use serde_json::Value;

/// Whether a decoder layer selects its own keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexerType {
    /// Runs its own DSA indexer (has `self_attn.indexer.*` and an indexer cache).
    Full,
    /// Reuses the previous full layer's top-k (no indexer tensors, no cache).
    Shared,
}

/// The config keys that define the indexer schedule (any of them present
/// marks a GLM-5.2-schema config).
#[derive(Debug, Default)]
pub(super) struct IndexerKeys<'a> {
    pub indexer_types: Option<&'a [String]>,
    pub pattern: Option<&'a Value>,
    pub freq: Option<i64>,
    pub offset: Option<i64>,
}

impl IndexerKeys<'_> {
    /// Whether the config carries any IndexShare key.
    pub fn any(&self) -> bool {
        self.indexer_types.is_some()
            || self.pattern.is_some()
            || self.freq.is_some()
            || self.offset.is_some()
    }
}

fn entry(key: &str, index: usize, value: &str) -> Result<IndexerType, String> {
    match value {
        "full" => Ok(IndexerType::Full),
        "shared" => Ok(IndexerType::Shared),
        other => Err(format!(
            "{key}[{index}] is `{other}`: expected \"full\" or \"shared\""
        )),
    }
}

fn letter(key: &str, index: usize, c: char) -> Result<IndexerType, String> {
    match c {
        'F' => Ok(IndexerType::Full),
        'S' => Ok(IndexerType::Shared),
        other => Err(format!(
            "{key}[{index}] is `{other}`: the pattern holds only `F` (full) and `S` (shared)"
        )),
    }
}

fn check_length(key: &str, got: usize, layers: usize) -> Result<(), String> {
    if got != layers {
        return Err(format!(
            "{key} has {got} entries, expected {layers} (num_hidden_layers)"
        ));
    }
    Ok(())
}

/// The indexer type of every decoder layer (`layers` of them).
pub(super) fn indexer_schedule(
    keys: &IndexerKeys<'_>,
    layers: usize,
) -> Result<Vec<IndexerType>, String> {
    let schedule = if let Some(types) = keys.indexer_types {
        check_length("indexer_types", types.len(), layers)?;
        types
            .iter()
            .enumerate()
            .map(|(i, t)| entry("indexer_types", i, t))
            .collect::<Result<Vec<_>, _>>()?
    } else if let Some(pattern) = keys.pattern {
        const KEY: &str = "index_topk_pattern";
        let parsed = match pattern {
            Value::String(s) => s
                .chars()
                .enumerate()
                .map(|(i, c)| letter(KEY, i, c))
                .collect::<Result<Vec<_>, _>>()?,
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, v)| match v.as_str() {
                    Some(s) if s.chars().count() == 1 => {
                        letter(KEY, i, s.chars().next().unwrap_or(' '))
                    }
                    Some(s) => entry(KEY, i, s),
                    None => Err(format!("{KEY}[{i}] is {v}: expected a string")),
                })
                .collect::<Result<Vec<_>, _>>()?,
            other => {
                return Err(format!(
                    "{KEY} must be a string of F/S or a list, got {other}"
                ))
            }
        };
        check_length(KEY, parsed.len(), layers)?;
        parsed
    } else {
        // transformers' defaults when only one of the two keys is given.
        let freq = keys.freq.unwrap_or(1).max(1);
        let offset = keys.offset.unwrap_or(2);
        (0..layers as i64)
            .map(|i| {
                if (i - offset + 1).max(0) % freq == 0 {
                    IndexerType::Full
                } else {
                    IndexerType::Shared
                }
            })
            .collect()
    };
    if schedule.first() == Some(&IndexerType::Shared) {
        return Err(
            "layer 0 is \"shared\" in the indexer schedule, but a shared layer reuses the top-k \
             of an earlier full layer and none precedes it"
                .into(),
        );
    }
    Ok(schedule)
}

/// `mlp_layer_types`: `true` for a `"sparse"` (routed-expert) layer.
pub(super) fn mlp_schedule(
    types: &[String],
    layers: usize,
    has_experts: bool,
) -> Result<Vec<bool>, String> {
    check_length("mlp_layer_types", types.len(), layers)?;
    types
        .iter()
        .enumerate()
        .map(|(i, t)| match t.as_str() {
            "dense" => Ok(false),
            "sparse" if has_experts => Ok(true),
            "sparse" => Err(format!(
                "mlp_layer_types[{i}] is \"sparse\" but the config has no routed experts (n_routed_experts)"
            )),
            other => Err(format!(
                "mlp_layer_types[{i}] is `{other}`: expected \"dense\" or \"sparse\""
            )),
        })
        .collect()
}

/// `layer_types`: every layer is DSA attention, named `indexed_attention`
/// (transformers) or `deepseek_sparse_attention` (the NVFP4 release).
pub(super) fn check_layer_types(types: &[String], layers: usize) -> Result<(), String> {
    check_length("layer_types", types.len(), layers)?;
    match types.iter().enumerate().find(|(_, t)| {
        !matches!(
            t.as_str(),
            "indexed_attention" | "deepseek_sparse_attention"
        )
    }) {
        Some((i, t)) => Err(format!(
            "layer_types[{i}] is `{t}`: only DSA attention (\"indexed_attention\", \
             \"deepseek_sparse_attention\") is supported"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn full_layers(s: &[IndexerType]) -> Vec<usize> {
        s.iter()
            .enumerate()
            .filter(|(_, t)| **t == IndexerType::Full)
            .map(|(i, _)| i)
            .collect()
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn no_key_means_every_layer_full() {
        let s = indexer_schedule(&IndexerKeys::default(), 5).expect("schedule");
        assert_eq!(full_layers(&s), [0, 1, 2, 3, 4]);
        assert!(!IndexerKeys::default().any());
    }

    #[test]
    fn freq_and_offset_follow_the_reference_rule() {
        let keys = IndexerKeys {
            freq: Some(4),
            offset: Some(3),
            ..IndexerKeys::default()
        };
        let s = indexer_schedule(&keys, 78).expect("schedule");
        let mut expected = vec![0, 1, 2];
        expected.extend((6..78).step_by(4));
        assert_eq!(full_layers(&s), expected);
        assert_eq!(full_layers(&s).len(), 21);
        // Only one key given: the other takes transformers' default.
        let freq_only = IndexerKeys {
            freq: Some(2),
            ..IndexerKeys::default()
        };
        assert_eq!(
            full_layers(&indexer_schedule(&freq_only, 6).expect("freq")),
            [0, 1, 3, 5],
            "offset 2: max(i - 1, 0) even"
        );
        let offset_only = IndexerKeys {
            offset: Some(3),
            ..IndexerKeys::default()
        };
        assert_eq!(
            full_layers(&indexer_schedule(&offset_only, 4).expect("offset")),
            [0, 1, 2, 3],
            "freq 1: every layer"
        );
    }

    #[test]
    fn pattern_strings_and_lists() {
        let pattern = json!("FFSFS");
        let keys = IndexerKeys {
            pattern: Some(&pattern),
            freq: Some(4),
            ..IndexerKeys::default()
        };
        assert_eq!(
            full_layers(&indexer_schedule(&keys, 5).expect("string")),
            [0, 1, 3],
            "the pattern wins over freq/offset"
        );
        let list = json!(["F", "shared", "full", "S"]);
        let keys = IndexerKeys {
            pattern: Some(&list),
            ..IndexerKeys::default()
        };
        assert_eq!(
            full_layers(&indexer_schedule(&keys, 4).expect("list")),
            [0, 2]
        );
    }

    #[test]
    fn indexer_types_win_over_every_other_key() {
        let types = strings(&["full", "shared", "shared", "full"]);
        let pattern = json!("FFFF");
        let keys = IndexerKeys {
            indexer_types: Some(&types),
            pattern: Some(&pattern),
            freq: Some(1),
            offset: Some(0),
        };
        assert_eq!(
            full_layers(&indexer_schedule(&keys, 4).expect("types")),
            [0, 3]
        );
    }

    #[test]
    fn bad_schedules_name_the_key() {
        let short = strings(&["full", "shared"]);
        let unknown = strings(&["full", "sparse", "full"]);
        let shared_first = strings(&["shared", "full", "full"]);
        let bad_letter = json!("FSX");
        let short_pattern = json!("FS");
        let cases: Vec<(IndexerKeys<'_>, &[&str])> = vec![
            (
                IndexerKeys {
                    indexer_types: Some(&short),
                    ..IndexerKeys::default()
                },
                &["indexer_types", "2 entries", "expected 3"],
            ),
            (
                IndexerKeys {
                    indexer_types: Some(&unknown),
                    ..IndexerKeys::default()
                },
                &["indexer_types[1]", "sparse"],
            ),
            (
                IndexerKeys {
                    indexer_types: Some(&shared_first),
                    ..IndexerKeys::default()
                },
                &["layer 0", "shared"],
            ),
            (
                IndexerKeys {
                    pattern: Some(&bad_letter),
                    ..IndexerKeys::default()
                },
                &["index_topk_pattern[2]", "`X`"],
            ),
            (
                IndexerKeys {
                    pattern: Some(&short_pattern),
                    ..IndexerKeys::default()
                },
                &["index_topk_pattern", "2 entries", "expected 3"],
            ),
            (
                IndexerKeys {
                    freq: Some(2),
                    offset: Some(0),
                    ..IndexerKeys::default()
                },
                &["layer 0"],
            ),
        ];
        for (keys, needles) in cases {
            let err = indexer_schedule(&keys, 3).expect_err("refused");
            for n in needles {
                assert!(err.contains(n), "{n:?} not in {err:?}");
            }
        }
    }

    #[test]
    fn mlp_and_layer_types_are_checked() {
        let types = strings(&["dense", "sparse", "sparse"]);
        assert_eq!(
            mlp_schedule(&types, 3, true).expect("mlp"),
            [false, true, true]
        );
        let err = mlp_schedule(&types, 3, false).expect_err("no experts");
        assert!(err.contains("mlp_layer_types[1]"), "{err}");
        let err = mlp_schedule(&types, 4, true).expect_err("length");
        assert!(err.contains("expected 4"), "{err}");
        let err = mlp_schedule(&strings(&["dense", "moe", "dense"]), 3, true).expect_err("entry");
        assert!(err.contains("`moe`"), "{err}");
        check_layer_types(
            &strings(&["indexed_attention", "deepseek_sparse_attention"]),
            2,
        )
        .expect("both names");
        let err = check_layer_types(&strings(&["full_attention"]), 1).expect_err("entry");
        assert!(err.contains("layer_types[0]"), "{err}");
    }
}
