//! The draft providers this binary links. A provider crate registers itself
//! through `inventory` only if it is linked, so each is named here once; the
//! test below pins the exact set, so a provider that silently failed to
//! register breaks the build's tests, not a user's request.

use draft_deepspec as _;
use draft_gemma4_assistant as _;
use draft_glm52_mtp as _;
use draft_model as _;
use draft_prompt_lookup as _;
use draft_suffix as _;

/// Prints `id  description` for every registered provider.
pub fn print() {
    for r in spec_core::registrations() {
        println!("{:<20} {}", r.id, r.description);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn exactly_our_providers_are_registered() {
        let ids: Vec<&str> = spec_core::registrations().iter().map(|r| r.id).collect();
        assert_eq!(
            ids,
            [
                "deepspec",
                "draft-model",
                "gemma4-assistant",
                "glm52-native-mtp",
                "prompt-lookup",
                "suffix"
            ]
        );
    }
}
