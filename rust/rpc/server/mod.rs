//! What the worker and parameter servers share: binding and serving with the same
//! safety rule and transport settings ([`serve`]), the admission of connections that
//! bounds what an unauthenticated client can hold open ([`connections`]), and how long a
//! session's values live ([`sessions`]).

pub mod connections;
pub mod serve;
pub mod sessions;
