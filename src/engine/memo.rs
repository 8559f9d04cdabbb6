//! Bounded caches shared between threads that forget in two generations:
//! when the young table is full it becomes the old one (the previous old
//! one is dropped), and a hit in the old table moves the entry back. A
//! working set smaller than the bound never misses, and past it the recent
//! entries survive (a table that started over when full made every
//! Kubernetes schema rebuild the lexemes the one before had just made).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

/// A cache of at most twice `cap` entries.
#[derive(Debug)]
pub(crate) struct Memo<K, V> {
    cap: usize,
    tables: Mutex<(HashMap<K, V>, HashMap<K, V>)>,
}

impl<K: Hash + Eq, V: Clone> Memo<K, V> {
    /// An empty cache whose young generation holds `cap` entries.
    pub(crate) fn new(cap: usize) -> Memo<K, V> {
        Memo { cap, tables: Mutex::new((HashMap::new(), HashMap::new())) }
    }

    /// The entry of `key`, if kept.
    pub(crate) fn get(&self, key: &K) -> Option<V> {
        let mut t = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = t.0.get(key) {
            return Some(v.clone());
        }
        let (k, v) = t.1.remove_entry(key)?;
        Self::store(&mut t, self.cap, k, v.clone());
        Some(v)
    }

    /// Keeps `value` under `key`.
    pub(crate) fn insert(&self, key: K, value: V) {
        let mut t = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        Self::store(&mut t, self.cap, key, value);
    }

    /// The entry of `key`, made by `make` (outside the lock) and kept if missing.
    pub(crate) fn get_or(&self, key: K, make: impl FnOnce() -> V) -> V {
        if let Some(v) = self.get(&key) {
            return v;
        }
        let v = make();
        self.insert(key, v.clone());
        v
    }

    /// Number of entries kept.
    pub(crate) fn len(&self) -> usize {
        let t = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        t.0.len() + t.1.len()
    }

    fn store(t: &mut (HashMap<K, V>, HashMap<K, V>), cap: usize, key: K, value: V) {
        if t.0.len() >= cap {
            t.1 = std::mem::take(&mut t.0);
        }
        t.0.insert(key, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_entries_survive_and_the_bound_holds() {
        let m: Memo<u32, u32> = Memo::new(4);
        for i in 0..4 {
            m.insert(i, i * 10);
        }
        // Full: the fifth starts a new generation; the first four are old but kept.
        m.insert(4, 40);
        assert_eq!(m.get(&0), Some(0), "an old entry is found and moved back");
        assert_eq!(m.len(), 5);
        for i in 5..9 {
            m.insert(i, i * 10);
        }
        // Two generations later the entries not used since are gone; 0 was.
        assert_eq!(m.get(&1), None);
        assert!(m.len() <= 8);
        assert_eq!(m.get_or(1, || 11), 11);
        assert_eq!(m.get(&1), Some(11));
    }
}
