//! The draft providers the host binary registers, written once: the gates
//! run every one of them on every gate model it applies to, and
//! `mlx-spec`'s test `exactly_our_providers_are_registered` checks that the
//! registry holds exactly these ids.

/// `deepspec` (DSpark drafter).
pub const DEEPSPEC: &str = "deepspec";
/// `dflash` (z-lab's DFlash drafter).
pub const DFLASH: &str = "dflash";
/// `draft-model` (a smaller model of the same vocabulary).
pub const DRAFT_MODEL: &str = "draft-model";
/// `eagle3` (EAGLE-3 heads).
pub const EAGLE3: &str = "eagle3";
/// `gemma4-assistant` (Gemma-4's assistant drafter).
pub const GEMMA4_ASSISTANT: &str = "gemma4-assistant";
/// `glm52-native-mtp` (GLM's own multi-token-prediction row).
pub const GLM52_NATIVE_MTP: &str = "glm52-native-mtp";
/// `prompt-lookup` (n-gram matches in the prompt).
pub const PROMPT_LOOKUP: &str = "prompt-lookup";
/// `qwen3-native-mtp` (the MTP head of Qwen3-Next / Qwen3.5 checkpoints).
pub const QWEN3_NATIVE_MTP: &str = "qwen3-native-mtp";
/// `suffix` (suffix trees over the request and earlier ones).
pub const SUFFIX: &str = "suffix";

/// A registered provider, as the gates see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Provider {
    /// Its registry id.
    pub id: &'static str,
    /// The gate models it drafts for, by name prefix (it refuses every
    /// other target by design); `None`: every model.
    pub only_on: Option<&'static str>,
    /// The gate that covers it instead of the every-provider gates
    /// (`lossless`, `batch`), where it needs a drafter made for its target.
    pub own_gate: Option<&'static str>,
}

impl Provider {
    /// Whether it can run on the gate model called `model`.
    pub fn applies(&self, model: &str) -> bool {
        self.only_on.is_none_or(|prefix| model.starts_with(prefix))
    }
}

/// Every provider the host binary registers, sorted by id.
pub const ALL: &[Provider] = &[
    Provider {
        id: DEEPSPEC,
        only_on: None,
        own_gate: Some("dspark"),
    },
    Provider {
        id: DFLASH,
        only_on: None,
        own_gate: Some("dflash"),
    },
    Provider {
        id: DRAFT_MODEL,
        only_on: None,
        own_gate: None,
    },
    Provider {
        id: EAGLE3,
        only_on: Some("eagle3"),
        own_gate: None,
    },
    Provider {
        id: GEMMA4_ASSISTANT,
        only_on: Some("gemma4"),
        own_gate: None,
    },
    Provider {
        id: GLM52_NATIVE_MTP,
        only_on: Some("glm"),
        own_gate: None,
    },
    Provider {
        id: PROMPT_LOOKUP,
        only_on: None,
        own_gate: None,
    },
    Provider {
        id: QWEN3_NATIVE_MTP,
        only_on: Some("qwen3-5"),
        own_gate: None,
    },
    Provider {
        id: SUFFIX,
        only_on: None,
        own_gate: None,
    },
];

/// The provider called `id`.
pub fn get(id: &str) -> Option<&'static Provider> {
    ALL.iter().find(|p| p.id == id)
}

/// The ids of the providers the every-provider gates run on `model`, in
/// [`ALL`]'s order.
pub fn for_model(model: &str) -> impl Iterator<Item = &'static str> + '_ {
    ALL.iter()
        .filter(move |p| p.own_gate.is_none() && p.applies(model))
        .map(|p| p.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_sorted_and_unique() {
        assert!(ALL.windows(2).all(|w| w[0].id < w[1].id));
    }

    #[test]
    fn architecture_specific_providers_run_on_their_models_only() {
        let on = |id: &str, model: &str| get(id).is_some_and(|p| p.applies(model));
        assert!(on(GLM52_NATIVE_MTP, "glm-q4g64"));
        assert!(!on(GLM52_NATIVE_MTP, "llama3"));
        assert!(!on(GLM52_NATIVE_MTP, "smollm2-135m-f32"));
        assert!(on(PROMPT_LOOKUP, "llama3") && on(DRAFT_MODEL, "glm"));
        assert!(on(QWEN3_NATIVE_MTP, "qwen3-5-moe") && !on(QWEN3_NATIVE_MTP, "qwen3-next"));
        assert_eq!(
            for_model("gemma4-text").collect::<Vec<_>>(),
            [DRAFT_MODEL, GEMMA4_ASSISTANT, PROMPT_LOOKUP, SUFFIX]
        );
    }
}
