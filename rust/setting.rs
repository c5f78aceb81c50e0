//! Settings read once per process from an environment variable.
//!
//! A setting is read where it is first needed, inside a `OnceLock`. A value that cannot be
//! used is refused with a warning naming what was expected, and the default applies.
//!
//! **Why the warning waits.** Logging forwards to Python and takes the GIL
//! (`rust/py/log.rs`). Inside `OnceLock::get_or_init` that could deadlock: a thread that
//! holds the GIL and needs the same setting blocks on the lock, while the thread
//! initialising it waits for the GIL. So the complaint is kept with the value and logged
//! once, after the lock is released, by whichever caller finds it first ([`Setting::get`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// What reading a setting gave: the value to use and, for a refused value, what to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read<T> {
    /// The value in force: the variable's, or the default where it was unset or refused.
    pub value: T,
    /// Why the variable's value was refused (`None`: unset or used).
    pub refused: Option<String>,
}

impl<T> Read<T> {
    /// Reads `text` (the variable's value, if set) with `parse`; where `parse` refuses it,
    /// `default` applies and the complaint says what `expected` was.
    pub fn parse(
        name: &str,
        text: Option<&str>,
        parse: impl FnOnce(&str) -> Option<T>,
        expected: &str,
        default: impl FnOnce() -> T,
    ) -> Self {
        let Some(text) = text else {
            return Self {
                value: default(),
                refused: None,
            };
        };
        match parse(text.trim()) {
            Some(value) => Self {
                value,
                refused: None,
            },
            None => Self {
                value: default(),
                refused: Some(format!(
                    "{name}={text:?} is not {expected}; it is ignored and the default applies"
                )),
            },
        }
    }
}

/// A setting read once per process, whose refusal is logged once outside its lock.
#[derive(Debug)]
pub struct Setting<T> {
    read: OnceLock<Read<T>>,
    told: AtomicBool,
}

impl<T> Setting<T> {
    /// An unread setting, for a `static`.
    pub const fn new() -> Self {
        Self {
            read: OnceLock::new(),
            told: AtomicBool::new(false),
        }
    }

    /// The setting's value, read by `read` on first use. A refusal is logged once per
    /// process under `jaxcluster.settings`, after the lock is released.
    pub fn get(&self, read: impl FnOnce() -> Read<T>) -> &T {
        let (value, refused) = self.read_once(read);
        if let Some(refused) = refused {
            tracing::warn!(target: crate::log_target::SETTINGS, "{refused}");
        }
        value
    }

    /// The value, and the refusal for the one caller (per process) that is to tell it;
    /// returned, so that it is told with the lock released.
    fn read_once(&self, read: impl FnOnce() -> Read<T>) -> (&T, Option<&str>) {
        let got = self.read.get_or_init(read);
        let tell = got
            .refused
            .as_deref()
            .filter(|_| !self.told.swap(true, Ordering::AcqRel));
        (&got.value, tell)
    }
}

impl<T> Default for Setting<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(text: &str) -> Option<u32> {
        text.parse().ok()
    }

    #[test]
    fn an_unset_or_good_value_is_used_and_a_bad_one_is_refused_naming_what_was_expected() {
        let unset = Read::parse("X", None, whole, "a whole number", || 7);
        assert_eq!((unset.value, unset.refused), (7, None));
        let good = Read::parse("X", Some(" 3 "), whole, "a whole number", || 7);
        assert_eq!((good.value, good.refused), (3, None));
        let bad = Read::parse("X", Some("three"), whole, "a whole number", || 7);
        assert_eq!(bad.value, 7);
        let said = bad.refused.unwrap();
        assert!(
            said.contains("X=\"three\"") && said.contains("a whole number"),
            "{said}"
        );
    }

    #[test]
    fn a_refusal_is_told_once_however_many_threads_read_the_setting() {
        static SETTING: Setting<u32> = Setting::new();
        let threads: Vec<_> = (0..16)
            .map(|_| {
                std::thread::spawn(|| {
                    let (value, tell) = SETTING
                        .read_once(|| Read::parse("X", Some("-1"), whole, "a whole number", || 5));
                    (*value, tell.is_some())
                })
            })
            .collect();
        let mut told = 0;
        for thread in threads {
            let (value, tell) = thread.join().unwrap();
            assert_eq!(value, 5);
            told += usize::from(tell);
        }
        assert_eq!(told, 1);
    }

    #[test]
    fn the_refusal_is_told_outside_the_lock_so_the_teller_may_read_the_setting_again() {
        static SETTING: Setting<u32> = Setting::new();
        // A warning that reads the setting (as a logger taking the GIL might make another
        // thread do) would deadlock if it were told inside `get_or_init`.
        let (value, tell) =
            SETTING.read_once(|| Read::parse("X", Some("x"), whole, "a whole number", || 9));
        assert!(tell.is_some());
        assert_eq!(*SETTING.get(|| unreachable!()), 9);
        assert_eq!(*value, 9);
    }
}
