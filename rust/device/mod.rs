//! TF device names (placeholder; filled by the device work).
