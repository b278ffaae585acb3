//! The in-memory store of Responses API responses (`store: true`, the
//! default): what `previous_response_id` continues from and what
//! `GET` / `DELETE /v1/responses/{id}` read.
//!
//! Contract: an entry is the response object and the conversation up to and
//! including its output (the items a continuation prepends). Bounded in
//! bytes (the JSON size of both; `--responses-store-mib`) and in age
//! (`--responses-store-ttl-secs`): inserting past the byte cap evicts the
//! oldest entries first; an entry older than the TTL is gone (dropped when
//! met, and from the front of the age order on each insert). An entry larger
//! than the whole cap is not kept. Nothing outlives the process.
//!
//! Costs: insert O(entry size) plus O(evicted); get / delete O(1) map
//! operations under one mutex (never held across an await).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Default byte cap (`--responses-store-mib`).
pub const DEFAULT_STORE_BYTES: usize = 256 << 20;
/// Default age limit (`--responses-store-ttl-secs`).
pub const DEFAULT_STORE_TTL: Duration = Duration::from_secs(3600);

/// One stored response.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The response object as `GET /v1/responses/{id}` returns it.
    pub response: Value,
    /// The conversation's items, its output last (Responses API wire items).
    pub history: Vec<Value>,
}

struct Entry {
    stored: Stored,
    bytes: usize,
    at: Instant,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, Entry>,
    /// Ids in insertion order (ids deleted early are skipped when met).
    order: VecDeque<String>,
    bytes: usize,
}

/// The store (see the module doc).
pub struct ResponseStore {
    cap_bytes: usize,
    ttl: Duration,
    inner: Mutex<Inner>,
}

fn size(s: &Stored) -> usize {
    let items: usize = s.history.iter().map(|v| v.to_string().len()).sum();
    s.response.to_string().len() + items
}

impl ResponseStore {
    pub fn new(cap_bytes: usize, ttl: Duration) -> Self {
        ResponseStore {
            cap_bytes,
            ttl,
            inner: Mutex::default(),
        }
    }

    /// Keeps `stored` under `id`, evicting expired and then oldest entries
    /// to stay within the byte cap. Returns whether it was kept.
    pub fn insert(&self, id: String, stored: Stored) -> bool {
        let bytes = size(&stored);
        if bytes > self.cap_bytes {
            return false;
        }
        let Ok(mut g) = self.inner.lock() else {
            return false;
        };
        let now = Instant::now();
        let inner = &mut *g;
        while let Some(front) = inner.order.front() {
            let expired = inner
                .map
                .get(front)
                .is_none_or(|e| now.duration_since(e.at) > self.ttl);
            if !expired && inner.bytes + bytes <= self.cap_bytes {
                break;
            }
            if let Some(id) = inner.order.pop_front()
                && let Some(e) = inner.map.remove(&id)
            {
                inner.bytes -= e.bytes;
            }
        }
        if let Some(old) = inner.map.insert(
            id.clone(),
            Entry {
                stored,
                bytes,
                at: now,
            },
        ) {
            inner.bytes -= old.bytes;
        }
        inner.bytes += bytes;
        inner.order.push_back(id);
        true
    }

    /// The entry under `id`, unless absent or expired.
    pub fn get(&self, id: &str) -> Option<Stored> {
        let mut g = self.inner.lock().ok()?;
        let expired = g.map.get(id)?.at.elapsed() > self.ttl;
        if expired {
            if let Some(e) = g.map.remove(id) {
                g.bytes -= e.bytes;
            }
            return None;
        }
        g.map.get(id).map(|e| e.stored.clone())
    }

    /// Removes `id`; whether it was there (and not expired).
    pub fn delete(&self, id: &str) -> bool {
        let Ok(mut g) = self.inner.lock() else {
            return false;
        };
        match g.map.remove(id) {
            Some(e) => {
                g.bytes -= e.bytes;
                e.at.elapsed() <= self.ttl
            }
            None => false,
        }
    }

    /// Entries and bytes held now.
    pub fn usage(&self) -> (usize, usize) {
        self.inner
            .lock()
            .map(|g| (g.map.len(), g.bytes))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(text: &str) -> Stored {
        Stored {
            response: json!({"id": text}),
            history: vec![json!({"type": "message", "content": text})],
        }
    }

    #[test]
    fn oldest_go_first_past_the_byte_cap() {
        let one = size(&stored("aaaa"));
        let s = ResponseStore::new(one * 2, Duration::from_secs(60));
        assert!(s.insert("a".into(), stored("aaaa")));
        assert!(s.insert("b".into(), stored("bbbb")));
        assert!(s.get("a").is_some());
        assert!(s.insert("c".into(), stored("cccc")));
        assert!(s.get("a").is_none(), "the oldest was evicted");
        assert!(s.get("b").is_some() && s.get("c").is_some());
        assert_eq!(s.usage(), (2, one * 2));
        // larger than the whole cap: not kept, nothing evicted
        assert!(!s.insert("big".into(), stored(&"x".repeat(one * 3))));
        assert_eq!(s.usage().0, 2);
    }

    #[test]
    fn entries_expire_and_delete() {
        let s = ResponseStore::new(1 << 20, Duration::from_millis(30));
        assert!(s.insert("a".into(), stored("a")));
        assert!(s.delete("a"));
        assert!(!s.delete("a"));
        assert!(s.insert("b".into(), stored("b")));
        std::thread::sleep(Duration::from_millis(60));
        assert!(s.get("b").is_none());
        assert!(s.insert("c".into(), stored("c")));
        assert_eq!(s.usage().0, 1);
    }
}
