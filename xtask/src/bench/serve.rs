//! `cargo xtask bench serve`: continuous batching as clients see it. The
//! real `mlx_lm.server` 0.32.2 (from the project venv, on our GEMM front
//! and Debian's OpenBLAS, its batching on) and our `mlx-spec serve`
//! (release build) run side by side on loopback over the same model
//! directory (SmolLM2-135M-Instruct, float32); 1, 4 and 8 concurrent
//! clients each stream a bounded number of greedy chat completions from
//! the input-grounded, edit-and-return and open-ended prompt sets (the
//! suite `bench spec` runs). Configurations: mlx-lm; ours plain (batched);
//! ours with prompt lookup named per request, its lengths from each
//! request's own controller (`draft_policy: per-row`); the same with the
//! lengths chosen per step for the batch (`goodput`, the default); ours
//! run in the order A B C C B A per cell (`--rounds` times), every run
//! counted (at 1 client per request: each prompt in every configuration
//! before the next).
//! Goodput's line also gives per-row's decode steps over its own by the
//! server's fitted step cost (the policy's choice without the machine's
//! drift between runs).
//! Per configuration and client
//! count: aggregate tokens/s (completion tokens from the usage field over
//! the wall time), p50/p95 request latency and time to first token, with
//! ratios against mlx-lm; then the single-client decode rate against
//! `serve_loop::generate` (`spec_run`), the targets, and whether
//! ours plain and ours with prompt lookup streamed the same text for every
//! prompt. For ours it also reads the server's `/metrics` around each run:
//! engine steps, rows and window tokens a step, drafts proposed and
//! accepted (what a batched verification costs and returns). Draws an SVG
//! of tokens/s against clients.
//!
//! Options: `--requests N` per client (default 3), `--rounds N` of ours'
//! A B C C B A per cell (default 2: single passes of identical work measure
//! up to 15% apart here; 1 halves the time), `--max-tokens N`
//! (default 96), `--clients 1,4,8`, `--sets input-grounded,edit-and-return,open-ended`,
//! `--svg PATH` (default `docs/img/bench-serve.svg`).

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Barrier;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::serve_http::{self, Server, Timed};
use super::serve_plot::{self, Line, Panel};
use run_protocol::spec::{SpecRequest, PLAIN};
use run_protocol::Dtype;

use crate::gate::suite;
use crate::{real_model, shell, venv};

struct Args {
    requests: usize,
    /// Ours' A B C C B A per cell.
    rounds: usize,
    max_tokens: usize,
    clients: Vec<usize>,
    sets: Vec<String>,
    svg: PathBuf,
}

const SETS: [&str; 3] = ["input-grounded", "edit-and-return", "open-ended"];

fn parse(args: &[String]) -> Result<Args> {
    let list = |v: &str| -> Vec<String> { v.split(',').map(|s| s.trim().to_owned()).collect() };
    let mut parsed = Args {
        requests: 3,
        rounds: 2,
        max_tokens: 96,
        clients: vec![1, 4, 8],
        sets: SETS.iter().map(|s| (*s).to_owned()).collect(),
        svg: shell::root()
            .join("docs")
            .join("img")
            .join("bench-serve.svg"),
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--requests" => parsed.requests = value()?.parse().context("--requests")?,
            "--rounds" => parsed.rounds = value()?.parse().context("--rounds")?,
            "--max-tokens" => parsed.max_tokens = value()?.parse().context("--max-tokens")?,
            "--clients" => {
                parsed.clients = list(value()?)
                    .iter()
                    .map(|c| c.parse().context("--clients"))
                    .collect::<Result<_>>()?;
            }
            "--sets" => parsed.sets = list(value()?),
            "--svg" => parsed.svg = PathBuf::from(value()?),
            other => bail!(
                "unknown option {other} (known: --requests, --rounds, --max-tokens, --clients, --sets, --svg)"
            ),
        }
    }
    if parsed.requests == 0
        || parsed.rounds == 0
        || parsed.max_tokens == 0
        || parsed.clients.contains(&0)
    {
        bail!("--requests, --rounds, --max-tokens and every client count must be at least 1");
    }
    if let Some(unknown) = parsed.sets.iter().find(|s| !SETS.contains(&s.as_str())) {
        bail!("unknown set {unknown} (known: {})", SETS.join(", "));
    }
    parsed.clients.sort_unstable();
    parsed.clients.dedup();
    Ok(parsed)
}

/// A configuration: which server, and the request's speculation field.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Config {
    MlxLm,
    Plain,
    Lookup,
    Goodput,
}

impl Config {
    const ALL: [Config; 4] = [
        Config::MlxLm,
        Config::Plain,
        Config::Lookup,
        Config::Goodput,
    ];

    fn label(self) -> &'static str {
        match self {
            Config::MlxLm => "mlx-lm",
            Config::Plain => "ours plain",
            Config::Lookup => "ours prompt-lookup",
            Config::Goodput => "ours lookup goodput",
        }
    }

    fn speculative(self) -> Option<Value> {
        let policy = match self {
            Config::MlxLm | Config::Plain => return None,
            Config::Lookup => "per-row",
            Config::Goodput => "goodput",
        };
        Some(json!({
            "provider": run_protocol::providers::PROMPT_LOOKUP,
            "draft_policy": policy,
        }))
    }
}

/// One configuration at one client count on one set.
struct Measure {
    /// Prompt index and what the client saw, per request.
    runs: Vec<(usize, Timed)>,
    wall: f64,
    /// Each pass's tok/s, in the order they ran (how far identical work
    /// measured apart within the cell).
    passes: Vec<f64>,
    load: f64,
    /// Our engine's counters over the run (`None` for mlx-lm).
    engine: Option<Engine>,
}

/// What our server's `/metrics` counted during one run.
#[derive(Default, Clone, Copy)]
struct Engine {
    steps: f64,
    pipelined: f64,
    rows: f64,
    drafted: f64,
    accepted: f64,
    generated: f64,
}

impl Engine {
    /// The counters now: each metric's series summed over their labels.
    fn read(agent: &ureq::Agent, server: &Server) -> Result<Self> {
        let text = serve_http::metrics_text(agent, &server.base)?;
        let sum = |name: &str| -> f64 {
            text.lines()
                .filter(|l| {
                    l.strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        Ok(Self {
            steps: sum("mlx_spec_engine_steps_total"),
            pipelined: sum("mlx_spec_engine_pipelined_steps_total"),
            rows: sum("mlx_spec_rows_per_step_sum"),
            drafted: sum("mlx_spec_spec_drafted_total"),
            accepted: sum("mlx_spec_spec_accepted_total"),
            generated: sum("mlx_spec_generated_tokens_total"),
        })
    }

    fn plus(self, other: Self) -> Self {
        Self {
            steps: self.steps + other.steps,
            pipelined: self.pipelined + other.pipelined,
            rows: self.rows + other.rows,
            drafted: self.drafted + other.drafted,
            accepted: self.accepted + other.accepted,
            generated: self.generated + other.generated,
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            steps: self.steps - before.steps,
            pipelined: self.pipelined - before.pipelined,
            rows: self.rows - before.rows,
            drafted: self.drafted - before.drafted,
            accepted: self.accepted - before.accepted,
            generated: self.generated - before.generated,
        }
    }
}

impl Measure {
    /// `other`, a second run of the same cell, counted with this one: its
    /// requests, its wall time and its engine counters added, the load
    /// averaged.
    fn merge(&mut self, other: Measure) {
        self.runs.extend(other.runs);
        self.wall += other.wall;
        self.passes.extend(other.passes);
        self.load = (self.load + other.load) / 2.0;
        self.engine = match (self.engine, other.engine) {
            (Some(a), Some(b)) => Some(a.plus(b)),
            (a, b) => a.or(b),
        };
    }

    fn tokens(&self) -> usize {
        self.runs.iter().map(|(_, t)| t.tokens).sum()
    }

    fn tps(&self) -> f64 {
        self.tokens() as f64 / self.wall.max(1e-9)
    }

    /// Tokens after the first over the seconds after it: the decode rate a
    /// lone client sees.
    fn decode_tps(&self) -> f64 {
        let tokens: usize = self
            .runs
            .iter()
            .map(|(_, t)| t.tokens.saturating_sub(1))
            .sum();
        let seconds: f64 = self.runs.iter().map(|(_, t)| t.total - t.first_token).sum();
        tokens as f64 / seconds.max(1e-9)
    }

    fn percentile(&self, p: f64, of: impl Fn(&Timed) -> f64) -> f64 {
        let mut v: Vec<f64> = self.runs.iter().map(|(_, t)| of(t)).collect();
        v.sort_by(f64::total_cmp);
        // Nearest rank.
        let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
        v.get(rank - 1).copied().unwrap_or(f64::NAN)
    }
}

/// Our server's step cost model (what the goodput policy sized drafts
/// with), as its `/metrics` shows it at the end of the runs.
/// The server's fitted step cost (seconds): a step's base, per row, per
/// token of its windows.
#[derive(Clone, Copy)]
struct Fitted {
    base: f64,
    per_row: f64,
    per_token: f64,
}

impl Fitted {
    /// What `e`'s steps cost by the fit: the policy's own view of a run,
    /// free of the machine's drift between runs (prompt tokens left out:
    /// every configuration runs the same prompts).
    fn seconds(&self, e: &Engine) -> f64 {
        e.steps * self.base + e.rows * self.per_row + (e.rows + e.drafted) * self.per_token
    }
}

fn step_cost_line(agent: &ureq::Agent, server: &Server) -> Result<(String, Fitted)> {
    let text = serve_http::metrics_text(agent, &server.base)?;
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(f64::NAN)
    };
    let fitted = Fitted {
        base: value("mlx_spec_step_cost_base_seconds"),
        per_row: value("mlx_spec_step_cost_per_row_seconds"),
        per_token: value("mlx_spec_step_cost_per_token_seconds"),
    };
    let line = format!(
        "ours, step cost model at the end: base {:.1} ms, per row {:.2} ms, per token {:.2} ms ({} steps learned, {} rejected, {} restarts)",
        1e3 * fitted.base,
        1e3 * fitted.per_row,
        1e3 * fitted.per_token,
        value("mlx_spec_step_cost_samples_total"),
        value("mlx_spec_step_cost_rejected_total"),
        value("mlx_spec_step_cost_restarts_total"),
    );
    Ok((line, fitted))
}

/// The 1-minute load average (the machine is shared).
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// `clients` threads, each sending `requests` completions one after
/// another (client `c`'s request `r` takes prompt `(c * requests + r) %
/// len`), all released together.
fn load(
    agent: &ureq::Agent,
    server: &Server,
    prompts: &[String],
    clients: usize,
    requests: usize,
    max_tokens: usize,
    config: Config,
) -> Result<Measure> {
    let start = Barrier::new(clients);
    let speculative = config.speculative();
    let loadavg = load_average();
    let ours = config != Config::MlxLm;
    let before = if ours {
        Some(Engine::read(agent, server)?)
    } else {
        None
    };
    let per_client: Vec<Result<Vec<(usize, Timed)>>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..clients)
            .map(|c| {
                let (start, speculative) = (&start, speculative.as_ref());
                scope.spawn(move || {
                    start.wait();
                    (0..requests)
                        .map(|r| {
                            let i = (c * requests + r) % prompts.len();
                            let timed = serve_http::complete(
                                agent,
                                &server.base,
                                &prompts[i],
                                max_tokens,
                                speculative,
                            )?;
                            Ok((i, timed))
                        })
                        .collect::<Result<Vec<_>>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| bail!("a client thread panicked"))
            })
            .collect()
    });
    let mut runs = Vec::new();
    for client in per_client {
        runs.extend(client?);
    }
    let first = runs.iter().map(|(_, t)| t.sent).min();
    let last = runs.iter().map(|(_, t)| t.ended).max();
    let wall = match (first, last) {
        (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
        _ => bail!("no requests ran"),
    };
    let engine = match before {
        Some(before) => Some(Engine::read(agent, server)?.since(before)),
        None => None,
    };
    let mut measure = Measure {
        runs,
        wall,
        passes: Vec::new(),
        load: loadavg,
        engine,
    };
    measure.passes.push(measure.tps());
    Ok(measure)
}

/// The order a cell runs its configurations in, back to back (so a change
/// of load hits them alike): mlx-lm, then ours A B C C B A `rounds` times,
/// so that none always runs first (the 1-client cells moved by about 5%
/// with the order alone) and each is measured around the same middle (a
/// drift of the machine's speed during a cell then moves all three alike:
/// the goodput cell against plain moved by 7% between two runs whose
/// engines ran the same steps).
fn order(rounds: usize) -> Vec<Config> {
    let ours = [
        Config::Plain,
        Config::Lookup,
        Config::Goodput,
        Config::Goodput,
        Config::Lookup,
        Config::Plain,
    ];
    std::iter::once(Config::MlxLm)
        .chain(std::iter::repeat_n(ours, rounds).flatten())
        .collect()
}

/// A 1-client cell: nothing else is in flight, so each request runs in
/// every configuration of `order` before the next is sent (a drift of the
/// machine's speed then moves a prompt's runs alike, where whole passes
/// over the prompts measured identical steps up to 8% apart). One measure
/// per entry of `order`, its wall time the sum of its requests'.
fn alone(
    agent: &ureq::Agent,
    (theirs, ours): (&Server, &Server),
    order: &[Config],
    prompts: &[String],
    requests: usize,
    max_tokens: usize,
) -> Result<Vec<(Config, Measure)>> {
    let loadavg = load_average();
    let mut runs: Vec<(Config, Measure)> = order
        .iter()
        .map(|&config| {
            let m = Measure {
                runs: Vec::new(),
                wall: 0.0,
                passes: Vec::new(),
                load: loadavg,
                engine: (config != Config::MlxLm).then(Engine::default),
            };
            (config, m)
        })
        .collect();
    for i in (0..requests).map(|r| r % prompts.len()) {
        for (config, m) in &mut runs {
            let server = if *config == Config::MlxLm {
                theirs
            } else {
                ours
            };
            let before = match m.engine {
                Some(_) => Some(Engine::read(agent, server)?),
                None => None,
            };
            let speculative = config.speculative();
            let timed = serve_http::complete(
                agent,
                &server.base,
                &prompts[i],
                max_tokens,
                speculative.as_ref(),
            )?;
            if let (Some(before), Some(sum)) = (before, m.engine.as_mut()) {
                *sum = sum.plus(Engine::read(agent, server)?.since(before));
            }
            m.wall += timed.ended.duration_since(timed.sent).as_secs_f64();
            m.runs.push((i, timed));
        }
    }
    for (_, m) in &mut runs {
        m.passes.push(m.tps());
    }
    Ok(runs)
}

pub fn run(args: &[String]) -> Result<()> {
    let args = parse(args)?;
    let python = venv::ensure()?;
    suite::build_runner()?;
    let model = real_model::ensure()?;
    let suite = suite::suite()?;
    let work = shell::root().join("target").join("bench-serve");
    std::fs::create_dir_all(&work)?;
    let sets: Vec<(&str, &Vec<String>)> = [
        ("input-grounded", &suite.input_grounded),
        ("edit-and-return", &suite.edit_and_return),
        ("open-ended", &suite.open_ended),
    ]
    .into_iter()
    .filter(|(name, _)| args.sets.iter().any(|s| s == name))
    .collect();
    let batch = args.clients.iter().copied().max().unwrap_or(1);
    let cpu = super::cpu_model();
    let load_start = load_average();

    // Today's single-request path: `serve_loop::generate` in one process,
    // on the prompts a lone client sends.
    let mut generate_tps = BTreeMap::new();
    for (set, prompts) in &sets {
        let texts: Vec<String> = prompts.iter().take(args.requests).cloned().collect();
        let request = SpecRequest::new(
            model.clone(),
            Dtype::F32,
            suite::chat_prompts(&texts),
            args.max_tokens,
            vec![PLAIN.to_owned()],
        );
        let results = suite::spec_run(&request, &work, &format!("generate-{set}"), &[])?;
        let plain = super::spec::summarize(results.alone(PLAIN));
        generate_tps.insert(*set, super::spec::tps(&plain));
    }

    eprintln!("starting mlx_lm.server and mlx-spec serve (batch {batch})");
    let theirs = serve_http::mlx_lm(&python, &model, batch, &work.join("mlx-lm.log"))?;
    let ours = serve_http::ours(&model, batch, &work.join("mlx-spec.log"), &[])?;
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(10))
        .timeout_read(Duration::from_secs(600))
        .build();
    // Warm both up (first-call costs are not what is measured).
    for config in Config::ALL {
        let server = if config == Config::MlxLm {
            &theirs
        } else {
            &ours
        };
        let warm = sets
            .first()
            .and_then(|(_, p)| p.first())
            .context("no prompts")?;
        serve_http::complete(&agent, &server.base, warm, 8, config.speculative().as_ref())?;
    }
    let mut measures: BTreeMap<(&str, usize, Config), Measure> = BTreeMap::new();
    for (set, prompts) in &sets {
        for &clients in &args.clients {
            // The cell's prompts in both servers' prompt caches first: the
            // configuration that ran first paid their prefill (ours plain's
            // first pass measured 5-11% under its second at 1 and 4 clients,
            // mlx-lm's only pass the same).
            for i in 0..(clients * args.requests).min(prompts.len()) {
                for server in [&theirs, &ours] {
                    serve_http::complete(&agent, &server.base, &prompts[i], 1, None)?;
                }
            }
            let runs = if clients == 1 {
                eprintln!("{set}: 1 client, each request in every configuration");
                alone(
                    &agent,
                    (&theirs, &ours),
                    &order(args.rounds),
                    prompts,
                    args.requests,
                    args.max_tokens,
                )?
            } else {
                let mut runs = Vec::new();
                for config in order(args.rounds) {
                    let server = if config == Config::MlxLm {
                        &theirs
                    } else {
                        &ours
                    };
                    eprintln!("{set}: {clients} clients, {}", config.label());
                    let m = load(
                        &agent,
                        server,
                        prompts,
                        clients,
                        args.requests,
                        args.max_tokens,
                        config,
                    )?;
                    runs.push((config, m));
                }
                runs
            };
            for (config, m) in runs {
                match measures.entry((*set, clients, config)) {
                    Entry::Occupied(mut first) => first.get_mut().merge(m),
                    Entry::Vacant(slot) => {
                        slot.insert(m);
                    }
                }
            }
        }
    }
    let (step_cost, fitted) = step_cost_line(&agent, &ours)?;
    drop((theirs, ours));
    let load_end = load_average();

    println!(
        "\nserving {} (float32): mlx_lm.server 0.32.2 (--decode-concurrency {batch}) vs mlx-spec serve (--max-batch {batch}); greedy, {} tokens max, {} requests per client, streamed",
        real_model::NAME,
        args.max_tokens,
        args.requests
    );
    println!(
        "CPU: {cpu}; load average {load_start:.1} at the start, {load_end:.1} at the end (shared machine)"
    );
    println!(
        "{:<16} {:>7} {:<19} {:>8} {:>8} {:>9} {:>7} {:>7} {:>7} {:>9} {:>9} {:>5}",
        "set",
        "clients",
        "configuration",
        "requests",
        "tokens",
        "tok/s",
        "vs lm",
        "p50 s",
        "p95 s",
        "TTFT p50",
        "TTFT p95",
        "load"
    );
    for ((set, clients, config), m) in &measures {
        let reference = measures
            .get(&(*set, *clients, Config::MlxLm))
            .map_or(f64::NAN, Measure::tps);
        println!(
            "{set:<16} {clients:>7} {:<19} {:>8} {:>8} {:>9.2} {:>6.2}x {:>7.2} {:>7.2} {:>9.3} {:>9.3} {:>5.1}",
            config.label(),
            m.runs.len(),
            m.tokens(),
            m.tps(),
            m.tps() / reference,
            m.percentile(50.0, |t| t.total),
            m.percentile(95.0, |t| t.total),
            m.percentile(50.0, |t| t.first_token),
            m.percentile(95.0, |t| t.first_token),
            m.load,
        );
    }

    println!(
        "\nours, engine side (server /metrics over each run): steps (target forwards), of which several plain rows decoded pipelined, rows a step, rows plus drafts a step (a prompt chunk counts one), drafts proposed and accepted, tokens generated a step"
    );
    println!(
        "{:<16} {:>7} {:<19} {:>7} {:>9} {:>11} {:>8} {:>9} {:>9}",
        "set",
        "clients",
        "configuration",
        "steps",
        "rows/step",
        "tokens/step",
        "drafted",
        "accepted",
        "tok/step"
    );
    for ((set, clients, config), m) in &measures {
        let Some(e) = m.engine else { continue };
        let steps = e.steps.max(1.0);
        // A decoding row's window is its pending token and its drafts.
        println!(
            "{set:<16} {clients:>7} {:<19} {:>7} {:>9} {:>9.2} {:>11.2} {:>8} {:>8.0}% {:>9.2}",
            config.label(),
            e.steps,
            e.pipelined,
            e.rows / steps,
            (e.rows + e.drafted) / steps,
            e.drafted,
            100.0 * e.accepted / e.drafted.max(1.0),
            e.generated / steps,
        );
    }

    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    println!("\n{step_cost}");
    println!("\ngoodput policy (issue 33), tok/s at each client count:");
    for (set, _) in &sets {
        for &clients in &args.clients {
            let tps = |config| {
                measures
                    .get(&(*set, clients, config))
                    .map_or(f64::NAN, Measure::tps)
            };
            let (plain, lookup, goodput) = (
                tps(Config::Plain),
                tps(Config::Lookup),
                tps(Config::Goodput),
            );
            let best = goodput / plain.max(lookup);
            let mut line = format!(
                "  {set}, {clients} clients: plain {plain:.2}, per-row lookup {lookup:.2}, goodput {goodput:.2}: {best:.2}x the better (>= 0.97: {})",
                verdict(best >= 0.97)
            );
            if clients >= 8 && *set != "open-ended" {
                let vs_plain = goodput / plain;
                line.push_str(&format!(
                    ", {vs_plain:.2}x plain (>= 1.15: {})",
                    verdict(vs_plain >= 1.15)
                ));
            }
            // The same requests' steps by the fitted cost: what the policy
            // chose, apart from the machine's speed during each run.
            let modeled = |config| {
                measures
                    .get(&(*set, clients, config))
                    .and_then(|m| m.engine)
                    .map_or(f64::NAN, |e| fitted.seconds(&e))
            };
            let by_fit = modeled(Config::Lookup) / modeled(Config::Goodput);
            line.push_str(&format!("; by the fitted step cost {by_fit:.2}x per-row"));
            let passes = |config| {
                measures
                    .get(&(*set, clients, config))
                    .map_or_else(String::new, |m| {
                        let tps: Vec<String> = m.passes.iter().map(|t| format!("{t:.1}")).collect();
                        tps.join("/")
                    })
            };
            line.push_str(&format!(
                "; passes plain {}, per-row {}, goodput {}",
                passes(Config::Plain),
                passes(Config::Lookup),
                passes(Config::Goodput)
            ));
            println!("{line}");
        }
    }

    println!("\ntargets (issue 15), as measured:");
    let most = *args.clients.last().unwrap_or(&1);
    for (set, _) in &sets {
        let tps = |config| {
            measures
                .get(&(*set, most, config))
                .map_or(f64::NAN, Measure::tps)
        };
        let lm = tps(Config::MlxLm);
        let plain = tps(Config::Plain) / lm;
        let lookup = tps(Config::Lookup) / lm;
        let want = if *set == "open-ended" { 1.0 } else { 1.5 };
        println!(
            "  {set}, {most} clients: ours plain {plain:.2}x mlx-lm (>= 1.0: {}), ours prompt-lookup {lookup:.2}x (>= {want:.1}: {})",
            verdict(plain >= 1.0),
            verdict(lookup >= want)
        );
        if let (Some(m), Some(g)) = (
            measures.get(&(*set, 1, Config::Plain)),
            generate_tps.get(set),
        ) {
            let ratio = m.decode_tps() / g;
            println!(
                "  {set}, 1 client: ours plain decodes {:.2} tok/s, serve_loop::generate {g:.2}: {ratio:.2}x (>= 0.95: {})",
                m.decode_tps(),
                verdict(ratio >= 0.95)
            );
        }
    }

    // Greedy: the same prompt streams the same text in every run of ours.
    let mut mismatches = Vec::new();
    let mut same_as_lm = (0, 0);
    for (set, _) in &sets {
        let mut ours_text: BTreeMap<usize, (&str, &str)> = BTreeMap::new();
        let mut lm_text: BTreeMap<usize, &str> = BTreeMap::new();
        for ((s, clients, config), m) in &measures {
            if s != set {
                continue;
            }
            for (i, t) in &m.runs {
                if *config == Config::MlxLm {
                    lm_text.entry(*i).or_insert(t.text.as_str());
                    continue;
                }
                let (first, by) = *ours_text
                    .entry(*i)
                    .or_insert((t.text.as_str(), config.label()));
                if first != t.text {
                    mismatches.push(format!(
                        "{set} prompt {i} ({} clients): {} differs from {by}",
                        clients,
                        config.label()
                    ));
                }
            }
        }
        for (i, (text, _)) in &ours_text {
            if let Some(lm) = lm_text.get(i) {
                same_as_lm.1 += 1;
                same_as_lm.0 += usize::from(lm == text);
            }
        }
    }
    if mismatches.is_empty() {
        println!("\nours plain, per-row and goodput prompt lookup streamed the same text for every prompt, at every client count");
    } else {
        println!("\nMISMATCHES between our runs of the same prompt:");
        for m in &mismatches {
            println!("  {m}");
        }
    }
    println!(
        "mlx-lm's text equals ours on {} of {} prompts (its batched rows are not row-invariant: near ties may flip)",
        same_as_lm.0, same_as_lm.1
    );

    let lines_of = |set: &str| -> Vec<Line<'static>> {
        Config::ALL
            .iter()
            .map(|&config| Line {
                label: config.label(),
                points: args
                    .clients
                    .iter()
                    .filter_map(|&c| measures.get(&(set, c, config)).map(|m| (c as f64, m.tps())))
                    .collect(),
            })
            .collect()
    };
    let panels: Vec<Panel<'_>> = sets
        .iter()
        .map(|(set, _)| Panel {
            title: set,
            lines: lines_of(set),
        })
        .collect();
    let caption = format!(
        "SmolLM2-135M f32, greedy, {} tokens max; {cpu}, load {load_start:.1}-{load_end:.1}",
        args.max_tokens
    );
    serve_plot::draw(&args.svg, &caption, &panels)?;
    println!("plot: {}", args.svg.display());
    if !mismatches.is_empty() {
        bail!(
            "{} runs of ours differ for the same prompt",
            mismatches.len()
        );
    }
    Ok(())
}
