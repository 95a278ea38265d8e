//! The one way larch takes a `std::sync` lock, and its policy for poisoned locks.
//!
//! Policy: a poisoned lock (another thread panicked while holding it) panics again here. The
//! state behind larch's locks is positions, pending rows, the live table of a memory target,
//! exporter status: after a panic half-way through an update it may be half-changed, and
//! carrying on could acknowledge a position whose rows are not there (C3) or serve a table
//! that is neither the old nor the new one (C2). The process stops instead; its supervisor
//! (Kubernetes, the operator) restarts it from durable state. Async locks (`tokio::sync`) do
//! not poison and are not covered here.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

const POISONED: &str = "a lock was poisoned: another thread panicked while holding it";

/// `lock()` under the poisoned-lock policy above.
pub trait MutexExt<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> MutexExt<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().expect(POISONED)
    }
}

/// `read()` and `write()` under the poisoned-lock policy above.
pub trait RwLockExt<T: ?Sized> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLockExt<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().expect(POISONED)
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().expect(POISONED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_poisoned_lock_panics_with_the_policy_message() {
        let m = Arc::new(Mutex::new(0));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.locked();
            panic!("while holding the lock");
        })
        .join();
        let err = std::panic::catch_unwind(|| *m.locked()).unwrap_err();
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("poisoned"), "{msg}");
        // An unpoisoned lock works as usual.
        let rw = RwLock::new(1);
        *rw.write_locked() += 1;
        assert_eq!(*rw.read_locked(), 2);
    }
}
