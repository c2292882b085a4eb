//! What both request-path ports (HTTP and Envoy's gRPC RLS) share at their edge: accepting
//! connections within bounds ([`listener`]) and checking the caller's bearer token ([`auth`]).

pub mod auth;
pub(crate) mod listener;
