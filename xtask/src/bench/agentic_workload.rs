//! The `bench agentic` workload: the requests an agent loop sends, generated
//! from a fixed seed. Each session handles one customer-support ticket in
//! four steps, in order: pick a tool call (the tool schema in the prompt, as
//! agents send it), write SQL against a fixed schema (in the prompt), make a
//! small code edit and return the function, and summarize the ticket in a
//! fixed structure. The per-ticket values (names, ids, cities, dates,
//! amounts, identifiers) vary; the instructions, schemas and answer shapes
//! repeat, as they do in real agent traffic.

use spec_fixtures::rng::SplitMix64;

/// The tools the agent may call, as a JSON schema list in every tool prompt.
const TOOLS: &str = r#"[
  {"name": "get_order_status", "description": "Look up an order", "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}},
  {"name": "refund_order", "description": "Refund part or all of an order", "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}, "reason": {"type": "string"}}, "required": ["order_id", "amount", "reason"]}},
  {"name": "search_products", "description": "Search the catalog", "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "max_results": {"type": "integer"}}, "required": ["query"]}},
  {"name": "schedule_callback", "description": "Book a phone call with a customer", "parameters": {"type": "object", "properties": {"customer_id": {"type": "string"}, "time": {"type": "string", "description": "ISO 8601"}}, "required": ["customer_id", "time"]}}
]"#;

/// The database every SQL prompt targets.
const SCHEMA: &str = "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT, city TEXT, created_at DATE);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), total REAL, status TEXT, created_at DATE);
CREATE TABLE order_items (order_id INTEGER REFERENCES orders(id), product_id INTEGER REFERENCES products(id), quantity INTEGER, price REAL);
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT, category TEXT, price REAL);";

const NAMES: &[&str] = &[
    "Alice Martin",
    "Bruno Costa",
    "Chen Wei",
    "Dana Novak",
    "Emeka Obi",
    "Fatima Zahra",
    "Gustav Lind",
    "Hana Sato",
    "Ivan Petrov",
    "Julia Rossi",
    "Kofi Mensah",
    "Lena Vogel",
];
const CITIES: &[&str] = &[
    "Lisbon", "Osaka", "Denver", "Lagos", "Krakow", "Lyon", "Austin", "Porto",
];
const CATEGORIES: &[&str] = &["kitchen", "garden", "toys", "audio", "office"];
const STATUSES: &[&str] = &["shipped", "pending", "delivered", "returned"];
const PRODUCTS: &[&str] = &[
    "espresso grinder",
    "garden hose",
    "wireless headphones",
    "standing desk",
    "puzzle set",
    "desk lamp",
];
const PROBLEMS: &[&str] = &[
    "has not arrived after two weeks",
    "arrived damaged",
    "was charged twice",
    "is missing one item",
];
const MONTHS: &[&str] = &["January", "March", "May", "July", "September", "November"];
/// What the edited function fetches.
const RESOURCES: &[&str] = &["order", "invoice", "shipment", "return"];
/// (old, new) identifier renames for the code edits.
const RENAMES: &[(&str, &str)] = &[
    ("resp", "response"),
    ("data", "payload"),
    ("url", "endpoint"),
    ("items", "line_items"),
];

fn pick<'a>(rng: &mut SplitMix64, from: &[&'a str]) -> &'a str {
    from[rng.below(from.len() as u64) as usize]
}

/// One ticket's values.
struct Ticket {
    name: &'static str,
    customer: u64,
    order: u64,
    city: &'static str,
    product: &'static str,
    problem: &'static str,
    amount: u64,
}

fn tool_call(t: &Ticket) -> String {
    format!(
        "You are a support agent that acts by calling tools. Available tools (JSON schema):\n{TOOLS}\n\n\
         Reply with exactly one tool call as JSON: {{\"name\": ..., \"arguments\": {{...}}}} and nothing else.\n\n\
         Ticket from {} (customer id C{}): \"My order #{} ({}) {}. Please help.\"",
        t.name, t.customer, t.order, t.product, t.problem
    )
}

fn sql(t: &Ticket, rng: &mut SplitMix64) -> String {
    let question = match rng.below(4) {
        0 => format!(
            "the total amount each customer in {} spent in {} 2024, highest first",
            t.city,
            pick(rng, MONTHS)
        ),
        1 => format!(
            "the {} best-selling products by quantity in the category '{}'",
            3 + rng.below(5),
            pick(rng, CATEGORIES)
        ),
        2 => format!(
            "every order of customer {} with status '{}', newest first",
            t.customer,
            pick(rng, STATUSES)
        ),
        _ => format!(
            "customers in {} with more than {} orders, with their order count",
            t.city,
            2 + rng.below(4)
        ),
    };
    format!(
        "You write SQLite queries for the support team. Schema:\n{SCHEMA}\n\n\
         Return only the SQL query, no explanation.\n\nQuestion: {question}."
    )
}

fn code_edit(t: &Ticket, rng: &mut SplitMix64) -> String {
    let (old, new) = RENAMES[rng.below(RENAMES.len() as u64) as usize];
    let timeout = 5 + 5 * rng.below(6);
    let resource = pick(rng, RESOURCES);
    let code = format!(
        "def fetch_{resource}(item_id, session):\n    \
         url = f\"https://api.example.com/{resource}s/{{item_id}}\"\n    \
         resp = session.get(url, timeout=10)\n    \
         resp.raise_for_status()\n    \
         data = resp.json()\n    \
         items = [i for i in data[\"items\"] if i[\"quantity\"] > 0]\n    \
         return {{\"id\": data[\"id\"], \"status\": data[\"status\"], \"items\": items}}\n"
    );
    let task = if rng.below(2) == 0 {
        format!("Rename the variable `{old}` to `{new}` everywhere.")
    } else {
        format!("Change the timeout to {timeout} seconds.")
    };
    format!(
        "Edit this function from the support service (ticket for order #{}). {task} \
         Return the whole edited function in a Python code block and nothing else.\n\n```python\n{code}```",
        t.order
    )
}

fn summary(t: &Ticket, rng: &mut SplitMix64) -> String {
    let status = pick(rng, STATUSES);
    let day = 1 + rng.below(28);
    format!(
        "Summarize this support case for the ticket log. Use exactly this format:\n\
         customer: <name>\norder: <order id>\nissue: <one line>\nactions: <what the agent did>\nnext_step: <one line>\n\n\
         Case: {} (customer id C{}, {}) wrote that order #{} ({}) {}. \
         get_order_status returned {{\"order_id\": \"{}\", \"status\": \"{status}\", \"updated\": \"2024-10-{day:02}\"}}. \
         The agent offered a refund of {} EUR.",
        t.name, t.customer, t.city, t.order, t.product, t.problem, t.order, t.amount
    )
}

/// `sessions` tickets of four steps each (tool call, SQL, code edit,
/// summary), in the order an agent loop sends them.
pub fn requests(seed: u64, sessions: usize) -> Vec<String> {
    let mut rng = SplitMix64::keyed(seed, "bench agentic");
    let mut out = Vec::with_capacity(sessions * 4);
    for _ in 0..sessions {
        let ticket = Ticket {
            name: pick(&mut rng, NAMES),
            customer: 1000 + rng.below(9000),
            order: 50_000 + rng.below(50_000),
            city: pick(&mut rng, CITIES),
            product: pick(&mut rng, PRODUCTS),
            problem: pick(&mut rng, PROBLEMS),
            amount: 5 + rng.below(120),
        };
        out.push(tool_call(&ticket));
        out.push(sql(&ticket, &mut rng));
        out.push(code_edit(&ticket, &mut rng));
        out.push(summary(&ticket, &mut rng));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_is_fixed_by_its_seed_and_varies_per_ticket() {
        let a = requests(7, 10);
        assert_eq!(a.len(), 40);
        assert_eq!(a, requests(7, 10), "deterministic");
        assert_ne!(a, requests(8, 10));
        // Every tool prompt carries the schema; the tickets differ.
        assert!(a.iter().step_by(4).all(|p| p.contains("\"refund_order\"")));
        assert!(a
            .iter()
            .skip(1)
            .step_by(4)
            .all(|p| p.contains("CREATE TABLE orders")));
        let tickets: std::collections::BTreeSet<&String> = a.iter().step_by(4).collect();
        assert!(
            tickets.len() >= 8,
            "{} distinct tool prompts",
            tickets.len()
        );
    }
}
