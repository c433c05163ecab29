//! Server metrics, rendered in Prometheus' text format at `GET /metrics`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use serve_loop::EngineStats;
use spec_core::SpecStats;
use spec_models::glm::MtpExpertTier;
use spec_runtime::experts::{ExpertStats, ExpertStore};

/// The `tier` label of the streamed routed experts' series.
const ROUTED: &str = "routed";
/// The `tier` label of the MTP row's 8-bit experts' series.
const MTP: &str = "mtp";

/// A counter kept per provider: its name, help and value.
type Total = (&'static str, &'static str, fn(&PerProvider) -> u64);

#[derive(Debug, Default)]
struct PerProvider {
    requests: u64,
    drafted: u64,
    accepted: u64,
    /// Drafts made ahead that the goodput policy left out of the window.
    cut: u64,
    drafted_by_pos: Vec<u64>,
    accepted_by_pos: Vec<u64>,
}

/// Counters shared by the handlers and the engine thread.
#[derive(Debug, Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub rejected_busy: AtomicU64,
    pub bad_requests: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub in_flight: AtomicU64,
    pub disconnects: AtomicU64,
    /// Bytes of the target model's weights (`Target::weights_bytes`), set once loaded.
    pub model_weights_bytes: AtomicU64,
    /// Requests with a constraint (`response_format`), and their tokens.
    constrained_requests: AtomicU64,
    constrained_tokens: AtomicU64,
    /// Their constraints' masks; the microseconds the grammar engine took
    /// (masks, draft checks, forced tokens), and those applying the masks
    /// to the logits.
    constraint_masks: AtomicU64,
    grammar_micros: AtomicU64,
    mask_apply_micros: AtomicU64,
    /// Drafts the constraints forced, and those accepted.
    forced_drafted: AtomicU64,
    forced_accepted: AtomicU64,
    providers: Mutex<BTreeMap<String, PerProvider>>,
    /// The target's streamed-expert tier (`--expert-cache-bytes`).
    experts: OnceLock<Arc<ExpertStore>>,
    /// The MTP row's 8-bit expert tier (`--mtp-expert-bits`).
    mtp_experts: OnceLock<MtpExpertTier>,
}

impl Metrics {
    /// Reports the target's expert tiers from now on: the streamed one
    /// (`tier="routed"`) and the MTP row's (`tier="mtp"`).
    pub fn set_experts(&self, store: Option<Arc<ExpertStore>>, mtp: Option<MtpExpertTier>) {
        if let Some(store) = store {
            let _ = self.experts.set(store);
        }
        if let Some(mtp) = mtp {
            let _ = self.mtp_experts.set(mtp);
        }
    }

    /// The expert tiers' series, one per tier present (`tier` label). The
    /// MTP row's tier is never evicted nor read after the load: it has
    /// resident bytes and bits, no traffic counters.
    fn render_experts(&self, out: &mut String) {
        let routed = self.experts.get().map(|store| store.stats());
        let mtp = self.mtp_experts.get();
        let mut series = |name: &str, help: &str, kind: &str, values: &[(&str, Option<String>)]| {
            if values.iter().all(|(_, v)| v.is_none()) {
                return;
            }
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (tier, value) in values {
                if let Some(value) = value {
                    let _ = writeln!(out, "{name}{{tier=\"{tier}\"}} {value}");
                }
            }
        };
        let routed_only = |f: fn(&ExpertStats) -> String| [(ROUTED, routed.as_ref().map(f))];
        series(
            "mlx_spec_expert_hits_total",
            "Streamed experts a forward found resident.",
            "counter",
            &routed_only(|e| e.hits.to_string()),
        );
        series(
            "mlx_spec_expert_misses_total",
            "Streamed experts read from disk.",
            "counter",
            &routed_only(|e| e.misses.to_string()),
        );
        series(
            "mlx_spec_expert_read_bytes_total",
            "Bytes of streamed experts read from disk.",
            "counter",
            &routed_only(|e| e.bytes_read.to_string()),
        );
        series(
            "mlx_spec_expert_read_seconds_total",
            "Seconds spent reading streamed experts.",
            "counter",
            &routed_only(|e| e.read_seconds.to_string()),
        );
        series(
            "mlx_spec_expert_wait_seconds_total",
            "Seconds forwards waited for expert reads after dispatching what they could.",
            "counter",
            &routed_only(|e| e.wait_seconds.to_string()),
        );
        series(
            "mlx_spec_expert_tier_bytes",
            "The streamed-expert tier's budget (--expert-cache-bytes).",
            "gauge",
            &routed_only(|e| e.capacity_bytes.to_string()),
        );
        series(
            "mlx_spec_expert_resident_bytes",
            "Bytes of experts resident, per tier (routed: the streamed tier; mtp: the MTP row's, --mtp-expert-bits).",
            "gauge",
            &[
                (ROUTED, routed.map(|e| e.resident_bytes.to_string())),
                (MTP, mtp.map(|t| t.resident_bytes.to_string())),
            ],
        );
        series(
            "mlx_spec_expert_bits",
            "Bits per weight of a tier's experts (mtp: --mtp-expert-bits).",
            "gauge",
            &[(MTP, mtp.map(|t| t.bits.to_string()))],
        );
    }

    pub fn record_speculation(&self, provider: &str, stats: &SpecStats) {
        let mut all = self.providers.lock();
        let p = all.entry(provider.to_owned()).or_default();
        p.requests += 1;
        p.drafted += stats.drafted as u64;
        p.accepted += stats.accepted as u64;
        p.cut += stats.cut_drafts as u64;
        for (into, from) in [
            (&mut p.drafted_by_pos, &stats.drafted_by_pos),
            (&mut p.accepted_by_pos, &stats.accepted_by_pos),
        ] {
            if into.len() < from.len() {
                into.resize(from.len(), 0);
            }
            for (i, v) in from.iter().enumerate() {
                into[i] += *v as u64;
            }
        }
    }

    /// Counts a constrained request's work (its stats, `tokens` emitted).
    pub fn record_constraint(&self, stats: &SpecStats, tokens: usize) {
        let add = |a: &AtomicU64, v: u64| a.fetch_add(v, Ordering::Relaxed);
        add(&self.constrained_requests, 1);
        add(&self.constrained_tokens, tokens as u64);
        add(&self.constraint_masks, stats.masks as u64);
        add(&self.grammar_micros, (stats.grammar_seconds * 1e6) as u64);
        add(
            &self.mask_apply_micros,
            (stats.mask_apply_seconds * 1e6) as u64,
        );
        add(&self.forced_drafted, stats.forced_drafted as u64);
        add(&self.forced_accepted, stats.forced_accepted as u64);
    }

    /// The metrics in Prometheus' text format, the engine's (`engine`,
    /// `held`: requests active or queued) included.
    pub fn render(&self, engine: &EngineStats, held: usize) -> String {
        let mut out = render_engine(engine, held);
        let mut counter = |name: &str, help: &str, kind: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(
            "mlx_spec_requests_total",
            "Generation requests accepted.",
            "counter",
            get(&self.requests),
        );
        counter(
            "mlx_spec_requests_rejected_busy_total",
            "Requests refused with 429.",
            "counter",
            get(&self.rejected_busy),
        );
        counter(
            "mlx_spec_requests_invalid_total",
            "Requests refused with 400.",
            "counter",
            get(&self.bad_requests),
        );
        counter(
            "mlx_spec_client_disconnects_total",
            "Requests whose client went away mid-generation.",
            "counter",
            get(&self.disconnects),
        );
        counter(
            "mlx_spec_prompt_tokens_total",
            "Prompt tokens processed.",
            "counter",
            get(&self.prompt_tokens),
        );
        counter(
            "mlx_spec_generated_tokens_total",
            "Tokens generated.",
            "counter",
            get(&self.generated_tokens),
        );
        counter(
            "mlx_spec_in_flight",
            "Requests holding a slot (queued or generating).",
            "gauge",
            get(&self.in_flight),
        );
        counter(
            "mlx_spec_model_weights_bytes",
            "Bytes of the target model's weights.",
            "gauge",
            get(&self.model_weights_bytes),
        );
        counter(
            "mlx_spec_constrained_requests_total",
            "Requests with a constraint (response_format).",
            "counter",
            get(&self.constrained_requests),
        );
        counter(
            "mlx_spec_constrained_tokens_total",
            "Tokens emitted by constrained requests.",
            "counter",
            get(&self.constrained_tokens),
        );
        counter(
            "mlx_spec_constraint_masks_total",
            "Token masks the constraints computed.",
            "counter",
            get(&self.constraint_masks),
        );
        counter(
            "mlx_spec_constraint_grammar_microseconds_total",
            "Microseconds the grammar engine (llguidance) took for constraints: masks, draft checks, forced tokens; over mlx_spec_constrained_tokens_total, its cost per token.",
            "counter",
            get(&self.grammar_micros),
        );
        counter(
            "mlx_spec_constraint_mask_apply_microseconds_total",
            "Microseconds the host took applying constraints' masks to the logits (MLX booleans and the select).",
            "counter",
            get(&self.mask_apply_micros),
        );
        counter(
            "mlx_spec_forced_drafted_total",
            "Drafts the constraints forced (verified like any draft).",
            "counter",
            get(&self.forced_drafted),
        );
        counter(
            "mlx_spec_forced_accepted_total",
            "Forced drafts accepted.",
            "counter",
            get(&self.forced_accepted),
        );
        let active = mlx_rs::memory::active_memory().unwrap_or(0) as u64;
        counter(
            "mlx_spec_mlx_active_memory_bytes",
            "MLX active memory.",
            "gauge",
            active,
        );
        self.render_experts(&mut out);
        let providers = self.providers.lock();
        let totals: [Total; 4] = [
            (
                "mlx_spec_spec_drafted_total",
                "Draft tokens proposed, per provider.",
                |p| p.drafted,
            ),
            (
                "mlx_spec_spec_accepted_total",
                "Draft tokens accepted, per provider.",
                |p| p.accepted,
            ),
            (
                "mlx_spec_spec_cut_total",
                "Draft tokens a cheap source made at full length that the goodput policy left out of the window, per provider.",
                |p| p.cut,
            ),
            (
                "mlx_spec_spec_requests_total",
                "Speculative requests, per provider.",
                |p| p.requests,
            ),
        ];
        for (name, help, value) in totals {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (id, p) in providers.iter() {
                let _ = writeln!(out, "{name}{{provider=\"{id}\"}} {}", value(p));
            }
        }
        let _ = writeln!(out, "# HELP mlx_spec_spec_position_drafted_total Draft tokens proposed at each draft position.\n# TYPE mlx_spec_spec_position_drafted_total counter");
        for (id, p) in providers.iter() {
            for (i, v) in p.drafted_by_pos.iter().enumerate() {
                let _ = writeln!(out, "mlx_spec_spec_position_drafted_total{{provider=\"{id}\",position=\"{i}\"}} {v}");
            }
        }
        let _ = writeln!(out, "# HELP mlx_spec_spec_position_accepted_total Draft tokens accepted at each draft position.\n# TYPE mlx_spec_spec_position_accepted_total counter");
        for (id, p) in providers.iter() {
            for (i, v) in p.accepted_by_pos.iter().enumerate() {
                let _ = writeln!(out, "mlx_spec_spec_position_accepted_total{{provider=\"{id}\",position=\"{i}\"}} {v}");
            }
        }
        out
    }
}

/// The engine's counters: requests held, steps, rows per step (a
/// histogram), queue wait and time to first token (summaries).
fn render_engine(stats: &EngineStats, held: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP mlx_spec_engine_held Requests the engine holds (decoding or queued).\n# TYPE mlx_spec_engine_held gauge\nmlx_spec_engine_held {held}"
    );
    let _ = writeln!(
        out,
        "# HELP mlx_spec_engine_steps_total Engine steps that ran a target forward.\n# TYPE mlx_spec_engine_steps_total counter\nmlx_spec_engine_steps_total {}",
        stats.steps
    );
    let _ = writeln!(
        out,
        "# HELP mlx_spec_engine_lone_steps_total Steps of a lone plain request decoded pipelined.\n# TYPE mlx_spec_engine_lone_steps_total counter\nmlx_spec_engine_lone_steps_total {}",
        stats.lone_steps
    );
    let _ = writeln!(
        out,
        "# HELP mlx_spec_engine_pipelined_steps_total Steps of several plain requests decoded pipelined together.\n# TYPE mlx_spec_engine_pipelined_steps_total counter\nmlx_spec_engine_pipelined_steps_total {}",
        stats.pipelined_steps
    );
    let name = "mlx_spec_rows_per_step";
    let _ = writeln!(
        out,
        "# HELP {name} Requests sharing each step's target forward.\n# TYPE {name} histogram"
    );
    let mut cumulative = 0u64;
    let mut sum = 0u64;
    for (rows, steps) in stats.rows_per_step.iter().enumerate().skip(1) {
        cumulative += steps;
        sum += rows as u64 * steps;
        let _ = writeln!(out, "{name}_bucket{{le=\"{rows}\"}} {cumulative}");
    }
    let _ = writeln!(
        out,
        "{name}_bucket{{le=\"+Inf\"}} {cumulative}\n{name}_sum {sum}\n{name}_count {cumulative}"
    );
    for (name, help, seconds, count) in [
        (
            "mlx_spec_queue_wait_seconds",
            "Seconds from submission to a request's first step.",
            stats.queue_seconds,
            stats.completed,
        ),
        (
            "mlx_spec_time_to_first_token_seconds",
            "Seconds from submission to a request's first token.",
            stats.first_token_seconds,
            stats.first_tokens,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} summary\n{name}_sum {seconds}\n{name}_count {count}"
        );
    }
    let cache = &stats.prefix_cache;
    for (name, kind, help, value) in [
        (
            "mlx_spec_prefix_cache_hits_total",
            "counter",
            "Requests that reused a cached prompt prefix.",
            cache.hits,
        ),
        (
            "mlx_spec_prefix_cache_misses_total",
            "counter",
            "Requests that found no usable cached prefix.",
            cache.misses,
        ),
        (
            "mlx_spec_prefix_cache_tokens_total",
            "counter",
            "Prompt tokens served from the prefix cache.",
            cache.cached_tokens,
        ),
        (
            "mlx_spec_prefix_cache_draft_restores_total",
            "counter",
            "Requests whose draft source started from a prefix-cache entry's saved state.",
            cache.draft_restores,
        ),
        (
            "mlx_spec_prefix_cache_evictions_total",
            "counter",
            "Prefix-cache entries dropped to stay within its bounds.",
            cache.evictions,
        ),
        (
            "mlx_spec_prefix_cache_bytes",
            "gauge",
            "Bytes the prefix cache holds.",
            cache.bytes as u64,
        ),
        (
            "mlx_spec_prefix_cache_entries",
            "gauge",
            "Entries the prefix cache holds.",
            cache.entries as u64,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
    render_step_cost(&mut out, &stats.step_cost);
    out
}

/// The step cost model the goodput policy sizes drafts with.
fn render_step_cost(out: &mut String, cost: &serve_loop::StepCostStats) {
    for (name, kind, help, value) in [
        (
            "mlx_spec_step_cost_base_seconds",
            "gauge",
            "Fitted seconds of a batched step beyond its rows and tokens (0 until fitted).",
            cost.base_seconds,
        ),
        (
            "mlx_spec_step_cost_per_row_seconds",
            "gauge",
            "Fitted seconds per row of a batched step (0 until fitted).",
            cost.per_row_seconds,
        ),
        (
            "mlx_spec_step_cost_per_token_seconds",
            "gauge",
            "Fitted seconds per token of a batched step (0 until fitted).",
            cost.per_token_seconds,
        ),
        (
            "mlx_spec_step_cost_samples_total",
            "counter",
            "Step timings the cost model learned from.",
            cost.samples as f64,
        ),
        (
            "mlx_spec_step_cost_rejected_total",
            "counter",
            "Step timings the cost model rejected as outliers.",
            cost.rejected as f64,
        ),
        (
            "mlx_spec_step_cost_restarts_total",
            "counter",
            "Times the cost model started over after a run of outliers.",
            cost.restarts as f64,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_per_position_series() {
        let m = Metrics::default();
        m.requests.fetch_add(2, Ordering::Relaxed);
        m.model_weights_bytes.store(538_000_000, Ordering::Relaxed);
        let stats = SpecStats {
            drafted: 5,
            accepted: 3,
            cut_drafts: 4,
            drafted_by_pos: vec![3, 2],
            accepted_by_pos: vec![2, 1],
            ..SpecStats::default()
        };
        m.record_speculation("prompt-lookup", &stats);
        m.record_speculation("prompt-lookup", &stats);
        let engine = EngineStats {
            steps: 5,
            lone_steps: 1,
            pipelined_steps: 2,
            rows_per_step: vec![0, 2, 0, 3],
            completed: 4,
            queue_seconds: 0.5,
            first_token_seconds: 1.25,
            first_tokens: 4,
            step_cost: serve_loop::StepCostStats {
                base_seconds: 0.25,
                per_row_seconds: 0.125,
                per_token_seconds: 0.5,
                samples: 40,
                rejected: 2,
                restarts: 0,
                ready: true,
            },
            ..EngineStats::default()
        };
        let text = m.render(&engine, 3);
        for line in [
            "mlx_spec_engine_held 3",
            "mlx_spec_engine_steps_total 5",
            "mlx_spec_engine_lone_steps_total 1",
            "mlx_spec_engine_pipelined_steps_total 2",
            "mlx_spec_rows_per_step_bucket{le=\"1\"} 2",
            "mlx_spec_rows_per_step_bucket{le=\"2\"} 2",
            "mlx_spec_rows_per_step_bucket{le=\"3\"} 5",
            "mlx_spec_rows_per_step_bucket{le=\"+Inf\"} 5",
            "mlx_spec_rows_per_step_sum 11",
            "mlx_spec_rows_per_step_count 5",
            "mlx_spec_queue_wait_seconds_sum 0.5",
            "mlx_spec_queue_wait_seconds_count 4",
            "mlx_spec_time_to_first_token_seconds_sum 1.25",
            "mlx_spec_requests_total 2",
            "mlx_spec_step_cost_base_seconds 0.25",
            "mlx_spec_step_cost_per_row_seconds 0.125",
            "mlx_spec_step_cost_per_token_seconds 0.5",
            "mlx_spec_step_cost_samples_total 40",
            "mlx_spec_step_cost_rejected_total 2",
            "mlx_spec_model_weights_bytes 538000000",
            "mlx_spec_spec_drafted_total{provider=\"prompt-lookup\"} 10",
            "mlx_spec_spec_accepted_total{provider=\"prompt-lookup\"} 6",
            "mlx_spec_spec_cut_total{provider=\"prompt-lookup\"} 8",
            "mlx_spec_spec_position_accepted_total{provider=\"prompt-lookup\",position=\"1\"} 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in\n{text}"
            );
        }
    }
}

#[cfg(test)]
mod expert_tests {
    use super::*;
    use spec_core::Target;

    /// A streamed target's tiers are rendered once set, each its own series
    /// (`tier="routed"`, `tier="mtp"`); a resident one adds nothing.
    #[test]
    fn renders_the_routed_and_mtp_expert_tiers() {
        let dir = tempfile::tempdir().expect("tempdir");
        spec_fixtures::glm::Glm::default()
            .write(dir.path())
            .expect("checkpoint");
        let options = spec_models::LoadOptions {
            expert_cache_bytes: Some(1 << 20),
            mtp_expert_bits: Some(8),
            ..spec_models::LoadOptions::default()
        };
        let model = spec_models::load_model(dir.path(), &options).expect("streamed");
        let mut caches = model.make_caches();
        let ids = mlx_rs::Array::from_slice(&[1u32, 2, 3], &[1, 3]);
        let out = model.forward(&ids, &mut caches, &[]).expect("forward");
        out.hidden.eval().expect("eval");
        let m = Metrics::default();
        let engine = EngineStats::default();
        m.set_experts(None, None);
        assert!(!m.render(&engine, 0).contains("mlx_spec_expert_"));
        let mtp = spec_models::mtp_expert_tier(model.as_ref()).expect("the MTP tier");
        m.set_experts(spec_models::expert_store(model.as_ref()), Some(mtp));
        let text = m.render(&engine, 0);
        let value = |series: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{series} ")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{series} missing:\n{text}"))
        };
        let routed = |name: &str| value(&format!("{name}{{tier=\"routed\"}}"));
        assert!(routed("mlx_spec_expert_misses_total") > 0.0);
        assert!(routed("mlx_spec_expert_read_bytes_total") > 0.0);
        assert!(routed("mlx_spec_expert_resident_bytes") > 0.0);
        assert_eq!(routed("mlx_spec_expert_tier_bytes"), (1 << 20) as f64);
        assert!(routed("mlx_spec_expert_read_seconds_total") > 0.0);
        assert!(routed("mlx_spec_expert_wait_seconds_total") > 0.0);
        assert_eq!(routed("mlx_spec_expert_hits_total"), 0.0);
        let mtp_series = |name: &str| value(&format!("{name}{{tier=\"mtp\"}}"));
        assert_eq!(mtp.bits, 8);
        assert!(mtp.resident_bytes > 0);
        assert_eq!(
            mtp_series("mlx_spec_expert_resident_bytes"),
            mtp.resident_bytes as f64
        );
        assert_eq!(mtp_series("mlx_spec_expert_bits"), 8.0);
        // Its experts never stream: no traffic series of its own.
        assert!(!text
            .lines()
            .any(|l| l.contains("tier=\"mtp\"") && l.contains("_total")));
        // One HELP line per metric, whatever the tiers.
        assert_eq!(
            text.matches("# HELP mlx_spec_expert_resident_bytes ")
                .count(),
            1
        );
    }

    /// The MTP row's tier without streamed experts: its series alone.
    #[test]
    fn renders_the_mtp_tier_of_a_resident_target() {
        let dir = tempfile::tempdir().expect("tempdir");
        spec_fixtures::glm::Glm::default()
            .write(dir.path())
            .expect("checkpoint");
        let options = spec_models::LoadOptions {
            mtp_expert_bits: Some(8),
            ..spec_models::LoadOptions::default()
        };
        let model = spec_models::load_model(dir.path(), &options).expect("resident");
        let m = Metrics::default();
        m.set_experts(
            spec_models::expert_store(model.as_ref()),
            spec_models::mtp_expert_tier(model.as_ref()),
        );
        let text = m.render(&EngineStats::default(), 0);
        assert!(
            text.contains("mlx_spec_expert_bits{tier=\"mtp\"} 8\n"),
            "{text}"
        );
        assert!(!text.contains("tier=\"routed\""), "{text}");
        let plain = spec_models::load_model(dir.path(), &spec_models::LoadOptions::default())
            .expect("resident");
        assert!(spec_models::mtp_expert_tier(plain.as_ref()).is_none());
    }
}
