//! The responses a server keeps for `previous_response_id` and `GET
//! /v1/responses/{id}`: in memory, per tenant (a key never sees or
//! continues another key's responses, and cannot tell whether one
//! exists), within a byte budget (`--response-store-bytes`), oldest
//! evicted first. Each entry holds its own turn (the input it was sent and
//! the output it gave, as template messages) and the id it continued: a
//! conversation is its chain, so a long one costs its length once.

use std::collections::{HashMap, VecDeque};

use parking_lot::Mutex;
use serde_json::Value;
use spec_text::Message;

/// One kept response.
#[derive(Debug, Clone)]
pub struct Stored {
    /// Who may read or continue it (`None`: the server has no keys).
    pub tenant: Option<String>,
    /// The response object as answered.
    pub response: Value,
    /// The response this one continued.
    pub previous: Option<String>,
    /// This turn's input and output messages, instructions left out (a
    /// later request's own instructions replace them).
    pub messages: Vec<Message>,
    /// This turn's input items as `GET .../input_items` lists them.
    pub input_items: Vec<Value>,
}

impl Stored {
    /// What the entry counts against the budget: its text and JSON.
    fn bytes(&self) -> usize {
        let messages: usize = self
            .messages
            .iter()
            .map(|m| {
                m.content.len()
                    + m.reasoning_content.as_ref().map_or(0, String::len)
                    + m.tool_calls
                        .as_ref()
                        .map_or(0, |c| c.iter().map(|v| v.to_string().len()).sum())
                    + 64
            })
            .sum();
        let items: usize = self.input_items.iter().map(|i| i.to_string().len()).sum();
        self.response.to_string().len() + messages + items + 128
    }
}

/// Why a conversation cannot be rebuilt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// No response of this id for this tenant (never stored, deleted, or
    /// another tenant's).
    NotFound(String),
    /// An earlier response of the chain was evicted or deleted.
    Broken { id: String, missing: String },
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<String, (Stored, usize)>,
    /// Ids, oldest first.
    order: VecDeque<String>,
    bytes: usize,
}

/// The store.
#[derive(Debug)]
pub struct ResponseStore {
    budget: usize,
    inner: Mutex<Inner>,
}

impl ResponseStore {
    /// A store of at most `budget` bytes; 0 keeps nothing.
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Whether anything is kept at all.
    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// Keeps `entry` as `id`, evicting the oldest entries past the budget.
    /// An entry larger than the whole budget is not kept.
    pub fn put(&self, id: &str, entry: Stored) {
        let size = entry.bytes();
        if size > self.budget {
            tracing::debug!(
                id,
                size,
                "a response larger than the store's budget was not kept"
            );
            return;
        }
        let mut inner = self.inner.lock();
        if let Some((_, old)) = inner.entries.remove(id) {
            inner.bytes -= old;
            inner.order.retain(|k| k != id);
        }
        while inner.bytes + size > self.budget {
            let Some(oldest) = inner.order.pop_front() else {
                break;
            };
            if let Some((_, freed)) = inner.entries.remove(&oldest) {
                inner.bytes -= freed;
            }
        }
        inner.bytes += size;
        inner.order.push_back(id.to_owned());
        inner.entries.insert(id.to_owned(), (entry, size));
    }

    /// The response object `id`, if `tenant` may read it.
    pub fn get(&self, tenant: Option<&str>, id: &str) -> Option<Value> {
        self.read(tenant, id, |e| e.response.clone())
    }

    /// The input items of `id`, if `tenant` may read it.
    pub fn input_items(&self, tenant: Option<&str>, id: &str) -> Option<Vec<Value>> {
        self.read(tenant, id, |e| e.input_items.clone())
    }

    /// What `f` takes of entry `id`, if `tenant` may read it.
    fn read<T>(&self, tenant: Option<&str>, id: &str, f: impl FnOnce(&Stored) -> T) -> Option<T> {
        let inner = self.inner.lock();
        inner
            .entries
            .get(id)
            .filter(|(e, _)| e.tenant.as_deref() == tenant)
            .map(|(e, _)| f(e))
    }

    /// Forgets `id`; whether `tenant` had it.
    pub fn delete(&self, tenant: Option<&str>, id: &str) -> bool {
        let mut inner = self.inner.lock();
        let owned = inner
            .entries
            .get(id)
            .is_some_and(|(e, _)| e.tenant.as_deref() == tenant);
        if owned {
            if let Some((_, size)) = inner.entries.remove(id) {
                inner.bytes -= size;
            }
            inner.order.retain(|k| k != id);
        }
        owned
    }

    /// The messages of the conversation ending with `id`, oldest first.
    pub fn conversation(&self, tenant: Option<&str>, id: &str) -> Result<Vec<Message>, Missing> {
        let inner = self.inner.lock();
        let mine = |k: &str| {
            inner
                .entries
                .get(k)
                .map(|(e, _)| e)
                .filter(|e| e.tenant.as_deref() == tenant)
        };
        let mut turns = Vec::new();
        let mut next = Some(id.to_owned());
        while let Some(at) = next {
            let Some(entry) = mine(&at) else {
                return Err(if at == id {
                    Missing::NotFound(at)
                } else {
                    Missing::Broken {
                        id: id.to_owned(),
                        missing: at,
                    }
                });
            };
            turns.push(&entry.messages);
            // Each id was stored after the one it continued: a chain never
            // comes back to itself, but a bound costs nothing.
            if turns.len() > inner.entries.len() {
                break;
            }
            next = entry.previous.clone();
        }
        Ok(turns.into_iter().rev().flatten().cloned().collect())
    }

    /// Bytes held now.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.inner.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn entry(tenant: Option<&str>, previous: Option<&str>, text: &str) -> Stored {
        Stored {
            tenant: tenant.map(str::to_owned),
            response: json!({"id": "x"}),
            previous: previous.map(str::to_owned),
            messages: vec![
                Message::new("user", text),
                Message::assistant(format!("re {text}")),
            ],
            input_items: vec![json!({"id": "msg_1", "type": "message"})],
        }
    }

    #[test]
    fn a_chain_rebuilds_oldest_first_for_its_tenant_only() {
        let store = ResponseStore::new(1 << 20);
        store.put("a", entry(Some("k1"), None, "one"));
        store.put("b", entry(Some("k1"), Some("a"), "two"));
        let texts: Vec<String> = store
            .conversation(Some("k1"), "b")
            .expect("the chain")
            .into_iter()
            .map(|m| m.content)
            .collect();
        assert_eq!(texts, ["one", "re one", "two", "re two"]);
        // Another tenant sees nothing, not even that it exists.
        assert_eq!(
            store.conversation(Some("k2"), "b"),
            Err(Missing::NotFound("b".into()))
        );
        assert_eq!(store.get(Some("k2"), "b"), None);
        assert_eq!(store.input_items(Some("k2"), "b"), None);
        assert_eq!(store.input_items(Some("k1"), "b").map(|i| i.len()), Some(1));
        assert!(!store.delete(Some("k2"), "b"));
        assert!(store.get(Some("k1"), "b").is_some());
        assert_eq!(
            store.conversation(None, "a"),
            Err(Missing::NotFound("a".into()))
        );
    }

    #[test]
    fn a_deleted_link_breaks_the_chain_by_name() {
        let store = ResponseStore::new(1 << 20);
        store.put("a", entry(None, None, "one"));
        store.put("b", entry(None, Some("a"), "two"));
        assert!(store.delete(None, "a"));
        assert!(!store.delete(None, "a"));
        assert_eq!(
            store.conversation(None, "b"),
            Err(Missing::Broken {
                id: "b".into(),
                missing: "a".into()
            })
        );
    }

    #[test]
    fn the_budget_evicts_oldest_first_and_is_never_passed() {
        let one = entry(None, None, &"x".repeat(1000)).bytes();
        let store = ResponseStore::new(one * 3 + one / 2);
        for i in 0..10 {
            store.put(&format!("r{i}"), entry(None, None, &"x".repeat(1000)));
            assert!(store.bytes() <= one * 3 + one / 2);
        }
        assert!(store.get(None, "r6").is_none());
        assert!(["r7", "r8", "r9"]
            .iter()
            .all(|id| store.get(None, id).is_some()));
        // Larger than everything: not kept, nothing evicted for it.
        store.put("big", entry(None, None, &"x".repeat(one * 4)));
        assert!(store.get(None, "big").is_none() && store.input_items(None, "big").is_none());
        assert!(store.get(None, "r7").is_some());
        // A zero budget keeps nothing.
        let off = ResponseStore::new(0);
        off.put("a", entry(None, None, "one"));
        assert!(!off.enabled() && off.get(None, "a").is_none());
    }
}
