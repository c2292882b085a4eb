//! What both request-path ports (HTTP and Envoy's gRPC RLS) share at their edge: accepting
//! connections within bounds ([`listener`]), TLS and mutual TLS ([`tls`]) and checking the
//! caller's bearer token ([`auth`]).

pub mod auth;
pub(crate) mod listener;
pub(crate) mod tls;
