//! The closure queue (placeholder; filled by the queue work).
