//! Flow-sensitive name state: bitsets of the names defined on every path
//! so far, and of those defined on some path only.

/// A set of interned names.
#[derive(Debug, Clone, Default)]
pub(super) struct Names(Vec<u64>);

impl Names {
    pub(super) fn has(&self, i: u32) -> bool {
        self.0.get(i as usize / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    pub(super) fn set(&mut self, i: u32) {
        let w = i as usize / 64;
        if self.0.len() <= w {
            self.0.resize(w + 1, 0);
        }
        self.0[w] |= 1 << (i % 64);
    }

    pub(super) fn unset(&mut self, i: u32) {
        if let Some(w) = self.0.get_mut(i as usize / 64) {
            *w &= !(1 << (i % 64));
        }
    }

    /// `self |= other`.
    pub(super) fn add(&mut self, other: &Names) {
        if self.0.len() < other.0.len() {
            self.0.resize(other.0.len(), 0);
        }
        self.0.iter_mut().zip(&other.0).for_each(|(a, b)| *a |= b);
    }

    /// `self &= other`.
    pub(super) fn keep(&mut self, other: &Names) {
        for (i, a) in self.0.iter_mut().enumerate() {
            *a &= other.0.get(i).copied().unwrap_or(0);
        }
    }

    /// `self &= !other`.
    pub(super) fn remove(&mut self, other: &Names) {
        self.0.iter_mut().zip(&other.0).for_each(|(a, b)| *a &= !b);
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().enumerate().flat_map(|(w, bits)| (0..64).filter(move |b| bits & (1 << b) != 0).map(move |b| (w * 64 + b) as u32))
    }
}

/// Names definitely and possibly defined at a point of the program.
/// Bitsets over interned names: branches clone them, so they must be cheap.
#[derive(Debug, Clone, Default)]
pub(super) struct Flow {
    pub(super) definite: Names,
    pub(super) maybe: Names,
}

impl Flow {
    pub(super) fn define(&mut self, name: u32) {
        self.definite.set(name);
        self.maybe.unset(name);
    }

    pub(super) fn forget(&mut self, name: u32) {
        self.definite.unset(name);
        self.maybe.unset(name);
    }

    /// The flow after exactly one of `branches` ran.
    pub(super) fn join(branches: Vec<Flow>) -> Flow {
        let mut it = branches.into_iter();
        let Some(first) = it.next() else { return Flow::default() };
        let mut definite = first.definite.clone();
        let mut maybe = first.maybe;
        maybe.add(&first.definite);
        for f in it {
            definite.keep(&f.definite);
            maybe.add(&f.maybe);
            maybe.add(&f.definite);
        }
        maybe.remove(&definite);
        Flow { definite, maybe }
    }
}

