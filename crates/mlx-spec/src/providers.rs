//! The draft providers this binary links. A provider crate registers itself
//! through `inventory` only if it is linked, so each is named here once; the
//! test below pins the exact set (`run_protocol::providers::ALL`, the list
//! the gates run), so a provider that silently failed to register breaks the
//! build's tests, not a user's request.

use draft_deepspec as _;
use draft_dflash as _;
use draft_eagle3 as _;
use draft_gemma4_assistant as _;
use draft_glm52_mtp as _;
use draft_model as _;
use draft_prompt_lookup as _;
use draft_qwen3_mtp as _;
use draft_suffix as _;

/// Prints `id  description` for every registered provider, and under it
/// the options a request may set (every other option is the operator's,
/// `--draft-option`).
pub fn print() {
    for r in spec_core::registrations() {
        println!("{:<20} {}", r.id, r.description);
        for o in r.request_options {
            println!(
                "{:<20}   request option `{}`: {}",
                "",
                o.key,
                o.range.describe()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    /// The list is `run_protocol::providers::ALL`, which the gates run.
    #[test]
    fn exactly_our_providers_are_registered() {
        let ids: Vec<&str> = spec_core::registrations().iter().map(|r| r.id).collect();
        let listed: Vec<&str> = run_protocol::providers::ALL.iter().map(|p| p.id).collect();
        assert_eq!(ids, listed);
    }

    /// Only the providers whose options are cheap to rebuild and name no
    /// file let a request set any; the model-loading ones leave every
    /// option to the operator.
    #[test]
    fn request_options_are_declared_where_a_request_may_set_them() {
        let keys = |id: &str| -> Vec<&str> {
            spec_core::resolve(id)
                .expect("registered")
                .request_options
                .iter()
                .map(|o| o.key)
                .collect()
        };
        assert_eq!(
            keys("prompt-lookup"),
            ["min_ngram", "max_ngram", "num_draft"]
        );
        assert_eq!(
            keys("suffix"),
            [
                "max_spec_factor",
                "max_spec_offset",
                "min_token_prob",
                "num_draft"
            ]
        );
        for id in [
            "deepspec",
            "draft-model",
            "gemma4-assistant",
            "glm52-native-mtp",
        ] {
            assert!(keys(id).is_empty(), "{id}");
        }
    }
}
