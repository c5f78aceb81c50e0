//! What the worker and parameter servers share: binding and serving with the same
//! safety rule and transport settings ([`serve`]), and the admission of connections that
//! bounds what an unauthenticated client can hold open ([`connections`]).

pub mod connections;
pub mod serve;
