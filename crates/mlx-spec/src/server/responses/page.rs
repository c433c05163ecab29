//! A page of a stored list, as OpenAI's list endpoints give one: `order`
//! (`desc` by default), `limit` (1 to 100, default 20), `after` / `before`
//! an item id; answered as `{object: "list", data, first_id, last_id,
//! has_more}`.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::server::api::ApiError;

/// A page of a list: order, size and cursors.
pub struct Page {
    descending: bool,
    limit: usize,
    after: Option<String>,
    before: Option<String>,
}

impl Page {
    pub fn of(query: &HashMap<String, String>) -> Result<Self, ApiError> {
        let descending = match query.get("order").map(String::as_str) {
            None | Some("desc") => true,
            Some("asc") => false,
            Some(other) => {
                return Err(ApiError::invalid(
                    format!("`order` must be asc or desc, got `{other}`"),
                    Some("order"),
                ))
            }
        };
        let limit = match query.get("limit") {
            None => 20,
            Some(n) => n
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=100).contains(n))
                .ok_or_else(|| {
                    ApiError::invalid(
                        format!("`limit` must be an integer from 1 to 100, got `{n}`"),
                        Some("limit"),
                    )
                })?,
        };
        Ok(Self {
            descending,
            limit,
            after: query.get("after").cloned(),
            before: query.get("before").cloned(),
        })
    }

    /// The page of `items` (oldest first) as a list object.
    pub fn list(&self, mut items: Vec<Value>) -> Result<Value, ApiError> {
        if self.descending {
            items.reverse();
        }
        let position = |cursor: &str, param: &'static str| {
            items
                .iter()
                .position(|i| i["id"].as_str() == Some(cursor))
                .ok_or_else(|| {
                    ApiError::invalid(
                        format!("`{param}`: no input item `{cursor}` in this response"),
                        Some(param),
                    )
                })
        };
        let start = match &self.after {
            Some(cursor) => position(cursor, "after")? + 1,
            None => 0,
        };
        let end = match &self.before {
            Some(cursor) => position(cursor, "before")?,
            None => items.len(),
        };
        let window = items.get(start..end.max(start)).unwrap_or_default();
        let data: Vec<Value> = window.iter().take(self.limit).cloned().collect();
        let id_of = |item: Option<&Value>| item.map_or(Value::Null, |i| i["id"].clone());
        Ok(json!({"object": "list", "first_id": id_of(data.first()),
            "last_id": id_of(data.last()), "has_more": window.len() > data.len(), "data": data}))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn page(query: &[(&str, &str)]) -> Result<Page, ApiError> {
        Page::of(
            &query
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    fn ids(list: &Value) -> Vec<&str> {
        list["data"]
            .as_array()
            .map(|d| d.iter().filter_map(|i| i["id"].as_str()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn pages_follow_order_limit_and_cursors() {
        let items: Vec<Value> = (0..5).map(|i| json!({"id": format!("i{i}")})).collect();
        let list = |q: &[(&str, &str)]| {
            page(q)
                .expect("a page")
                .list(items.clone())
                .expect("a list")
        };
        let all = list(&[]);
        assert_eq!(ids(&all), ["i4", "i3", "i2", "i1", "i0"]);
        assert_eq!(
            (&all["first_id"], &all["last_id"], &all["has_more"]),
            (&json!("i4"), &json!("i0"), &json!(false))
        );
        let first = list(&[("order", "asc"), ("limit", "2")]);
        assert_eq!(
            (ids(&first), &first["has_more"]),
            (vec!["i0", "i1"], &json!(true))
        );
        let next = list(&[("order", "asc"), ("limit", "2"), ("after", "i1")]);
        assert_eq!(ids(&next), ["i2", "i3"]);
        assert_eq!(ids(&list(&[("before", "i2")])), ["i4", "i3"]);
        assert_eq!(ids(&list(&[("after", "i0")])), Vec::<&str>::new());
        for bad in [[("order", "up")], [("limit", "0")], [("limit", "101")]] {
            assert!(page(&bad).is_err(), "{bad:?}");
        }
        let e = page(&[("after", "nope")])
            .expect("a page")
            .list(items.clone())
            .expect_err("an unknown cursor");
        assert_eq!(e.param, Some("after"));
    }
}
