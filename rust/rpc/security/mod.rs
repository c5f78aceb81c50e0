//! Who may talk to whom: the bearer token (the server's check and the client's header,
//! [`auth`]) and optional TLS (the server's certificate and the client's CA, [`tls`]).
//! Both halves of each live together so that what one side sends and the other checks
//! are spelled once.

pub mod auth;
pub mod tls;
