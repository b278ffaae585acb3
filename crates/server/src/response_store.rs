//! The in-memory store of Responses API responses (`store: true`, the
//! default): what `previous_response_id` continues from and what
//! `GET` / `DELETE /v1/responses/{id}` read.
//!
//! Contract: an entry is the response object and the conversation up to and
//! including its output (the items a continuation prepends), kept as JSON
//! text: what is counted is what is held (the text, its id and a fixed
//! per-entry overhead), and deleting an entry frees a few large blocks,
//! not a tree of small ones. Each entry belongs to the API key that made it
//! ([`Owner`]): another key's `get` and `delete` find nothing, exactly as for
//! an id never stored. Bounded in bytes (`--responses-store-mib`) and in age
//! (`--responses-store-ttl-secs`): inserting past the byte cap evicts the
//! oldest entries first; an entry older than the TTL is gone (dropped when
//! met, and from the front of the age order on each insert). An entry larger
//! than the whole cap is not kept, and the caller is told (`insert` returns
//! false). Nothing outlives the process.
//!
//! Costs: insert O(entry size) plus O(evicted); get O(entry size) to parse
//! the text back; delete O(1); map operations under one mutex (never held
//! across an await).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Default byte cap (`--responses-store-mib`).
pub const DEFAULT_STORE_BYTES: usize = 256 << 20;
/// Default age limit (`--responses-store-ttl-secs`).
pub const DEFAULT_STORE_TTL: Duration = Duration::from_secs(3600);
/// What an entry costs beyond its text: the map slot, the age-order slot
/// and the entry's own fields, rounded up.
const ENTRY_OVERHEAD: usize = 160;

/// Who made a stored response: the position of its API key among the
/// server's keys, plus one; 0 when the server has no keys (everything then
/// belongs to the one anonymous owner). The key itself is never kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Owner(pub u32);

/// One stored response.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The response object as `GET /v1/responses/{id}` returns it.
    pub response: Value,
    /// The conversation's items, its output last (Responses API wire items).
    pub history: Vec<Value>,
}

struct Entry {
    owner: Owner,
    /// `Stored::response` as JSON text.
    response: Box<str>,
    /// `Stored::history` as a JSON array.
    history: Box<str>,
    bytes: usize,
    at: Instant,
}

impl Entry {
    fn stored(&self) -> Option<Stored> {
        Some(Stored {
            response: serde_json::from_str(&self.response).ok()?,
            history: serde_json::from_str(&self.history).ok()?,
        })
    }
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

impl ResponseStore {
    pub fn new(cap_bytes: usize, ttl: Duration) -> Self {
        ResponseStore {
            cap_bytes,
            ttl,
            inner: Mutex::default(),
        }
    }

    /// Keeps `stored` under `id` for `owner`, evicting expired and then
    /// oldest entries to stay within the byte cap. Returns whether it was
    /// kept.
    pub fn insert(&self, id: String, owner: Owner, stored: Stored) -> bool {
        let response: Box<str> = stored.response.to_string().into();
        let history: Box<str> = Value::Array(stored.history).to_string().into();
        let bytes = response.len() + history.len() + 2 * id.len() + ENTRY_OVERHEAD;
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
        let entry = Entry {
            owner,
            response,
            history,
            bytes,
            at: now,
        };
        if let Some(old) = inner.map.insert(id.clone(), entry) {
            inner.bytes -= old.bytes;
        }
        inner.bytes += bytes;
        inner.order.push_back(id);
        true
    }

    /// The entry under `id` made by `owner`, unless absent or expired.
    pub fn get(&self, id: &str, owner: Owner) -> Option<Stored> {
        let mut g = self.inner.lock().ok()?;
        let e = g.map.get(id).filter(|e| e.owner == owner)?;
        if e.at.elapsed() > self.ttl {
            if let Some(e) = g.map.remove(id) {
                g.bytes -= e.bytes;
            }
            return None;
        }
        e.stored()
    }

    /// Removes `id` if `owner` made it; whether it was there (and not
    /// expired).
    pub fn delete(&self, id: &str, owner: Owner) -> bool {
        let Ok(mut g) = self.inner.lock() else {
            return false;
        };
        if !g.map.get(id).is_some_and(|e| e.owner == owner) {
            return false;
        }
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

    const ME: Owner = Owner(1);

    fn stored(text: &str) -> Stored {
        Stored {
            response: json!({"id": text}),
            history: vec![json!({"type": "message", "content": text})],
        }
    }

    #[test]
    fn oldest_go_first_past_the_byte_cap() {
        let s = ResponseStore::new(usize::MAX, Duration::from_secs(60));
        assert!(s.insert("a".into(), ME, stored("aaaa")));
        let one = s.usage().1;
        let s = ResponseStore::new(one * 2, Duration::from_secs(60));
        assert!(s.insert("a".into(), ME, stored("aaaa")));
        assert!(s.insert("b".into(), ME, stored("bbbb")));
        assert!(s.get("a", ME).is_some());
        assert!(s.insert("c".into(), ME, stored("cccc")));
        assert!(s.get("a", ME).is_none(), "the oldest was evicted");
        assert!(s.get("b", ME).is_some() && s.get("c", ME).is_some());
        assert_eq!(s.usage(), (2, one * 2));
        // larger than the whole cap: not kept, nothing evicted
        assert!(!s.insert("big".into(), ME, stored(&"x".repeat(one * 3))));
        assert_eq!(s.usage().0, 2);
    }

    #[test]
    fn entries_expire_and_delete() {
        let s = ResponseStore::new(1 << 20, Duration::from_millis(30));
        assert!(s.insert("a".into(), ME, stored("a")));
        assert!(s.delete("a", ME));
        assert!(!s.delete("a", ME));
        assert!(s.insert("b".into(), ME, stored("b")));
        std::thread::sleep(Duration::from_millis(60));
        assert!(s.get("b", ME).is_none());
        assert!(s.insert("c".into(), ME, stored("c")));
        assert_eq!(s.usage().0, 1);
    }

    #[test]
    fn an_entry_is_its_owners_alone() {
        let s = ResponseStore::new(1 << 20, Duration::from_secs(60));
        assert!(s.insert("a".into(), ME, stored("mine")));
        let other = Owner(2);
        assert!(s.get("a", other).is_none());
        assert!(s.get("a", Owner::default()).is_none());
        assert!(!s.delete("a", other));
        assert_eq!(s.get("a", ME).unwrap().history, stored("mine").history);
        assert!(s.delete("a", ME));
    }

    /// Counts, per thread, the bytes allocated and not yet freed.
    mod counting {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        thread_local! {
            static NET: Cell<isize> = const { Cell::new(0) };
        }

        fn add(n: isize) {
            let _ = NET.try_with(|c| c.set(c.get() + n));
        }

        /// Bytes this thread holds now (since it started).
        pub fn net() -> isize {
            NET.with(Cell::get)
        }

        pub struct Counting;

        // SAFETY: every method forwards to `System` with the caller's
        // layout unchanged; counting touches only a thread-local cell.
        unsafe impl GlobalAlloc for Counting {
            /// # Safety
            /// As [`GlobalAlloc::alloc`]: the caller's contract is `System`'s.
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                add(layout.size() as isize);
                // SAFETY: the caller's layout contract is passed on unchanged.
                unsafe { System.alloc(layout) }
            }

            /// # Safety
            /// As [`GlobalAlloc::dealloc`]: the caller's contract is `System`'s.
            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                add(-(layout.size() as isize));
                // SAFETY: `ptr` came from `System` with this layout.
                unsafe { System.dealloc(ptr, layout) }
            }

            /// # Safety
            /// As [`GlobalAlloc::realloc`]: the caller's contract is `System`'s.
            unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
                add(new_size as isize - layout.size() as isize);
                // SAFETY: `ptr` came from `System` with `layout`; the caller
                // upholds `new_size`'s contract.
                unsafe { System.realloc(ptr, layout, new_size) }
            }
        }

        #[global_allocator]
        static COUNTING: Counting = Counting;
    }

    #[test]
    fn the_count_is_the_memory_held() {
        // many small items: as parsed values they take several times their
        // text; what the store holds must be what it counts
        let s = ResponseStore::new(1 << 30, Duration::from_secs(60));
        let before = counting::net();
        let history: Vec<Value> = (0..2000)
            .map(|i| json!({"type": "message", "role": "user", "content": i.to_string()}))
            .collect();
        let st = Stored {
            response: json!({"id": "a"}),
            history,
        };
        let built = counting::net() - before;
        assert!(s.insert("a".into(), ME, st));
        let held = (counting::net() - before) as usize;
        let (_, counted) = s.usage();
        assert!(
            held <= counted + 1024,
            "held {held} bytes, counted {counted} (the request's values took {built})"
        );
        // deleting frees it
        assert!(s.delete("a", ME));
        let left = (counting::net() - before) as usize;
        assert!(left <= 1024, "{left} bytes still held");
    }
}
