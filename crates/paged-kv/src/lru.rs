//! An intrusive doubly linked list over block indices `0..n`, used as the LRU
//! order of cached-evictable blocks: push at the back when a block's last
//! reference goes, pop the front to evict, unlink from the middle when a
//! prefix hit revives a block. Every operation is O(1); memory is two `u32`
//! links per block, allocated once.

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub(crate) struct LruList {
    prev: Vec<u32>,    // [n]
    next: Vec<u32>,    // [n]
    linked: Vec<bool>, // [n]
    head: u32,
    tail: u32,
    len: usize,
}

impl LruList {
    /// An empty list over indices `0..n` (`n` < `u32::MAX`).
    pub(crate) fn new(n: usize) -> Self {
        Self {
            prev: vec![NIL; n],
            next: vec![NIL; n],
            linked: vec![false; n],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn contains(&self, i: u32) -> bool {
        self.linked.get(i as usize).copied().unwrap_or(false)
    }

    /// Appends `i` as the most recently used entry; no-op if already linked.
    pub(crate) fn push_back(&mut self, i: u32) {
        if self.contains(i) {
            return;
        }
        let k = i as usize;
        self.prev[k] = self.tail;
        self.next[k] = NIL;
        if self.tail == NIL {
            self.head = i;
        } else {
            self.next[self.tail as usize] = i;
        }
        self.tail = i;
        self.linked[k] = true;
        self.len += 1;
    }

    /// Unlinks `i`; returns whether it was linked.
    pub(crate) fn remove(&mut self, i: u32) -> bool {
        if !self.contains(i) {
            return false;
        }
        let k = i as usize;
        let (p, n) = (self.prev[k], self.next[k]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[k] = NIL;
        self.next[k] = NIL;
        self.linked[k] = false;
        self.len -= 1;
        true
    }

    /// Removes and returns the least recently used entry.
    pub(crate) fn pop_front(&mut self) -> Option<u32> {
        let h = self.head;
        if h == NIL {
            return None;
        }
        self.remove(h);
        Some(h)
    }

    /// Entries from least to most recently used (O(len); for checks).
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors((self.head != NIL).then_some(self.head), |&i| {
            let n = self.next[i as usize];
            (n != NIL).then_some(n)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_unlinking() {
        let mut l = LruList::new(5);
        for i in [3, 1, 4, 0] {
            l.push_back(i);
        }
        l.push_back(1); // already linked: keeps its place
        assert_eq!(l.iter().collect::<Vec<_>>(), [3, 1, 4, 0]);
        assert!(l.remove(4));
        assert!(!l.remove(4));
        assert!(!l.remove(2));
        assert_eq!(l.pop_front(), Some(3));
        assert!(l.remove(0));
        assert_eq!(l.iter().collect::<Vec<_>>(), [1]);
        assert_eq!(l.len(), 1);
        assert_eq!(l.pop_front(), Some(1));
        assert_eq!(l.pop_front(), None);
        assert_eq!(l.len(), 0);
        l.push_back(2);
        assert_eq!(l.iter().collect::<Vec<_>>(), [2]);
    }
}
