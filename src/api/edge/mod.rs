//! What both request-path ports (HTTP and Envoy's gRPC RLS) share at their edge: accepting
//! connections ([`listener`]) within bounds per port and per peer ([`slots`], [`peer`]), TLS and mutual TLS ([`tls`]) and checking the
//! caller's bearer token ([`auth`]).

pub mod auth;
pub(crate) mod listener;
pub(crate) mod peer;
pub(crate) mod slots;
pub(crate) mod tls;
