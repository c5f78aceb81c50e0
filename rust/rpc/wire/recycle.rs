//! Large message buffers kept for the next message instead of returned to the system.
//!
//! Why: a 64 MiB `ApplyUpdate` (issue 27) assembled its chunks into fresh memory on every
//! call, and the caller copied each gradient into fresh memory too. glibc maps any
//! allocation above its mmap threshold (32 MiB at most, however `jaxcluster._malloc` tunes
//! it) and unmaps it when freed, so the kernel faulted in and zeroed every page of it each
//! time: a third of the ps's CPU and more of the caller's (page faults, `clear_page`,
//! unmapping) in a profile, more than the update's arithmetic.
//! A buffer from [`take`] is handed out as [`Bytes`] by [`freeze`]; once the last slice of
//! it is dropped it goes back to a small pool, pages still mapped, for the next message of
//! a similar size.
//!
//! The pool is bounded ([`MAX_KEPT`] buffers, [`MAX_KEPT_BYTES`] in all) and only keeps
//! buffers of at least [`MIN_RECYCLED_BYTES`]: a process that stops sending large messages
//! holds at most that much memory it does not use.

use std::sync::{Mutex, PoisonError};

use bytes::Bytes;

/// Buffers smaller than this come from and go back to the allocator as usual (it reuses
/// them without mapping new pages).
pub const MIN_RECYCLED_BYTES: usize = 1 << 20;

/// Most buffers the pool keeps.
pub const MAX_KEPT: usize = 2;

/// Most bytes (capacity) the pool keeps in all; a larger buffer is freed.
pub const MAX_KEPT_BYTES: usize = 256 << 20;

/// A bounded set of kept buffers; the process has one ([`take`], [`give`], [`freeze`]).
pub struct Pool(Mutex<Vec<Vec<u8>>>);

static POOL: Pool = Pool::new();

impl Pool {
    const fn new() -> Self {
        Self(Mutex::new(Vec::new()))
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An empty buffer with room for at least `capacity` bytes: the smallest kept one
    /// that is large enough and at most twice that (a small message kept alive must not
    /// pin a large buffer), else a new one.
    pub fn take(&self, capacity: usize) -> Vec<u8> {
        if capacity >= MIN_RECYCLED_BYTES {
            let mut kept = self.kept();
            let best = kept
                .iter()
                .enumerate()
                .filter(|(_, b)| (capacity..=capacity.saturating_mul(2)).contains(&b.capacity()))
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i);
            if let Some(i) = best {
                return kept.swap_remove(i);
            }
        }
        Vec::with_capacity(capacity)
    }

    /// Gives `buffer` back: kept if it is large enough and the pool has room (the
    /// largest buffers are kept when it has not), else freed.
    pub fn give(&self, mut buffer: Vec<u8>) {
        if !(MIN_RECYCLED_BYTES..=MAX_KEPT_BYTES).contains(&buffer.capacity()) {
            return;
        }
        buffer.clear();
        let mut kept = self.kept();
        kept.push(buffer);
        kept.sort_by_key(|b| std::cmp::Reverse(b.capacity()));
        let mut total = 0;
        let fits = kept
            .iter()
            .take_while(|b| {
                total += b.capacity();
                total <= MAX_KEPT_BYTES
            })
            .count()
            .min(MAX_KEPT);
        let dropped = kept.split_off(fits);
        drop(kept);
        drop(dropped); // freed outside the lock
    }

    /// `buffer` as [`Bytes`] (no copy) that give it back to this pool once all are
    /// dropped.
    pub fn freeze(&'static self, buffer: Vec<u8>) -> Bytes {
        if buffer.capacity() < MIN_RECYCLED_BYTES {
            return Bytes::from(buffer);
        }
        Bytes::from_owner(Recycled(buffer, self))
    }
}

/// [`Pool::take`] from the process's pool.
pub fn take(capacity: usize) -> Vec<u8> {
    POOL.take(capacity)
}

/// [`Pool::give`] to the process's pool.
pub fn give(buffer: Vec<u8>) {
    POOL.give(buffer);
}

/// [`Pool::freeze`] into the process's pool.
pub fn freeze(buffer: Vec<u8>) -> Bytes {
    POOL.freeze(buffer)
}

/// A buffer that goes back to its pool when the last [`Bytes`] slice of it is dropped.
struct Recycled(Vec<u8>, &'static Pool);

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        self.1.give(std::mem::take(&mut self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static TESTED: Pool = Pool::new();

    #[test]
    fn large_buffers_come_back_and_the_pool_stays_bounded() {
        let (take, give) = (|n| TESTED.take(n), |b| TESTED.give(b));
        let small = take(16);
        assert!(small.capacity() >= 16);
        let mut buffer = take(3 << 20);
        buffer.extend_from_slice(&[7; 100]);
        let address = buffer.as_ptr() as usize;
        let bytes = TESTED.freeze(buffer);
        let slice = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(slice.as_ref(), [7; 10]);
        drop(slice);
        // Returned once the last slice went: the same memory, empty.
        let again = take(3 << 20);
        assert!(again.is_empty());
        assert_eq!(again.as_ptr() as usize, address);
        give(again);
        // A kept buffer over twice the size asked for is not handed out.
        let fresh = take(MIN_RECYCLED_BYTES);
        assert_ne!(fresh.as_ptr() as usize, address);
        drop(fresh);
        for _ in 0..=MAX_KEPT {
            give(Vec::with_capacity(MIN_RECYCLED_BYTES));
        }
        give(Vec::with_capacity(MAX_KEPT_BYTES + 1));
        let kept = TESTED.kept();
        assert!(kept.len() <= MAX_KEPT);
        assert!(kept.iter().map(Vec::capacity).sum::<usize>() <= MAX_KEPT_BYTES);
        // The largest are kept.
        assert!(kept.iter().any(|b| b.capacity() >= 3 << 20));
    }
}
