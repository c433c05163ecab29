//! A request's several choices over loopback: chat's and completions' `n`
//! (a seeded request's choice `i` samples from `seed + i`, so each choice
//! is what a one-choice request with that seed answers, streamed or not),
//! completions' lists of prompts and token-id prompts, `echo` (with
//! `logprobs`: the prompt scored, alone with `max_tokens: 0`), `best_of` (the `n`
//! best of its seeded candidates per token), `suffix` refused where
//! they would change the answer, usage counting each prompt once (and the
//! prompt prefilled once); without a seed a request samples afresh; a
//! streaming client that leaves frees every choice's row.

use std::collections::BTreeMap;
use std::io::Read;

use serde_json::{json, Value};

mod common;

use common::{
    http_post, http_send, metric, served_address, stream_chunks, wait_engine_idle, Served,
};

fn start(dir: &std::path::Path) -> (Served, String) {
    common::tiny_llama_with_template(dir, "{% for m in messages %}{{ m.content }} {% endfor %}");
    let model = dir.to_str().expect("utf-8");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mlx-spec"))
        .args(["serve", "--port", "0", "--model", model, "--max-batch", "4"])
        .args(["--draft-provider", "prompt-lookup"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the server");
    let addr = served_address(&mut child);
    (Served(child), addr)
}

fn post(addr: &str, path: &str, body: &Value) -> Value {
    let (status, answer) = http_post(addr, path, body);
    assert_eq!(status, 200, "{body} -> {answer}");
    answer
}

/// A streamed answer's texts by choice index, each choice's finish reason,
/// and the usage chunk (the chunks' `text`, or chat's `delta.content`).
fn read_stream(
    addr: &str,
    path: &str,
    body: &Value,
) -> (BTreeMap<u64, String>, BTreeMap<u64, String>, Value) {
    let mut stream = http_send(addr, "POST", path, &body.to_string());
    let mut raw = String::new();
    stream.read_to_string(&mut raw).expect("read");
    let (mut texts, mut finishes, mut usage) = (BTreeMap::new(), BTreeMap::new(), Value::Null);
    let mut done = false;
    for data in raw.lines().filter_map(|l| l.strip_prefix("data: ")) {
        assert!(!done, "data after [DONE]");
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let chunk: Value = serde_json::from_str(data).expect("a JSON chunk");
        if !chunk["usage"].is_null() {
            assert!(usage.is_null(), "one usage chunk");
            usage = chunk["usage"].clone();
        }
        for c in chunk["choices"].as_array().expect("choices") {
            let i = c["index"].as_u64().expect("an index");
            let piece = c["text"]
                .as_str()
                .or(c["delta"]["content"].as_str())
                .unwrap_or("");
            texts.entry(i).or_insert_with(String::new).push_str(piece);
            if let Some(reason) = c["finish_reason"].as_str() {
                assert!(
                    finishes.insert(i, reason.to_owned()).is_none(),
                    "one finish for {i}"
                );
            }
        }
    }
    assert!(done, "the stream ends with [DONE]: {raw}");
    (texts, finishes, usage)
}

#[test]
fn each_choice_is_its_own_seeds_answer_and_usage_counts_the_prompt_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_server, addr) = start(tmp.path());
    let chat = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "w1 w2 w3 w1 w2"}],
            "max_tokens": 10, "temperature": 1.0});
        body.as_object_mut()
            .expect("object")
            .extend(extra.as_object().expect("object").clone());
        body
    };
    let three = post(
        &addr,
        "/v1/chat/completions",
        &chat(json!({"n": 3, "seed": 40})),
    );
    let choices = three["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3, "{three}");
    // The prompt is prefilled once: choices 1 and 2 start from choice 0's.
    let body = three["usage"]["prompt_tokens"].as_f64().expect("tokens") - 1.0;
    let hits = metric(&addr, "mlx_spec_prefix_cache_hits_total");
    let cached = metric(&addr, "mlx_spec_prefix_cache_tokens_total");
    assert_eq!((hits, cached), (2.0, 2.0 * body), "{three}");
    let mut completion_tokens = 0;
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
        let alone = post(
            &addr,
            "/v1/chat/completions",
            &chat(json!({"seed": 40 + i})),
        );
        assert_eq!(
            choice["message"], alone["choices"][0]["message"],
            "choice {i}"
        );
        assert_eq!(
            three["usage"]["prompt_tokens"],
            alone["usage"]["prompt_tokens"]
        );
        completion_tokens += alone["usage"]["completion_tokens"]
            .as_u64()
            .expect("tokens");
    }
    assert_eq!(
        three["usage"]["completion_tokens"], completion_tokens,
        "{three}"
    );
    assert_ne!(
        choices[0]["message"], choices[1]["message"],
        "seeds 40 and 41 differ"
    );
    assert_eq!(three["speculative"]["provider"], "prompt-lookup", "{three}");

    // Streamed: the same texts, a finish for each choice, usage once.
    let body = chat(
        json!({"n": 3, "seed": 40, "stream": true, "stream_options": {"include_usage": true}}),
    );
    let (texts, finishes, usage) = read_stream(&addr, "/v1/chat/completions", &body);
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(
            texts[&(i as u64)],
            choice["message"]["content"].as_str().expect("text")
        );
        assert_eq!(
            finishes[&(i as u64)],
            choice["finish_reason"].as_str().expect("reason")
        );
    }
    for count in ["prompt_tokens", "completion_tokens"] {
        assert_eq!(usage[count], three["usage"][count], "{usage}");
    }

    // Without a seed, the same request samples afresh.
    let a = post(
        &addr,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 16})),
    );
    let b = post(
        &addr,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 16})),
    );
    assert_ne!(a["choices"][0]["message"], b["choices"][0]["message"]);
}

#[test]
fn completions_take_lists_of_prompts_and_token_ids_and_echo_them() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_server, addr) = start(tmp.path());
    let alone = |prompt: Value| {
        post(
            &addr,
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 6, "temperature": 0}),
        )
    };
    // The word tokenizer: `w5` is id 5.
    let first = alone(json!("w5 w6 w7 w5 w6"));
    let second = alone(json!([9, 10, 11]));
    let body = json!({"prompt": [[5, 6, 7, 5, 6], [9, 10, 11]], "n": 2, "max_tokens": 6,
        "temperature": 0, "echo": true});
    let both = post(&addr, "/v1/completions", &body);
    let texts: Vec<&str> = both["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(|c| c["text"].as_str().expect("text"))
        .collect();
    let text = |a: &Value| a["choices"][0]["text"].as_str().expect("text").to_owned();
    let echoed = [
        format!("w5 w6 w7 w5 w6{}", text(&first)),
        format!("w9 w10 w11{}", text(&second)),
    ];
    assert_eq!(
        texts,
        [&echoed[0], &echoed[0], &echoed[1], &echoed[1]],
        "{both}"
    );
    let prompt_tokens = |a: &Value| a["usage"]["prompt_tokens"].as_u64().expect("tokens");
    assert_eq!(
        prompt_tokens(&both),
        prompt_tokens(&first) + prompt_tokens(&second),
        "{both}"
    );

    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let (streamed, finishes, _) = read_stream(&addr, "/v1/completions", &streamed_body);
    let streamed: Vec<&str> = streamed.values().map(String::as_str).collect();
    assert_eq!(streamed, texts, "streamed as whole");
    assert_eq!(finishes.len(), 4);

    for (bad, param) in [
        (json!({"prompt": []}), "prompt"),
        (json!({"prompt": [[]]}), "prompt"),
        (json!({"prompt": [96]}), "prompt"),
        (json!({"prompt": "w1", "n": 0}), "n"),
        (json!({"prompt": vec!["w1"; 9], "n": 8}), "n"),
        (
            json!({"prompt": "w1", "echo": true, "logprobs": 1, "stream": true}),
            "echo",
        ),
        (json!({"prompt": "w1", "suffix": "w2"}), "suffix"),
        (json!({"prompt": "w1", "n": 2, "best_of": 1}), "best_of"),
        (json!({"prompt": "w1", "best_of": 65}), "best_of"),
        (json!({"prompt": "w1", "best_of": "2"}), "best_of"),
        (json!({"prompt": ["w1", "w2"], "best_of": 33}), "best_of"),
        (
            json!({"prompt": "w1", "n": 2, "best_of": 3, "stream": true}),
            "best_of",
        ),
    ] {
        let (status, answer) = http_post(&addr, "/v1/completions", &bad);
        assert_eq!(
            (status, answer["error"]["param"].as_str()),
            (400, Some(param)),
            "{bad} -> {answer}"
        );
    }
    // What changes nothing is taken: an empty `suffix`, `best_of` equal to `n`.
    let same = json!({"prompt": "w1", "max_tokens": 2, "n": 2, "best_of": 2, "suffix": ""});
    assert_eq!(http_post(&addr, "/v1/completions", &same).0, 200);

    // `best_of` 4 with `n` 2: the 4 seeded candidates are the choices an
    // `n: 4` request gets; the 2 with the highest log-probability per
    // token come back, best first; usage counts all 4.
    let sampled = json!({"prompt": ["w1 w2", "w7"], "max_tokens": 6, "temperature": 1.5,
        "seed": 9, "logprobs": 0});
    let mut all = sampled.clone();
    all["n"] = json!(4);
    let all = post(&addr, "/v1/completions", &all);
    let mut best = sampled.clone();
    best["n"] = json!(2);
    best["best_of"] = json!(4);
    let best = post(&addr, "/v1/completions", &best);
    let candidates = all["choices"].as_array().expect("choices");
    let per_token = |c: &Value| {
        let lps: Vec<f64> = c["logprobs"]["token_logprobs"]
            .as_array()
            .expect("token log-probabilities")
            .iter()
            .map(|l| l.as_f64().expect("a number"))
            .collect();
        lps.iter().sum::<f64>() / lps.len() as f64
    };
    let mut expected = Vec::new();
    for group in candidates.chunks(4) {
        let mut ranked: Vec<&Value> = group.iter().collect();
        ranked.sort_by(|a, b| per_token(b).total_cmp(&per_token(a)));
        let distinct: std::collections::BTreeSet<&str> = group
            .iter()
            .map(|c| c["text"].as_str().unwrap_or(""))
            .collect();
        assert!(distinct.len() > 1, "the candidates must differ: {group:?}");
        expected.extend(ranked[..2].iter().map(|c| c["text"].clone()));
    }
    let got: Vec<Value> = best["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(|c| c["text"].clone())
        .collect();
    assert_eq!(got, expected, "{best}");
    let indices: Vec<u64> = best["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(|c| c["index"].as_u64().expect("an index"))
        .collect();
    assert_eq!(indices, [0, 1, 2, 3]);
    for count in ["prompt_tokens", "completion_tokens"] {
        assert_eq!(
            best["usage"][count], all["usage"][count],
            "every candidate counted once"
        );
    }
}

/// `echo` with `logprobs` (how lm-evaluation-harness scores a text): the
/// prompt's tokens come first in the legacy columns, the first without a
/// log-probability, each later one with the distribution a one-token
/// request on the prompt up to it sees; the answer's columns follow.
#[test]
fn echo_with_logprobs_scores_the_prompt_as_one_token_requests_see_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_server, addr) = start(tmp.path());
    let prompt = [5, 6, 7, 5, 6, 30];
    let scored = post(
        &addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 1, "temperature": 0, "echo": true, "logprobs": 2}),
    );
    let lps = &scored["choices"][0]["logprobs"];
    let column = |name: &str| lps[name].as_array().expect(name).clone();
    let ids: Vec<u64> = column("token_ids")
        .iter()
        .map(|v| v.as_u64().expect("id"))
        .collect();
    assert_eq!(ids.len(), prompt.len() + 1, "{lps}");
    assert_eq!(&ids[..prompt.len()], prompt.map(|t| t as u64));
    assert!(column("token_logprobs")[0].is_null() && column("top_logprobs")[0].is_null());
    let tokens = column("tokens");
    assert_eq!(tokens[0], "w5");
    let offsets: Vec<u64> = column("text_offset")
        .iter()
        .map(|v| v.as_u64().expect("offset"))
        .collect();
    assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{offsets:?}");
    for k in 1..=prompt.len() {
        let one = post(
            &addr,
            "/v1/completions",
            &json!({"prompt": prompt[..k], "max_tokens": 1, "temperature": 0, "logprobs": 2}),
        );
        let seen = &one["choices"][0]["logprobs"];
        assert_eq!(
            column("top_logprobs")[k],
            seen["top_logprobs"][0],
            "position {k}"
        );
        if k == prompt.len() {
            // The answer's token: the one-token request's own.
            assert_eq!(column("token_logprobs")[k], seen["token_logprobs"][0]);
            assert_eq!(ids[k], seen["token_ids"][0]);
        } else {
            let lp = column("token_logprobs")[k]
                .as_f64()
                .expect("a log-probability");
            assert!(lp < 0.0, "position {k}: {lp}");
        }
    }
    // `max_tokens: 0` (the legacy scoring request): the same prompt
    // columns, nothing generated; without `echo` and `logprobs` a 400.
    let only = post(
        &addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 0, "temperature": 0, "echo": true, "logprobs": 2}),
    );
    let choice = &only["choices"][0];
    for name in [
        "token_ids",
        "tokens",
        "token_logprobs",
        "top_logprobs",
        "text_offset",
    ] {
        assert_eq!(
            choice["logprobs"][name].as_array().expect(name)[..],
            column(name)[..prompt.len()],
            "{name}"
        );
    }
    // The echo alone: the prompt's text.
    assert_eq!(choice["text"], "w5 w6 w7 w5 w6 w30");
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(only["usage"]["completion_tokens"], 0);
    for body in [
        json!({"prompt": prompt, "max_tokens": 0, "echo": true}),
        json!({"prompt": prompt, "max_tokens": 0, "logprobs": 2}),
    ] {
        let (status, answer) = common::http_post(&addr, "/v1/completions", &body);
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer.to_string().contains("max_tokens"), "{answer}");
    }
}

#[test]
fn a_client_that_leaves_frees_every_choices_row() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_server, addr) = start(tmp.path());
    let body = json!({"prompt": "w1 w2", "n": 3, "max_tokens": 500, "temperature": 1.0,
        "stream": true, "speculative": false});
    let reader = stream_chunks(&addr, "/v1/completions", &body, 6);
    assert_eq!(
        metric(&addr, "mlx_spec_engine_held"),
        3.0,
        "three rows generating"
    );
    drop(reader);
    wait_engine_idle(&addr);
    assert!(
        metric(&addr, "mlx_spec_generated_tokens_total") < 3.0 * 500.0,
        "the choices did not run to their max_tokens"
    );
}
