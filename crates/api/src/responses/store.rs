//! The responses `store: true` keeps, for `previous_response_id` and
//! `GET /v1/responses/{id}`: the newest first within a memory budget.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::types::Message;

/// How many bytes of stored conversations are kept (serialised), at most.
const STORE_BUDGET: usize = 64 << 20;

/// A stored response: the conversation it ends (without instructions, which a continuation
/// does not inherit) and the response object.
#[derive(Debug)]
pub(super) struct Stored {
    pub(super) history: Vec<Message>,
    pub(super) response: Value,
    bytes: usize,
}

/// Stored responses, oldest first, within [`STORE_BUDGET`].
#[derive(Debug, Default)]
pub struct Store {
    inner: Mutex<StoreInner>,
}

#[derive(Debug, Default)]
struct StoreInner {
    by_id: HashMap<String, Arc<Stored>>,
    order: VecDeque<String>,
    bytes: usize,
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, StoreInner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn get(&self, id: &str) -> Option<Arc<Stored>> {
        self.lock().by_id.get(id).cloned()
    }

    pub(super) fn put(&self, id: String, history: Vec<Message>, response: Value) {
        let bytes =
            serde_json::to_string(&history).map_or(0, |s| s.len()) + response.to_string().len();
        let mut s = self.lock();
        while s.bytes + bytes > STORE_BUDGET
            && let Some(old) = s.order.pop_front()
        {
            if let Some(o) = s.by_id.remove(&old) {
                s.bytes -= o.bytes;
            }
        }
        if bytes > STORE_BUDGET {
            return;
        }
        s.bytes += bytes;
        s.order.push_back(id.clone());
        s.by_id.insert(
            id,
            Arc::new(Stored {
                history,
                response,
                bytes,
            }),
        );
    }

    pub(super) fn remove(&self, id: &str) -> bool {
        let mut s = self.lock();
        match s.by_id.remove(id) {
            Some(o) => {
                s.bytes -= o.bytes;
                s.order.retain(|k| k != id);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn the_store_keeps_the_newest_within_its_budget() {
        let s = Store::default();
        let big = "x".repeat(STORE_BUDGET / 3);
        for i in 0..4 {
            s.put(format!("r{i}"), Vec::new(), json!(big));
        }
        assert!(s.get("r0").is_none() && s.get("r1").is_none());
        assert!(s.get("r2").is_some() && s.get("r3").is_some());
        assert!(s.remove("r3") && !s.remove("r3"));
        assert!(s.lock().bytes <= STORE_BUDGET);
    }
}
