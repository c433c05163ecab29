//! OpenAI's predicted outputs over loopback: a chat request's `prediction`
//! makes prompt lookup draft from it (the request names no speculation and
//! the server has no default), the answer is the one without it, token for
//! token, and usage reports the accepted and rejected prediction tokens; a
//! prediction the answer does not follow gives the same answer; a malformed
//! one is a 400 naming `prediction`. Suffix decoding drafts from it too.

mod common;

use serde_json::{json, Value};

/// A greedy chat of 40 tokens on `content` with `extra` fields; its answer
/// (a 200).
fn greedy_chat(addr: &str, content: &str, extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": content}],
        "max_tokens": 40, "temperature": 0});
    body.as_object_mut()
        .expect("object")
        .extend(extra.as_object().expect("object").clone());
    let (status, answer) = common::http_post(addr, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{body} -> {answer}");
    answer
}

#[test]
fn a_prediction_is_drafted_from_and_changes_no_token() {
    let tmp = tempfile::tempdir().expect("tempdir");
    common::tiny_llama_with_template(
        tmp.path(),
        "{% for m in messages %}{{ m.content }} {% endfor %}",
    );
    let model = tmp.path().to_str().expect("utf-8");
    // No --draft-provider: prompt lookup is loaded, requests run plainly.
    let (_served, addr) = common::serve(&["--model", model]);
    let chat = |extra: Value| greedy_chat(&addr, "w3 w4 w5", extra);
    let content = |a: &Value| {
        a["choices"][0]["message"]["content"]
            .as_str()
            .expect("text")
            .to_owned()
    };
    let plain = chat(json!({}));
    assert!(plain["speculative"].is_null(), "{plain}");
    assert!(
        plain["usage"]["completion_tokens_details"].is_null(),
        "{plain}"
    );
    let answer = content(&plain);

    let predicted = chat(json!({"prediction": {"type": "content", "content": answer}}));
    assert_eq!(content(&predicted), answer);
    assert_eq!(
        predicted["speculative"]["provider"], "prompt-lookup",
        "{predicted}"
    );
    let tokens = predicted["usage"]["completion_tokens"]
        .as_u64()
        .expect("tokens");
    let details = &predicted["usage"]["completion_tokens_details"];
    let accepted = details["accepted_prediction_tokens"]
        .as_u64()
        .expect("accepted");
    assert!(details["rejected_prediction_tokens"].is_u64(), "{details}");
    assert!(
        accepted * 4 >= tokens * 3,
        "accepted {accepted} of {tokens}: {predicted}"
    );
    assert!(
        predicted["speculative"]["target_calls"]
            .as_u64()
            .expect("calls")
            * 3
            <= tokens,
        "the prediction saved target forwards: {predicted}"
    );

    // Text parts, and a prediction the answer does not follow.
    let parts = json!({"type": "content", "content": [{"type": "text", "text": "w90 w91"}, {"type": "text", "text": " w92 w93"}]});
    assert_eq!(content(&chat(json!({ "prediction": parts }))), answer);

    for bad in [
        json!("w1 w2"),
        json!({"type": "text", "content": "w1"}),
        json!({"type": "content", "content": [{"type": "text", "text": 5}]}),
        json!({"type": "content"}),
    ] {
        let body = json!({"messages": [{"role": "user", "content": "w3"}], "max_tokens": 2, "prediction": bad});
        let (status, answer) = common::http_post(&addr, "/v1/chat/completions", &body);
        assert_eq!(
            (status, answer["error"]["param"].as_str()),
            (400, Some("prediction")),
            "{bad}"
        );
    }
}

/// Suffix decoding drafts from a prediction too (as a sequence of the
/// request's own tree): the same answer in fewer target forwards.
#[test]
fn suffix_decoding_drafts_from_a_prediction_too() {
    let tmp = tempfile::tempdir().expect("tempdir");
    common::tiny_llama_with_template(
        tmp.path(),
        "{% for m in messages %}{{ m.content }} {% endfor %}",
    );
    let model = tmp.path().to_str().expect("utf-8");
    // Suffix decoding is every request's speculation; its global tree off,
    // so the second request cannot draft from the first's answer.
    let (_served, addr) = common::serve(&[
        "--model",
        model,
        "--draft-provider",
        "suffix",
        "--draft-option",
        "suffix:max_tree_tokens=0",
    ]);
    let chat = |extra: Value| greedy_chat(&addr, "w7 w2", extra);
    let calls = |a: &Value| a["speculative"]["target_calls"].as_u64().expect("calls");
    let plain = chat(json!({}));
    assert_eq!(plain["speculative"]["provider"], "suffix", "{plain}");
    let answer = plain["choices"][0]["message"]["content"]
        .as_str()
        .expect("text")
        .to_owned();
    let predicted = chat(json!({"prediction": {"type": "content", "content": answer}}));
    assert_eq!(
        predicted["choices"][0]["message"]["content"],
        answer.as_str()
    );
    assert_eq!(
        predicted["speculative"]["provider"], "suffix",
        "{predicted}"
    );
    assert!(
        calls(&predicted) * 2 < calls(&plain),
        "with the prediction {} target forwards, without {}",
        calls(&predicted),
        calls(&plain)
    );
}
