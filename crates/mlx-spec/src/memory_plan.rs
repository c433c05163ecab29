//! Which dtype each model of a run loads in when its user chose none: the
//! target first, then each drafter that reads files of its own, float32
//! (the CPU's fast path) while the weights planned so far fit the memory
//! available (`spec_models::footprint::default_policy`), the file's own
//! dtypes and quantization past that, said on standard error. Weights
//! larger than the memory available are warned of.

use std::path::Path;

use spec_core::{ProviderOptions, DTYPE_CHOICES};
use spec_models::footprint::{self, Footprint, FLOAT32_SHARE};
use spec_models::DtypePolicy;

use crate::load_args::LoadArgs;

/// The memory of one run and the weights planned in it.
#[derive(Debug)]
pub struct MemoryPlan {
    available: Option<u64>,
    /// Bytes of the weights planned so far.
    resident: u64,
}

impl MemoryPlan {
    /// A plan against the memory this process can take now
    /// (`spec_runtime::host_memory`).
    pub fn new() -> Self {
        Self::with_available(spec_runtime::host_memory::available_memory())
    }

    fn with_available(available: Option<u64>) -> Self {
        Self {
            available,
            resident: 0,
        }
    }

    /// The target's policy: the file's own with `--keep-dtype`, else the
    /// default. A pipeline (every rank must choose alike, and holds a slice
    /// of the weights) and streamed experts (most weights stay on disk) are
    /// not planned: float32 unless told.
    pub fn target(
        &mut self,
        path: &Path,
        keep_dtype: bool,
        pipeline: bool,
        load: &LoadArgs,
    ) -> DtypePolicy {
        let asked = keep_dtype.then_some(DtypePolicy::Keep);
        if pipeline || load.expert_cache_bytes.is_some() {
            return asked.unwrap_or(DtypePolicy::Float32);
        }
        self.choose(path, asked, "--keep-dtype chooses this outright")
            .unwrap_or(asked.unwrap_or(DtypePolicy::Float32))
    }

    /// A drafter's options: where they name its files (`model`) and no
    /// `dtype`, `dtype=keep` when its float32 copy does not fit beside the
    /// weights planned (its provider's default, float32, otherwise).
    pub fn drafter(&mut self, provider: &str, options: &mut ProviderOptions) {
        let Some(model) = options.get("model").map(std::path::PathBuf::from) else {
            return;
        };
        let asked = match options.get("dtype") {
            Some(v) => match DTYPE_CHOICES.iter().find(|(name, _)| *name == v) {
                Some(&(_, policy)) => Some(policy),
                // An unknown value is the provider's to refuse.
                None => return,
            },
            None => None,
        };
        let hint = format!("--draft-option {provider}:dtype=keep chooses this outright");
        if self.choose(&model, asked, &hint) == Some(DtypePolicy::Keep) && asked.is_none() {
            options.insert("dtype".into(), "keep".into());
        }
    }

    /// The policy of the model at `path` (`asked`, else the default), with
    /// its weights added to the plan; `None` where its headers cannot be
    /// read: its loader names the problem.
    fn choose(
        &mut self,
        path: &Path,
        asked: Option<DtypePolicy>,
        hint: &str,
    ) -> Option<DtypePolicy> {
        let print: Footprint = match footprint::footprint(path) {
            Ok(print) => print,
            Err(e) => {
                tracing::debug!(error = %e, "no footprint: the loader will say");
                return None;
            }
        };
        let policy = asked
            .unwrap_or_else(|| footprint::default_policy(&print, self.resident, self.available));
        self.resident += print.bytes(policy);
        let gb = |bytes: u64| bytes as f64 / 1e9;
        if let Some(a) = self.available {
            if asked.is_none() && policy == DtypePolicy::Keep {
                eprintln!(
                    "note: {} as float32 would take {:.1} GB, past {:.0}% of the {:.1} GB of memory available with what is loaded before it: running its weights as stored ({:.1} GB; {hint})",
                    path.display(),
                    gb(print.float32),
                    100.0 * FLOAT32_SHARE,
                    gb(a),
                    gb(print.stored),
                );
            }
            if self.resident > a {
                eprintln!(
                    "warning: with {} the weights take {:.1} GB and only {:.1} GB of memory is available: expect swapping, or the system's out-of-memory killer",
                    path.display(),
                    gb(self.resident),
                    gb(a),
                );
            }
        }
        Some(policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spec_fixtures::llama::Llama;

    fn fixture() -> (tempfile::TempDir, Footprint) {
        let tmp = tempfile::tempdir().expect("tempdir");
        Llama::tiny(1).write(tmp.path()).expect("fixture");
        let print = footprint::footprint(tmp.path()).expect("footprint");
        (tmp, print)
    }

    #[test]
    fn target_follows_the_flag_then_the_memory() {
        let (tmp, print) = fixture();
        let none = LoadArgs::default();
        let mut roomy = MemoryPlan::with_available(Some(print.float32 * 2));
        assert_eq!(
            roomy.target(tmp.path(), false, false, &none),
            DtypePolicy::Float32
        );
        let mut tight = MemoryPlan::with_available(Some(print.float32));
        assert_eq!(
            tight.target(tmp.path(), false, false, &none),
            DtypePolicy::Keep
        );
        assert_eq!(tight.resident, print.stored);
        let mut tight = MemoryPlan::with_available(Some(print.float32));
        assert_eq!(
            tight.target(tmp.path(), true, false, &none),
            DtypePolicy::Keep
        );
        // A pipeline's ranks all run float32 unless told, unplanned; so do
        // streamed experts.
        let mut tight = MemoryPlan::with_available(Some(print.float32));
        assert_eq!(
            tight.target(tmp.path(), false, true, &none),
            DtypePolicy::Float32
        );
        let streamed = LoadArgs {
            expert_cache_bytes: Some(1 << 20),
            ..LoadArgs::default()
        };
        assert_eq!(
            tight.target(tmp.path(), true, false, &streamed),
            DtypePolicy::Keep
        );
        assert_eq!(tight.resident, 0, "nothing planned");
        let mut unknown = MemoryPlan::with_available(None);
        assert_eq!(
            unknown.target(tmp.path(), false, false, &none),
            DtypePolicy::Float32
        );
        // What the footprint cannot read is left to the loader to name.
        let missing = tmp.path().join("missing");
        let mut tight = MemoryPlan::with_available(Some(1));
        assert_eq!(
            tight.target(&missing, false, false, &none),
            DtypePolicy::Float32
        );
        assert_eq!(
            tight.target(&missing, true, false, &none),
            DtypePolicy::Keep
        );
    }

    #[test]
    fn a_drafter_keeps_its_dtype_when_the_target_took_the_room() {
        let (tmp, print) = fixture();
        let none = LoadArgs::default();
        let model = tmp.path().to_string_lossy().into_owned();
        // Room for one float32 copy: the target's.
        let mut plan = MemoryPlan::with_available(Some(print.float32 * 3 / 2));
        assert_eq!(
            plan.target(tmp.path(), false, false, &none),
            DtypePolicy::Float32
        );
        let mut options = ProviderOptions::from([("model", model.as_str())]);
        plan.drafter("draft-model", &mut options);
        assert_eq!(options.get("dtype"), Some("keep"));
        // A dtype the user set stays; options without files get none.
        let mut options = ProviderOptions::from([("model", model.as_str()), ("dtype", "f32")]);
        plan.drafter("draft-model", &mut options);
        assert_eq!(options.get("dtype"), Some("f32"));
        let mut lookup = ProviderOptions::from([("max_ngram", "3")]);
        plan.drafter("prompt-lookup", &mut lookup);
        assert!(lookup.get("dtype").is_none());
        // With room, the provider's default stands.
        let mut plan = MemoryPlan::with_available(Some(print.float32 * 4));
        plan.target(tmp.path(), false, false, &none);
        let mut options = ProviderOptions::from([("model", model.as_str())]);
        plan.drafter("draft-model", &mut options);
        assert!(options.get("dtype").is_none());
    }
}
