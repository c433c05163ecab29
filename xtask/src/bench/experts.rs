//! `cargo xtask bench experts`: a synthetic GLM (the `glm_moe_dsa` schema of
//! GLM-5.2, IndexShare and the MTP row included; random float32 weights,
//! 64 experts of which each token takes 8 in one group, as GLM-5.2 takes 8
//! of 256) whose routed experts are about 50 MB, decoded with them resident
//! and streamed from disk through tiers of a quarter, an eighth and a
//! sixteenth of them: tokens/s and bytes read per emitted token and per
//! target forward, plainly, with prompt lookup, with `glm52-native-mtp`
//! (the MTP row's experts at 8 bits in every run, resident ones included,
//! so that every run drafts alike) and with `draft-model` drafting with a
//! resident copy of the target itself: every draft accepted, the bound the
//! others approach as their acceptance grows (random weights give prompt
//! lookup and the MTP row next to none). Each run is its own `spec_run`
//! process (a cold tier), the page cache dropped before it where this
//! machine allows (`posix_fadvise(DONTNEED)` on the shards through GNU dd's
//! `iflag=nocache`, else `/proc/sys/vm/drop_caches`; the output says which).
//! Every streamed run's tokens must equal the resident run's. The prompts
//! are the speculative gates' token-id prompts (half repeat a phrase).
//!
//! Two routings of the same weights: `independent` (the random router as
//! drawn: each row of a verify window picks its experts apart from the
//! others) and `shared` (each sparse layer's `e_score_correction_bias`
//! lifts 8 experts of its own so far above the rest that every token picks
//! them: the rows of a window share every pick, the limit a real model's
//! correlated picks approach). The bias only selects; the mixture weights
//! come from the router's scores as always.
//!
//! Options: `--prompts N` (default 8), `--max-tokens N` (default 64),
//! `--routing independent,shared` (default both).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use run_protocol::providers::{DRAFT_MODEL, GLM52_NATIVE_MTP, PROMPT_LOOKUP};
use run_protocol::spec::{Generation, SpecRequest, PLAIN};
use run_protocol::{Dtype, ExpertOptions};
use serde_json::{json, Value};
use spec_fixtures::glm::Glm;

use super::spec::{summarize, tps};
use crate::gate::suite;
use crate::{shell, synth, synth_glm};

/// Bump when what gets written changes.
const GENERATOR_VERSION: u32 = 2;

/// The correction bias of a `shared` layer's chosen experts: sigmoid
/// scores lie in (0, 1), so these always win.
const SHARED_BIAS: f32 = 4.0;

/// How the bench's checkpoint routes tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routing {
    /// The random router as drawn.
    Independent,
    /// Every token picks the same 8 experts of each layer.
    Shared,
}

impl Routing {
    fn name(self) -> &'static str {
        match self {
            Routing::Independent => "independent",
            Routing::Shared => "shared",
        }
    }

    fn parse(name: &str) -> Result<Self> {
        match name {
            "independent" => Ok(Routing::Independent),
            "shared" => Ok(Routing::Shared),
            other => bail!("unknown routing {other} (known: independent, shared)"),
        }
    }
}

/// The tiers, as fractions of the routed experts' bytes.
const TIER_DIVISORS: [u64; 3] = [4, 8, 16];

/// The providers compared, plain first (`draft-model` drafting with the
/// target itself).
const PROVIDERS: [&str; 4] = [PLAIN, PROMPT_LOOKUP, GLM52_NATIVE_MTP, DRAFT_MODEL];

/// The bench's target: `glm52`'s schema at wider experts.
fn spec() -> Glm {
    Glm {
        name: "bench-glm-experts",
        hidden: 256,
        moe_intermediate: 64,
        experts: 64,
        ..Glm::glm52_gate()
    }
}

/// GLM-5.2's routing (one group, 8 experts a token) over the fixture's
/// config.
fn glm_routing() -> Value {
    json!({"n_group": 1, "topk_group": 1, "num_experts_per_tok": 8})
}

/// The checkpoint directory of `routing`, written on first use.
fn ensure(routing: Routing) -> Result<PathBuf> {
    let spec = spec();
    let name = match routing {
        Routing::Independent => spec.name.to_owned(),
        Routing::Shared => format!("{}-shared", spec.name),
    };
    let dir = shell::root().join("target").join("bench-models").join(name);
    let stamp = format!(
        "bench experts generator {GENERATOR_VERSION}\n{}\n{}\n{}\n",
        spec.config(),
        glm_routing(),
        routing.name()
    );
    if !synth::is_current(&dir, &stamp) {
        eprintln!("generating {}", dir.display());
        synth::replace_dir(&dir, &stamp, |tmp| {
            spec.write(tmp)?;
            let path = tmp.join("config.json");
            let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
            if let (Some(map), Value::Object(glm)) = (config.as_object_mut(), glm_routing()) {
                map.extend(glm);
            }
            std::fs::write(&path, serde_json::to_string_pretty(&config)?)?;
            if routing == Routing::Shared {
                share_picks(tmp, spec.experts)?;
            }
            Ok(())
        })?;
    }
    Ok(dir)
}

/// Rewrites, in place, every sparse layer's `e_score_correction_bias` in
/// `dir`'s shards: [`SHARED_BIAS`] on 8 experts of the layer's own (layer
/// `i` lifts `8 i .. 8 i + 8`, modulo `experts`), zero elsewhere.
fn share_picks(dir: &Path, experts: usize) -> Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut patched = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "safetensors") {
            continue;
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let mut len = [0u8; 8];
        file.read_exact(&mut len)?;
        let data = 8 + u64::from_le_bytes(len);
        for (name, (start, end)) in synth_glm::safetensors_extents(&path)? {
            let Some(layer) = name
                .strip_prefix("model.layers.")
                .and_then(|rest| rest.strip_suffix(".mlp.gate.e_score_correction_bias"))
            else {
                continue;
            };
            let layer: usize = layer.parse().with_context(|| format!("{name}: layer"))?;
            if end - start != 4 * experts as u64 {
                bail!("{}: {name} is not {experts} float32 values", path.display());
            }
            let bytes: Vec<u8> = (0..experts)
                .flat_map(|e| {
                    let hot = (e + experts - (8 * layer) % experts) % experts < 8;
                    (if hot { SHARED_BIAS } else { 0.0 }).to_le_bytes()
                })
                .collect();
            file.seek(SeekFrom::Start(data + start))?;
            file.write_all(&bytes)?;
            patched += 1;
        }
    }
    if patched == 0 {
        bail!("{}: no e_score_correction_bias to rewrite", dir.display());
    }
    Ok(())
}

struct Options {
    prompts: usize,
    max_tokens: usize,
    routings: Vec<Routing>,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        prompts: 8,
        max_tokens: 64,
        routings: vec![Routing::Independent, Routing::Shared],
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--prompts" => o.prompts = value()?.parse().context("--prompts")?,
            "--max-tokens" => o.max_tokens = value()?.parse().context("--max-tokens")?,
            "--routing" => {
                o.routings = value()?
                    .split(',')
                    .map(Routing::parse)
                    .collect::<Result<_>>()?
            }
            other => bail!("unknown option {other} (known: --prompts, --max-tokens, --routing)"),
        }
    }
    if o.prompts == 0 || o.max_tokens == 0 || o.routings.is_empty() {
        bail!("--prompts and --max-tokens must be at least 1, --routing name one");
    }
    Ok(o)
}

/// How the page cache is dropped before each run: the shards' pages alone
/// where possible (dropping the whole cache slows whatever else runs here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CacheDrop {
    /// `posix_fadvise(POSIX_FADV_DONTNEED)` on each shard (GNU dd
    /// `iflag=nocache count=0`; unprivileged).
    Fadvise,
    /// `echo 1 > /proc/sys/vm/drop_caches` (privileged).
    DropCaches,
    /// Neither worked: reads may come from the page cache.
    Neither,
}

impl CacheDrop {
    /// The first method that works on `dir`'s shards.
    fn detect(dir: &Path) -> Self {
        for method in [Self::Fadvise, Self::DropCaches] {
            if method.apply(dir).is_ok() {
                return method;
            }
        }
        Self::Neither
    }

    fn apply(self, dir: &Path) -> Result<()> {
        match self {
            Self::DropCaches => {
                std::fs::write("/proc/sys/vm/drop_caches", "1\n")
                    .context("writing /proc/sys/vm/drop_caches")?;
            }
            Self::Fadvise => {
                for entry in std::fs::read_dir(dir)? {
                    let path = entry?.path();
                    if path.extension().is_some_and(|e| e == "safetensors") {
                        let mut input = std::ffi::OsString::from("if=");
                        input.push(&path);
                        let status = Command::new("dd")
                            .arg(input)
                            .args(["iflag=nocache", "count=0"])
                            .stdout(Stdio::null())
                            .stderr(Stdio::null())
                            .status()
                            .context("running dd")?;
                        if !status.success() {
                            bail!("dd iflag=nocache failed on {}", path.display());
                        }
                    }
                }
            }
            Self::Neither => {}
        }
        Ok(())
    }

    fn describe(self) -> &'static str {
        match self {
            Self::DropCaches => "dropped before each run (/proc/sys/vm/drop_caches)",
            Self::Fadvise => {
                "the shards' pages dropped before each run (posix_fadvise DONTNEED, via dd iflag=nocache)"
            }
            Self::Neither => {
                "NOT dropped (neither /proc/sys/vm/drop_caches nor dd iflag=nocache worked): reads may be served from memory"
            }
        }
    }
}

/// Totals of one provider's runs at one tier.
struct Row {
    tokens: usize,
    tps: f64,
    target_calls: usize,
    bytes_read: u64,
    read_seconds: f64,
    acceptance: f64,
}

impl Row {
    fn of(runs: &[Generation]) -> Self {
        let s = summarize(runs);
        let reads = runs.iter().filter_map(|r| r.expert_reads);
        Row {
            tokens: s.tokens,
            tps: tps(&s),
            target_calls: s.target_calls,
            bytes_read: reads.clone().map(|r| r.bytes_read).sum(),
            read_seconds: reads.map(|r| r.read_seconds).sum(),
            acceptance: if s.drafted == 0 {
                0.0
            } else {
                100.0 * s.accepted as f64 / s.drafted as f64
            },
        }
    }

    fn per_token(&self) -> f64 {
        self.bytes_read as f64 / self.tokens.max(1) as f64
    }

    fn per_forward(&self) -> f64 {
        self.bytes_read as f64 / self.target_calls.max(1) as f64
    }
}

pub fn run(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    suite::build_runner()?;
    for routing in o.routings.clone() {
        bench(&o, routing)?;
    }
    println!("\n`vs res.`: tokens/s against the same provider with every expert resident; `tok/fwd`: tokens emitted per target forward; bytes: read by the streamed tier (the MTP row's and draft-model's experts stay resident), `vs plain` per emitted token against plain's at the same tier; `decode B/tok`: the same without what the prompts' forwards read (measured by a plain run of one token per prompt at the tier), per token decoded (where a window's rows share every pick and the tier cannot keep a token's picks, its `vs plain` falls to 1 / tok/fwd: one read per expert per window); draft-model drafts with the target itself (every draft accepted: the bound).");
    Ok(())
}

/// Every tier and provider on the checkpoint routed by `routing`.
fn bench(o: &Options, routing: Routing) -> Result<()> {
    let model = ensure(routing)?;
    let routed = synth_glm::routed_experts(&model)?;
    let work = shell::root()
        .join("target")
        .join("bench-experts")
        .join(routing.name());
    let cache = CacheDrop::detect(&model);
    let request = |provider: &str, experts: ExpertOptions, max_tokens: usize| {
        let mut r = SpecRequest::new(
            model.clone(),
            Dtype::Keep,
            suite::ids(&suite::id_prompts(spec().vocab as u64, o.prompts)),
            max_tokens,
            vec![provider.to_owned()],
        );
        r.experts = experts;
        r.option(DRAFT_MODEL, "model", model.display().to_string())
            .option(DRAFT_MODEL, "dtype", Dtype::Keep.as_str());
        r
    };
    let mtp8 = ExpertOptions {
        cache_bytes: None,
        mtp_expert_bits: Some(8),
    };
    let spec = spec();
    println!(
        "\nbench experts, {} routing: {} ({} float32 routed experts in {} layers: {:.1} MB, {:.2} MB a layer; MTP row's experts at 8 bits), {} prompts, {} tokens max, {}",
        routing.name(),
        model.file_name().map_or(spec.name.into(), |n| n.to_string_lossy()),
        spec.experts,
        routed.layers,
        routed.bytes as f64 / 1e6,
        routed.layer_bytes() as f64 / 1e6,
        o.prompts,
        o.max_tokens,
        super::cpu_model()
    );
    println!("page cache: {}", cache.describe());
    let mut tiers: Vec<Option<u64>> = vec![None];
    tiers.extend(TIER_DIVISORS.iter().map(|d| Some(routed.bytes / d)));
    let mut resident: Vec<(String, Vec<Vec<u32>>, f64)> = Vec::new();
    println!(
        "\n{:<16} {:<17} {:>7} {:>9} {:>7} {:>11} {:>8} {:>12} {:>9} {:>12} {:>9} {:>12} {:>8}",
        "tier",
        "provider",
        "tokens",
        "tok/s",
        "vs res.",
        "acceptance",
        "tok/fwd",
        "bytes/token",
        "vs plain",
        "decode B/tok",
        "vs plain",
        "bytes/fwd",
        "read s"
    );
    for tier in tiers {
        let label = match tier {
            None => "resident".to_owned(),
            Some(bytes) => format!(
                "{:.2} MB (1/{})",
                bytes as f64 / 1e6,
                routed.bytes / bytes.max(1)
            ),
        };
        // What the prompts' forwards read (each request's first token comes
        // from its prompt): the rest is what decoding read.
        let prefill_bytes = match tier {
            None => 0,
            Some(bytes) => {
                cache.apply(&model)?;
                let experts = ExpertOptions {
                    cache_bytes: Some(usize::try_from(bytes)?),
                    ..mtp8
                };
                let results = suite::spec_run(
                    &request(PLAIN, experts, 1),
                    &work,
                    &format!("{bytes}-prefill"),
                    &[],
                )?;
                Row::of(results.alone(PLAIN)).bytes_read
            }
        };
        let mut plain_per_token = None;
        let mut plain_decode = None;
        for provider in PROVIDERS {
            cache.apply(&model)?;
            let experts = ExpertOptions {
                cache_bytes: tier.map(usize::try_from).transpose()?,
                ..mtp8
            };
            let stem = format!(
                "{}-{provider}",
                tier.map_or("resident".to_owned(), |b| b.to_string())
            );
            let results =
                suite::spec_run(&request(provider, experts, o.max_tokens), &work, &stem, &[])?;
            let runs = results.alone(provider);
            let row = Row::of(runs);
            let tokens: Vec<Vec<u32>> = runs.iter().map(|r| r.tokens.clone()).collect();
            let resident_tps = match tier {
                None => {
                    resident.push((provider.to_owned(), tokens, row.tps));
                    row.tps
                }
                Some(_) => {
                    let (_, want, tps) = resident
                        .iter()
                        .find(|(p, _, _)| p == provider)
                        .context("the resident runs come first")?;
                    if *want != tokens {
                        bail!("{label} / {provider}: the streamed tokens differ from the resident model's");
                    }
                    *tps
                }
            };
            let per_token = row.per_token();
            let decode = row.bytes_read.saturating_sub(prefill_bytes) as f64
                / row.tokens.saturating_sub(runs.len()).max(1) as f64;
            if provider == PLAIN {
                plain_per_token = Some(per_token);
                plain_decode = Some(decode);
            }
            let ratio = |x: f64, plain: Option<f64>| {
                plain
                    .filter(|p| *p > 0.0)
                    .map_or("-".to_owned(), |p| format!("{:.2}x", x / p))
            };
            let (bytes_token, vs_plain, decode_token, vs_plain_decode, bytes_forward, read) =
                match tier {
                    None => {
                        let dash = || "-".to_owned();
                        (dash(), dash(), dash(), dash(), dash(), dash())
                    }
                    Some(_) => (
                        format!("{per_token:.0}"),
                        ratio(per_token, plain_per_token),
                        format!("{decode:.0}"),
                        ratio(decode, plain_decode),
                        format!("{:.0}", row.per_forward()),
                        format!("{:.3}", row.read_seconds),
                    ),
                };
            println!(
                "{label:<16} {provider:<17} {:>7} {:>9.2} {:>6.2}x {:>10.1}% {:>8.2} {bytes_token:>12} {vs_plain:>9} {decode_token:>12} {vs_plain_decode:>9} {bytes_forward:>12} {read:>8}",
                row.tokens,
                row.tps,
                row.tps / resident_tps.max(1e-9),
                row.acceptance,
                row.tokens as f64 / row.target_calls.max(1) as f64,
            );
        }
    }
    Ok(())
}
