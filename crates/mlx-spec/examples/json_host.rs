//! A Rust host asking for a JSON object: embeds the engine, compiles a JSON
//! schema against the model's own tokenizer (`spec-grammar`, llguidance),
//! and submits a chat request constrained by it, speculating with prompt
//! lookup; prints the answer, each token's log-probability with its two
//! most likely alternatives, and how many tokens the schema forced.
//!
//! `cargo run --release -p mlx-spec --example json_host -- MODEL_DIR`
//! (an mlx-lm directory with `tokenizer.json`, e.g. the gates'
//! `target/gate-models/smollm2-135m-f32`).

use std::error::Error;
use std::sync::Arc;

use serve_loop::{Engine, EngineConfig, Event, Loaded, ProviderChoice, Request, SpecConfig};
use spec_core::ProviderOptions;
use spec_grammar::{GrammarSpec, TokenEnv};
use spec_models::{load_model, LoadOptions};
use spec_text::{Message, Tokenizer};

// Link the provider the request names.
use draft_prompt_lookup as _;

fn main() -> Result<(), Box<dyn Error>> {
    let Some(dir) = std::env::args_os().nth(1).map(std::path::PathBuf::from) else {
        return Err("usage: json_host MODEL_DIR".into());
    };
    let tokenizer = Arc::new(Tokenizer::from_file(dir.join("tokenizer.json"))?);
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "country": {"type": "string", "maxLength": 20},
            "population_millions": {"type": "number", "minimum": 0, "maximum": 100},
            "capital": {"type": "boolean"}
        },
        "required": ["city", "country", "population_millions", "capital"],
        "additionalProperties": false
    });
    let rendered = tokenizer.chat_template()?.render(
        &[Message::user(
            "Give me facts about Lyon as JSON.".to_owned(),
        )],
        true,
    )?;
    let prompt = tokenizer.encode(&rendered, false)?;

    let path = dir.clone();
    let engine = Engine::start(EngineConfig::default(), move || {
        let target = load_model(&path, &LoadOptions::default())?;
        let lookup = serve_loop::build_provider("prompt-lookup", &target, &ProviderOptions::new())?;
        Ok(Loaded {
            target: Box::new(target),
            providers: vec![lookup],
            factory: None,
            prefix_store: None,
        })
    })?;
    // The token environment is built once per model; each request compiles
    // its own grammar into a fresh constraint (ids past the tokenizer's, a
    // padded embedding's, are refused by its masks).
    let env = TokenEnv::new(Arc::clone(&tokenizer), tokenizer.vocab_size())?;
    let request = Request {
        eos: tokenizer.eos_token_ids().iter().copied().collect(),
        constraint: Some(Box::new(env.constraint(&GrammarSpec::JsonSchema(schema))?)),
        top_logprobs: 2,
        speculation: Some(ProviderChoice::new("prompt-lookup", SpecConfig::default())),
        ..Request::new(prompt, 96)
    };
    let mut tokens = Vec::new();
    for event in engine.submit(request)? {
        match event {
            Event::Token {
                token,
                logprob,
                top_logprobs,
            } => {
                let piece = tokenizer.decode(&[token], false)?;
                let others: Vec<String> = top_logprobs
                    .iter()
                    .map(|(t, lp)| format!("{t}:{lp:.2}"))
                    .collect();
                println!("{piece:?} {logprob:.3} [{}]", others.join(" "));
                tokens.push(token);
            }
            Event::Done(done) => {
                let stats = &done.output.stats;
                println!(
                    "answer: {}\nfinish {:?}; {} tokens in {} forwards, {} forced by the schema",
                    tokenizer.decode(&tokens, true)?,
                    done.output.finish,
                    tokens.len(),
                    stats.target_calls,
                    stats.forced_accepted
                );
            }
            Event::Failed(e) => return Err(e.into()),
        }
    }
    engine.shutdown()?;
    Ok(())
}
