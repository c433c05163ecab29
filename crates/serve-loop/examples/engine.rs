//! Embeds the engine: writes a tiny random llama, starts an [`Engine`] that
//! loads it on its own thread, submits requests from four threads (greedy
//! and seeded sampling), streams their tokens, cancels one, and prints the
//! engine's stats.
//!
//! `cargo run -p serve-loop --example engine`

use std::error::Error;

use serve_loop::{Engine, EngineConfig, Event, Loaded, Request};
use spec_core::SamplerConfig;
use spec_fixtures::llama::Llama;
use spec_models::{load_model, LoadOptions};

fn main() -> Result<(), Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    Llama::tiny(11).write(dir.path())?;
    let path = dir.path().to_path_buf();
    let engine = Engine::start(EngineConfig::default(), move || {
        let target = load_model(&path, &LoadOptions::default())?;
        Ok(Loaded {
            target: Box::new(target),
            providers: Vec::new(),
            factory: None,
            prefix_store: None,
        })
    })?;
    std::thread::scope(|scope| -> Result<(), serve_loop::ServeError> {
        let engine = &engine;
        let mut threads = Vec::new();
        for i in 0..4u32 {
            let request = Request {
                sampler: SamplerConfig {
                    temperature: if i % 2 == 0 { 0.0 } else { 0.8 },
                    seed: u64::from(i),
                    ..SamplerConfig::default()
                },
                ..Request::new((0..8 + i).map(|t| (t * 7 + i) % 96).collect(), 24)
            };
            let handle = engine.submit(request)?;
            threads.push(scope.spawn(move || {
                let mut tokens = Vec::new();
                for event in handle {
                    match event {
                        Event::Token { token, .. } => tokens.push(token),
                        Event::Done(done) => println!(
                            "request {i}: {:?} after {} tokens {:?} (queued {:.4}s)",
                            done.output.finish,
                            tokens.len(),
                            tokens,
                            done.queue_seconds
                        ),
                        Event::Failed(e) => println!("request {i} failed: {e}"),
                    }
                }
            }));
        }
        let cancelled = engine.submit(Request::new(vec![1, 2, 3], 10_000))?;
        cancelled.cancel();
        match cancelled.wait() {
            Ok(done) => println!("cancelled request: {:?}", done.output.finish),
            Err(e) => println!("cancelled request failed: {e}"),
        }
        for t in threads {
            if t.join().is_err() {
                eprintln!("a request thread panicked");
            }
        }
        Ok(())
    })?;
    let stats = engine.stats();
    println!(
        "steps {}, rows per step {:?}, completed {}, cancelled {}",
        stats.steps, stats.rows_per_step, stats.completed, stats.cancelled
    );
    engine.shutdown()?;
    Ok(())
}
