//! Places for the readers of one shared value, one each: a freed place is
//! reused before the vector grows, and both vectors are given back when
//! the last reader leaves (a subscription that once had many readers keeps
//! no memory for them).

/// The places; `S` is what a reader keeps in its place (its waker, what it
/// saw), `S::default()` an empty one.
pub(crate) struct Slots<S> {
    slots: Vec<S>,
    free: Vec<usize>,
}

impl<S: Default> Slots<S> {
    pub(crate) const fn new() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }

    /// A place for a new reader, holding `slot`.
    pub(crate) fn take(&mut self, slot: S) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                self.slots.len() - 1
            }
        }
    }

    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut S> {
        self.slots.get_mut(i)
    }

    /// Every place, taken or free.
    pub(crate) fn iter_mut(&mut self) -> std::slice::IterMut<'_, S> {
        self.slots.iter_mut()
    }

    /// Frees place `i`, which its reader must not use again, and returns
    /// what it held. The caller frees a place once.
    pub(crate) fn free(&mut self, i: usize) -> Option<S> {
        let held = std::mem::take(self.slots.get_mut(i)?);
        self.free.push(i);
        if self.free.len() == self.slots.len() {
            self.slots = Vec::new();
            self.free = Vec::new();
        }
        Some(held)
    }

    /// Places taken.
    pub(crate) fn taken(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether the vectors hold any memory.
    #[cfg(test)]
    pub(crate) fn holds_memory(&self) -> bool {
        self.slots.capacity() > 0 || self.free.capacity() > 0
    }
}

#[cfg(test)]
mod tests {
    use super::Slots;

    #[test]
    fn freed_places_are_reused_and_given_back_with_the_last() {
        let mut slots: Slots<u32> = Slots::new();
        let (a, b, c) = (slots.take(1), slots.take(2), slots.take(3));
        assert_eq!((a, b, c, slots.taken()), (0, 1, 2, 3));
        assert_eq!(slots.free(b), Some(2));
        assert_eq!(slots.get_mut(b), Some(&mut 0), "a freed place is emptied");
        assert_eq!(slots.take(4), b, "reused before the vector grows");
        assert_eq!(slots.iter_mut().map(|s| *s).collect::<Vec<_>>(), [1, 4, 3]);
        for i in [a, b, c] {
            assert!(slots.holds_memory());
            slots.free(i);
        }
        assert_eq!(slots.taken(), 0);
        assert!(!slots.holds_memory(), "given back with the last reader");
        assert_eq!(slots.free(0), None, "nothing to free");
        assert_eq!(slots.take(5), 0);
    }
}
