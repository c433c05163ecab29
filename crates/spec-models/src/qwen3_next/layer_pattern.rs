//! The hybrid layer pattern as a config states it: mlx-lm 0.32.2 reads
//! `full_attention_interval` (default 4: layer `i` is full attention when
//! `(i + 1)` is a multiple of it); transformers 5.24 reads `layer_types`
//! and, saving a config, writes only that list. A checkpoint saved by
//! transformers with another interval than 4 would run as the wrong model
//! if `layer_types` were ignored, and one whose two keys disagree is
//! ambiguous: both cases are settled here.

use std::path::Path;

use crate::ModelError;

const LINEAR: &str = "linear_attention";
const FULL: &str = "full_attention";

/// The interval the config describes: `full_attention_interval` when given
/// (a `layer_types` beside it must agree), else the one `layer_types`
/// follows, else mlx-lm's default of 4.
pub(super) fn interval(
    layer_types: Option<&[String]>,
    full_attention_interval: Option<usize>,
    layers: usize,
    path: &Path,
) -> Result<usize, ModelError> {
    let bad = |message: String| ModelError::Config {
        path: path.to_path_buf(),
        message,
    };
    let Some(types) = layer_types else {
        return Ok(full_attention_interval.unwrap_or(4));
    };
    if types.len() != layers {
        return Err(bad(format!(
            "layer_types lists {} layers, num_hidden_layers is {layers}",
            types.len()
        )));
    }
    if let Some((i, t)) = types
        .iter()
        .enumerate()
        .find(|(_, t)| *t != LINEAR && *t != FULL)
    {
        return Err(bad(format!(
            "layer_types[{i}] is {t:?}: expected {LINEAR:?} or {FULL:?}"
        )));
    }
    let first_full = types.iter().position(|t| t == FULL);
    let interval = match (full_attention_interval, first_full) {
        (Some(n), _) => n,
        (None, Some(i)) => i + 1,
        // No full layer within the stack: any interval past it says so.
        (None, None) => layers + 1,
    };
    if interval == 0 {
        return Err(bad(
            "full_attention_interval must be positive (every n-th layer is full attention)".into(),
        ));
    }
    if let Some(i) = (0..layers).find(|&i| (types[i] == FULL) != ((i + 1) % interval == 0)) {
        return Err(bad(format!(
            "layer_types[{i}] is {:?}, but every {interval}-th layer is full attention here{}",
            types[i],
            if full_attention_interval.is_some() {
                " (full_attention_interval)"
            } else {
                " (the first full_attention layer's position)"
            }
        )));
    }
    Ok(interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn types(s: &str) -> Vec<String> {
        s.chars()
            .map(|c| if c == 'F' { FULL } else { LINEAR }.to_owned())
            .collect()
    }

    fn check(t: Option<&str>, n: Option<usize>, expected: Result<usize, &str>) {
        let t = t.map(types);
        let layers = t.as_ref().map_or(4, Vec::len);
        let got = interval(t.as_deref(), n, layers, Path::new("config.json"));
        match (got, expected) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{t:?} {n:?}"),
            (Err(e), Err(needle)) => assert!(e.to_string().contains(needle), "{e}"),
            (got, expected) => panic!("{t:?} {n:?}: {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn the_interval_comes_from_either_key_and_disagreement_is_named() {
        check(None, None, Ok(4));
        check(None, Some(3), Ok(3));
        check(Some("LFLF"), None, Ok(2));
        check(Some("LLFLLF"), None, Ok(3));
        check(Some("LLLFLLLF"), Some(4), Ok(4));
        check(Some("LLL"), None, Ok(4));
        check(Some("LFLF"), Some(4), Err("layer_types[1]"));
        check(Some("LLFLFL"), None, Err("layer_types[4]"));
        check(Some("LFLL"), None, Err("layer_types[3]"));
        check(Some("LFLF"), Some(0), Err("full_attention_interval"));
        let odd = vec![LINEAR.to_owned(), "sliding_attention".to_owned()];
        let e = interval(Some(&odd), None, 2, Path::new("c")).err();
        assert!(e.is_some_and(|e| e.to_string().contains("sliding_attention")));
        let e = interval(Some(&types("LF")), None, 4, Path::new("c")).err();
        assert!(e.is_some_and(|e| e.to_string().contains("num_hidden_layers")));
    }
}
