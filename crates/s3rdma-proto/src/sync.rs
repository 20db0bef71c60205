//! One way to take a lock. A thread that panicked while holding a mutex does not poison it for
//! the rest of the process: a mount keeps serving its other files (the panic is logged where it
//! happened, and what the lock guards is kept consistent by each holder before it can panic).
//! Every crate takes its mutexes with [`Lock::locked`], not `lock().unwrap()`.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// [`Mutex::lock`], through a poisoning.
pub trait Lock<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Lock<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_while_locked_does_not_poison_the_lock() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let r = std::thread::spawn(move || {
            let _g = m2.locked();
            panic!("holder panics");
        })
        .join();
        assert!(r.is_err() && m.is_poisoned());
        *m.locked() += 1;
        assert_eq!(*m.locked(), 2);
    }
}
