//! `serve`'s request defaults as mlx_lm.server takes them: `--temp`,
//! `--max-tokens`, a chat template of the operator's with variables under
//! each request's own (`--chat-template`, `--chat-template-args`), and a
//! draft model as the default provider (`--draft-model`,
//! `--num-draft-tokens`, which a request's top-level `num_draft_tokens`
//! overrides as mlx_lm.server's does, and its `draft_model` may name but
//! not replace), an adapter on the served model (`--adapter-path`,
//! which a request's `adapters` may name but not replace); and what a
//! request whose conversation outgrows the context gets: a 400, or under
//! the Responses API's `truncation: "auto"` its oldest turns dropped.

mod common;

use serde_json::json;

#[test]
fn requests_get_the_operators_defaults() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = tmp.path().join("tiny");
    std::fs::create_dir(&model).expect("mkdir");
    common::tiny_llama_with_template(&model, "{{ messages[0].content }}");
    let adapter = tmp.path().join("adapter");
    std::fs::create_dir(&adapter).expect("mkdir");
    spec_fixtures::adapter::LoraAdapter::lora(1, 5)
        .write(&adapter, &spec_fixtures::llama::Llama::tiny(7))
        .expect("adapter");
    let adapter = adapter.to_str().expect("utf-8");
    let model = model.to_str().expect("utf-8");
    let template = "{% for m in messages %}{{ m.content }} {% endfor %}{{ extra }}";
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mlx-spec"))
        .args(["serve", "--port", "0", "--model", model, "--temp", "0"])
        .args(["--max-tokens", "3", "--chat-template", template])
        .args(["--chat-template-args", r#"{"extra": "w7 w8"}"#])
        .args(["--draft-model", model, "--num-draft-tokens", "2"])
        .args(["--adapter-path", adapter])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the server");
    let addr = common::served_address(&mut child);
    let _served = common::Served(child);
    let chat = |extra: serde_json::Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "w1 w2"}]});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        let (status, body) = common::http_post(&addr, "/v1/chat/completions", &body);
        assert_eq!(status, 200, "{body}");
        body
    };
    let plain = chat(json!({}));
    // The operator's template and variables: "w1 w2 w7 w8".
    assert_eq!(plain["usage"]["prompt_tokens"], 4, "{plain}");
    assert_eq!(
        plain["usage"]["completion_tokens"], 3,
        "--max-tokens: {plain}"
    );
    assert_eq!(plain["speculative"]["provider"], "draft-model", "{plain}");
    // The request's own variables win; its own temperature 0 is the default's.
    let own = chat(json!({"chat_template_kwargs": {"extra": "w9"}}));
    assert_eq!(own["usage"]["prompt_tokens"], 3, "{own}");
    let greedy = chat(json!({"temperature": 0, "max_tokens": 3}));
    assert_eq!(
        greedy["choices"][0]["message"]["content"],
        plain["choices"][0]["message"]["content"]
    );
    // mlx_lm.server's per-request adapter: the served one is taken,
    // another is a 400 naming the field (no request makes it read a path).
    let named = chat(json!({"adapters": adapter}));
    assert_eq!(
        named["choices"][0]["message"]["content"],
        plain["choices"][0]["message"]["content"]
    );
    let body = json!({"messages": [{"role": "user", "content": "w1"}], "adapters": "/etc"});
    let (status, refused) = common::http_post(&addr, "/v1/chat/completions", &body);
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["param"], "adapters", "{refused}");
    // mlx_lm.server's top-level `num_draft_tokens` sets the default
    // speculation's count over `--num-draft-tokens`: with the unadapted
    // model drafting for the adapted one, 5 a round take 5 target forwards
    // where 2 take 7.
    let calls = |body: serde_json::Value| chat(body)["speculative"]["target_calls"].clone();
    let two = calls(json!({"max_tokens": 12}));
    let five = calls(json!({"max_tokens": 12, "num_draft_tokens": 5}));
    assert!(
        five.as_u64() < two.as_u64(),
        "5 drafts a round: {five} calls, 2: {two}"
    );
    // Its per-request `draft_model`: the loaded one (or `default_model`) is
    // taken, another path is a 400 naming the field.
    for named in [model, "default_model"] {
        let same = chat(json!({"draft_model": named}));
        assert_eq!(same["speculative"]["provider"], "draft-model", "{same}");
    }
    let body = json!({"messages": [{"role": "user", "content": "w1"}], "draft_model": "/etc"});
    let (status, refused) = common::http_post(&addr, "/v1/chat/completions", &body);
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["param"], "draft_model", "{refused}");
    let body = json!({"messages": [{"role": "user", "content": "w1"}], "num_draft_tokens": 0});
    let (status, refused) = common::http_post(&addr, "/v1/chat/completions", &body);
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["param"], "num_draft_tokens", "{refused}");
    let sampled = chat(json!({"temperature": 1.5, "max_tokens": 12, "seed": 3}));
    let longer = chat(json!({"max_tokens": 12}));
    assert_ne!(
        sampled["choices"][0]["message"]["content"], longer["choices"][0]["message"]["content"],
        "a sampled answer differs from the greedy default"
    );
}

#[test]
fn out_of_range_defaults_stop_the_server_naming_the_flag() {
    let (ok, _, stderr) = common::mlx_spec(&["serve", "--port", "0", "--temp", "2.5"]);
    assert!(!ok && stderr.contains("--temp"), "{stderr}");
    let (ok, _, stderr) = common::mlx_spec(&["serve", "--port", "0", "--num-draft-tokens", "0"]);
    assert!(!ok && stderr.contains("--num-draft-tokens"), "{stderr}");
}

/// A conversation past the tiny model's 512 positions: refused as too long,
/// or with `truncation: "auto"` answered without its oldest turn (counted
/// the same by `input_tokens`); one that fits is untouched, and a last
/// user turn too long alone is refused either way.
#[test]
fn truncation_auto_drops_the_oldest_turns_to_fit_the_context() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = tmp.path().join("tiny");
    std::fs::create_dir(&model).expect("mkdir");
    // Each message is its role (one unknown word) and its words.
    let template = "{% for m in messages %}{{ m.role }} {{ m.content }} {% endfor %}";
    common::tiny_llama_with_template(&model, template);
    let config_path = model.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config_path).expect("config")).expect("json");
    config["max_position_embeddings"] = json!(512);
    std::fs::write(&config_path, config.to_string()).expect("config");
    let (_served, addr) = common::serve(&["--model", model.to_str().expect("utf-8")]);
    let words = |n: usize| vec!["w3"; n].join(" ");
    let long = json!([
        {"role": "user", "content": words(150)},
        {"role": "assistant", "content": words(150)},
        {"role": "user", "content": words(150)},
        {"role": "assistant", "content": words(150)},
        {"role": "user", "content": "w1 w2 w3"},
    ]);
    let ask = |input: &serde_json::Value, truncation: &str| {
        let body = json!({"input": input, "max_output_tokens": 8, "temperature": 0,
            "truncation": truncation, "store": false});
        let answer = common::http_post(&addr, "/v1/responses", &body);
        let counted = common::http_post(&addr, "/v1/responses/input_tokens", &body);
        (answer, counted)
    };
    let ((status, refused), (_, all)) = ask(&long, "disabled");
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["param"], "max_output_tokens", "{refused}");
    assert_eq!(all["input_tokens"], 4 * 151 + 4, "{all}");
    let ((status, answered), (_, counted)) = ask(&long, "auto");
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["truncation"], "auto");
    // The first user turn and its answer went: 151 + 151 + 4 tokens left.
    assert_eq!(answered["usage"]["input_tokens"], 2 * 151 + 4, "{answered}");
    assert_eq!(counted["input_tokens"], 2 * 151 + 4, "{counted}");
    let short = json!([{"role": "user", "content": words(20)}]);
    let ((status, kept), _) = ask(&short, "auto");
    assert_eq!(status, 200, "{kept}");
    assert_eq!(kept["usage"]["input_tokens"], 21, "{kept}");
    let alone = json!([{"role": "user", "content": words(600)}]);
    let ((status, too_long), _) = ask(&alone, "auto");
    assert_eq!(status, 400, "{too_long}");
}

/// `--prefill-step-size` (mlx-lm's name) sets the prefill grid: on GLM,
/// whose prefill bits depend on the split, a prompt sharing 7 tokens with
/// an earlier one is served from the prefix cache only up to that grid's
/// last boundary inside them, 4 tokens with steps of 4 and none with the
/// default 512; 0 stops the server naming the flag.
#[test]
fn the_prefill_step_sets_the_grid_the_prefix_cache_hits_on() {
    let dir = common::tiny_glm();
    let model = dir.path().to_str().expect("utf-8");
    let ask = |prompt: &str| json!({"prompt": prompt, "max_tokens": 2, "temperature": 0});
    let cached = |step: &[&str]| {
        let (_served, addr) = common::serve(&[&["--model", model][..], step].concat());
        let mut cached = Vec::new();
        for prompt in [
            "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10",
            "w1 w2 w3 w4 w5 w6 w7 w30 w31 w32",
        ] {
            let (status, body) = common::http_post(&addr, "/v1/completions", &ask(prompt));
            assert_eq!(status, 200, "{body}");
            cached.push(body["usage"]["prompt_tokens_details"]["cached_tokens"].clone());
        }
        cached
    };
    assert_eq!(cached(&["--prefill-step-size", "4"]), [0, 4]);
    assert_eq!(cached(&[]), [0, 0]);
    let (ok, _, stderr) = common::mlx_spec(&["serve", "--port", "0", "--prefill-step-size", "0"]);
    assert!(!ok && stderr.contains("--prefill-step-size"), "{stderr}");
}
