//! What both request-path ports (HTTP and Envoy's gRPC RLS) share at their edge: accepting
//! connections ([`listener`]) within bounds per port and per peer ([`slots`], [`peer`]), TLS and mutual TLS ([`tls`]) and checking the
//! caller's bearer token ([`auth`]); the errors that stop a port ([`listener::PortError`]) or a
//! watcher of its files ([`watch::WatchError`]).

pub mod auth;
pub mod listener;
pub(crate) mod peer;
pub(crate) mod slots;
pub(crate) mod tls;
pub mod watch;
