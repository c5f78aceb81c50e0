//! Unit tests of the closure queue.
