//! The prompts and constraints of gate `structured` and `cargo xtask bench
//! structured`, written for them: short extraction tasks whose JSON
//! schemas bound every string and number, so a constrained answer ends well
//! inside the token budget.

use std::collections::BTreeMap;

use run_protocol::structured::{Case, Grammar, RunConfig};
use serde_json::json;

/// A JSON-schema extraction case: the user message and the schema.
fn schema_case(name: &str, prompt: &str, schema: serde_json::Value) -> Case {
    Case {
        name: name.to_owned(),
        prompt: prompt.to_owned(),
        chat: true,
        grammar: Grammar::JsonSchema {
            schema: schema.to_string(),
        },
    }
}

/// A bounded string.
fn text(max: usize) -> serde_json::Value {
    json!({"type": "string", "maxLength": max})
}

/// An object schema with every property required and no others.
fn object(properties: &[(&str, serde_json::Value)]) -> serde_json::Value {
    let props: serde_json::Map<String, serde_json::Value> = properties
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    let required: Vec<&str> = properties.iter().map(|(k, _)| *k).collect();
    json!({
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": false
    })
}

/// The gate's cases: JSON schemas (strings, integers, enums, booleans,
/// arrays), any JSON object, a Lark grammar and a regex.
pub fn gate() -> Vec<Case> {
    vec![
        schema_case(
            "person",
            "Alice Smith is 31 and lives in Paris. Give her details as JSON.",
            object(&[
                ("name", text(16)),
                (
                    "age",
                    json!({"type": "integer", "minimum": 0, "maximum": 120}),
                ),
                ("city", text(16)),
            ]),
        ),
        schema_case(
            "order",
            "Order 1182: two lamps and a rug, shipped by express. Summarize it as JSON.",
            object(&[
                (
                    "status",
                    json!({"enum": ["pending", "shipped", "delivered"]}),
                ),
                (
                    "items",
                    json!({"type": "array", "items": text(10), "minItems": 1, "maxItems": 3}),
                ),
                ("express", json!({"type": "boolean"})),
            ]),
        ),
        Case {
            name: "object".to_owned(),
            prompt: "Describe a small cat as a JSON object with two fields.".to_owned(),
            chat: true,
            grammar: Grammar::JsonObject,
        },
        Case {
            name: "lark".to_owned(),
            prompt: "What is 12 times 12? Answer with one sentence.".to_owned(),
            chat: true,
            grammar: Grammar::Lark {
                grammar: "start: \"The answer is \" NUMBER \".\"\nNUMBER: /[0-9]{1,4}/\n"
                    .to_owned(),
            },
        },
        Case {
            name: "regex".to_owned(),
            prompt: "Is the sky blue on a clear day? Say yes or no, then why.".to_owned(),
            chat: true,
            grammar: Grammar::Regex {
                regex: "(yes|no), because [a-z ]{1,30}\\.".to_owned(),
            },
        },
    ]
}

/// Schema-heavy extraction prompts for the benchmark (20+): many keys,
/// enums and booleans, short values.
pub fn bench() -> Vec<Case> {
    let contact = object(&[
        ("first_name", text(12)),
        ("last_name", text(12)),
        ("email", text(24)),
        ("phone", text(16)),
        ("company", text(16)),
        ("is_customer", json!({"type": "boolean"})),
    ]);
    let event = object(&[
        ("title", text(20)),
        (
            "day",
            json!({"enum": ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]}),
        ),
        (
            "hour",
            json!({"type": "integer", "minimum": 0, "maximum": 23}),
        ),
        (
            "minutes",
            json!({"type": "integer", "minimum": 0, "maximum": 59}),
        ),
        ("online", json!({"type": "boolean"})),
        (
            "attendees",
            json!({"type": "integer", "minimum": 1, "maximum": 500}),
        ),
    ]);
    let product = object(&[
        ("product_name", text(16)),
        (
            "category",
            json!({"enum": ["electronics", "furniture", "clothing", "food", "toys"]}),
        ),
        (
            "price_in_cents",
            json!({"type": "integer", "minimum": 0, "maximum": 1000000}),
        ),
        ("in_stock", json!({"type": "boolean"})),
        (
            "warranty_years",
            json!({"type": "integer", "minimum": 0, "maximum": 10}),
        ),
        ("color", text(10)),
    ]);
    let review = object(&[
        (
            "sentiment",
            json!({"enum": ["positive", "neutral", "negative"]}),
        ),
        (
            "stars",
            json!({"type": "integer", "minimum": 1, "maximum": 5}),
        ),
        ("mentions_price", json!({"type": "boolean"})),
        ("mentions_delivery", json!({"type": "boolean"})),
        ("would_recommend", json!({"type": "boolean"})),
        ("summary", text(24)),
    ]);
    let texts: [(&str, &serde_json::Value, &[&str]); 4] = [
        (
            "contact",
            &contact,
            &[
                "Hi, I'm John Carter from Acme Tools, reach me at john@acme.io or 555-0101. We already buy from you.",
                "Contact: Mei Lin, Lin Design, mei@lindesign.com, +44 20 7946 0958, new lead.",
                "Please add Omar Haddad (Haddad & Sons) to the list: omar@haddad.net, 555-0199; he is not a customer yet.",
                "Sara Novak, purchasing at Brightline, sara.novak@brightline.org, phone 555-0142, long-time client.",
                "From the card: Luis Ortega, Ortega Farms, luis@ortega.farm, 555-0177. First contact.",
                "Anna Berg, anna@bergstudio.se, +46 8 123 456, Berg Studio, existing customer since 2019.",
            ],
        ),
        (
            "event",
            &event,
            &[
                "Team sync every Tuesday at 9:30, on Zoom, about 12 people.",
                "The launch party is on Friday at 19:00 at the office, 80 guests expected.",
                "Board meeting Monday 14:15 in room 4, eight attendees.",
                "Webinar on Thursday at 16:45, online, 300 registrations.",
                "Saturday 10:00 community cleanup at the park, around 40 volunteers.",
                "Wednesday 11:05 design review, remote, 6 people.",
            ],
        ),
        (
            "product",
            &product,
            &[
                "The Aero desk lamp costs $39.99, comes in black, two-year warranty, currently in stock.",
                "Oak dining table, natural color, $849, five years of warranty, sold out.",
                "Kids' wooden train set, red, $24.50, no warranty, available now.",
                "Noise-cancelling headphones, silver, $199, one-year warranty, back in stock next week.",
                "Organic coffee beans, 1 kg, $18, in stock, no warranty, brown bag.",
            ],
        ),
        (
            "review",
            &review,
            &[
                "Great blender, arrived a day early and the price was fair. Five stars, would buy again.",
                "The chair is fine but shipping took three weeks. Three stars.",
                "Broke after two days and support never answered. One star, avoid.",
                "Decent headphones for the money, nothing special. Would not recommend over the older model.",
            ],
        ),
    ];
    let mut cases = Vec::new();
    for (kind, schema, prompts) in texts {
        for (i, p) in prompts.iter().enumerate() {
            cases.push(schema_case(
                &format!("{kind}-{i}"),
                &format!("Extract the {kind} fields as JSON.\n\n{p}"),
                (*schema).clone(),
            ));
        }
    }
    cases
}

/// A configuration: constrained unless `free`, with `provider` (its
/// options) and forced-token drafts as given.
pub fn config(
    name: &str,
    constrained: bool,
    provider: Option<&str>,
    forced_drafts: bool,
    seed: Option<u64>,
) -> RunConfig {
    RunConfig {
        name: name.to_owned(),
        constrained,
        provider: provider.map(str::to_owned),
        options: BTreeMap::new(),
        forced_drafts,
        seed,
    }
}
